from dataclasses import replace

import pytest

from engine.sink import PopulationRecord, SampleRecord, StepReport
from jobs.store.errors import InvalidTransitionError, RunNotFoundError
from jobs.store.status import RunStatus

CONFIG = {"method": "es", "population_size": 4, "noise_std": 0.001}


def make_run(store, **kw):
    return store.create_run(
        name=kw.pop("name", "r1"), method="es", config=CONFIG, total_steps=10, **kw
    )


def step_report(step, reward):
    return StepReport(
        step=step,
        metrics={"train/reward/mean": reward, "train/noise_std": 0.001},
        population=[
            PopulationRecord(member=m, seed=100 + m, fitness=reward + m, shaped_fitness=m - 1.5)
            for m in range(4)
        ],
        samples=[
            SampleRecord(
                split="train",
                prompt_index=0,
                sample_index=0,
                prompt="2+2?",
                completion="4",
                reward=reward,
                reward_parts={"format": 1.0},
            )
        ],
        wall_time=1000.0 + step,
    )


def test_a_run_with_metrics_population_samples_and_events_round_trips(store):
    run = make_run(store, tags=["baseline"], notes="first")
    assert run.status is RunStatus.QUEUED and len(run.uuid) == 36
    for step in (1, 2, 3):
        store.record_step(run.id, step_report(step, reward=-10.0 + step))
    store.add_event(run.id, "info", "started")
    store.add_checkpoint(run.id, 2, "/tmp/ckpt-2")

    assert store.get_run(run.uuid).step == 3
    assert store.get_run(run.uuid[:8]).id == run.id  # a uuid prefix finds it
    series = store.metric_series(run.id, "train/reward/mean")
    assert [(p.step, p.value, p.wall_time) for p in series] == [
        (1, -9.0, 1001.0),
        (2, -8.0, 1002.0),
        (3, -7.0, 1003.0),
    ]
    assert store.latest_metrics([run.id])[run.id]["train/reward/mean"] == -7.0
    assert store.metric_keys(run.id) == ["train/noise_std", "train/reward/mean"]
    pop = store.population(run.id, 2)
    assert [p["seed"] for p in pop] == [100, 101, 102, 103]
    assert pop[3]["fitness"] == -5.0 and pop[3]["shaped_fitness"] == 1.5
    (sample,) = store.samples(run.id, split="train", step=3)
    assert sample.completion == "4" and sample.reward_parts == {"format": 1.0}
    assert [e.message for e in store.events(run.id)] == ["started"]
    assert [c.step for c in store.checkpoints(run.id)] == [2]


def test_rewriting_a_step_replaces_it_and_truncate_forgets_later_steps(store):
    run = make_run(store)
    for step in (1, 2, 3):
        store.record_step(run.id, step_report(step, reward=float(step)))
    store.record_step(run.id, step_report(2, reward=20.0))  # a resumed attempt rewrites step 2
    assert [p.value for p in store.metric_series(run.id, "train/reward/mean")] == [1.0, 20.0, 3.0]
    assert store.latest_metrics([run.id])[run.id]["train/reward/mean"] == 3.0  # step 3 is newer

    store.truncate_after(run.id, 1)
    assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1]
    assert store.latest_metrics([run.id])[run.id]["train/reward/mean"] == 1.0
    assert store.population(run.id, 2) == []
    assert store.samples(run.id, split="train", step=3) == []
    assert store.get_run(run.id).step == 1


def test_status_transitions_refuse_to_leave_a_terminal_state(store):
    run = make_run(store)
    running = store.set_status(run.id, RunStatus.RUNNING)
    assert running.started_at is not None
    done = store.set_status(run.id, RunStatus.SUCCEEDED)
    assert done.finished_at is not None
    with pytest.raises(InvalidTransitionError, match="succeeded to running"):
        store.set_status(run.id, RunStatus.RUNNING)


def test_unknown_run_names_the_command_that_lists_runs(store):
    with pytest.raises(RunNotFoundError, match="eslab runs"):
        store.get_run(12345)


def test_run_list_is_newest_first_and_counts(store):
    for i in range(3):
        make_run(store, name=f"run-{i}")
    assert [r.name for r in store.list_runs()] == ["run-2", "run-1", "run-0"]
    assert store.count_runs() == 3
    assert [r.name for r in store.list_runs(limit=1, offset=1)] == ["run-1"]


def test_a_check_constraint_guards_the_status_column(store):
    from sqlalchemy.exc import IntegrityError

    run = make_run(store)
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE runs SET status = 'bogus' WHERE id = {run.id}")


def test_a_uuid_prefix_of_digits_alone_still_finds_its_run(store):
    """One uuid in 40 starts with eight decimal digits: such a prefix is tried as an id
    first, then as a uuid prefix."""
    from sqlalchemy import update

    from jobs.store.models import Run

    run = make_run(store)
    uuid = "47616683" + run.uuid[8:]
    with store.engine.begin() as connection:
        connection.execute(update(Run).where(Run.id == run.id).values(uuid=uuid))
    assert store.get_run("47616683").id == run.id
    assert store.get_run(str(run.id)).id == run.id
    with pytest.raises(RunNotFoundError, match="no run '99999999999999999999999'"):
        store.get_run("9" * 23)


def test_one_prompts_samples_and_the_steps_it_was_sampled_at(store):
    run = make_run(store)
    for step in (1, 2, 3):
        store.record_step(run.id, step_report(step, reward=float(step)))
    other = SampleRecord("train", 1, 0, "3+3?", "6", 1.0)
    store.record_step(run.id, StepReport(step=2, metrics={}, samples=[other]))
    assert store.sample_steps(run.id, "train", prompt="3+3?") == [2]
    assert store.sample_steps(run.id, "train", prompt="2+2?") == [1, 2, 3]
    assert store.sample_steps(run.id, "eval", prompt="2+2?") == []
    assert [s.completion for s in store.samples(run.id, split="train", step=2)] == ["4", "6"]
    assert store.samples(run.id, split="train", step=2, prompt="3+3?") == [other]


def test_a_step_is_found_recorded_by_its_own_wall_time(store):
    """What the database sink asks before it writes a step again after a lost answer."""
    run = make_run(store)
    report = step_report(1, reward=1.0)
    assert not store.step_recorded(run.id, report)
    store.record_step(run.id, report)
    assert store.step_recorded(run.id, report)
    assert not store.step_recorded(run.id, replace(report, wall_time=report.wall_time + 1))


def test_each_samples_reward_and_cost_of_the_members_round_trip(store):
    """Alignment runs record every sample's reward and cost per member; rows without them
    (a plain run, or written before migration 0003) give no sample rows."""
    run = make_run(store)
    scored = [
        PopulationRecord(
            member=m,
            seed=m,
            fitness=0.5 * m,
            shaped_fitness=0.0,
            reward=1.5,
            cost=-0.5,
            sample_rewards=[1.0, 2.0],
            sample_costs=[-0.5, None],  # a cost that was not finite
        )
        for m in range(2)
    ]
    plain = PopulationRecord(member=2, seed=2, fitness=0.0, shaped_fitness=0.0)
    store.record_step(run.id, StepReport(step=1, metrics={}, population=[*scored, plain]))
    store.record_step(run.id, step_report(2, reward=1.0))
    assert store.sample_scores(run.id, 1) == [
        {"member": m, "fitness": 0.5 * m, "reward": r, "cost": c}
        for m in range(2)
        for r, c in ((1.0, -0.5), (2.0, None))
    ]
    assert [p["member"] for p in store.population(run.id, 1)] == [0, 1, 2]
    assert store.sample_scores(run.id, 2) == []
