"""The sample inspector's pure functions: filtering, the LBES funnel (on the real filters'
output) and the word diff, whose Markdown must render nothing a model wrote."""

from __future__ import annotations

import numpy as np
import pytest

from app import inspector as ins
from engine.config import LbesConfig
from engine.lbes import FILTER_STAGES, filter_rewards, filter_stage, reference_tiebreak
from engine.sink import SampleRecord
from tests.app.test_inert import EVIL, MORE, PARSER, assert_inert


def sample(**fields) -> SampleRecord:
    values = {
        "split": "train",
        "prompt_index": 0,
        "sample_index": 0,
        "prompt": "Say hi",
        "completion": "hi",
        "reward": 0.5,
    }
    return SampleRecord(**(values | fields))


ES_SAMPLES = [
    sample(member=None, completion="base says hi", reward=0.1),
    sample(member=3, completion="Member Three shouts HELLO", reward=0.9),
    sample(member=1, completion="member one whispers", reward=0.4, prompt="Say bye"),
]


def test_the_member_filter_tells_base_from_members():
    assert ins.members(ES_SAMPLES) == ["base", "1", "3"]
    base = ins.filter_samples(ES_SAMPLES, ins.SampleFilter(member=ins.BASE))
    assert [s.completion for s in base] == ["base says hi"]
    three = ins.filter_samples(ES_SAMPLES, ins.SampleFilter(member="3"))
    assert [s.member for s in three] == [3]


def test_the_text_search_reads_prompt_and_completion_case_blind():
    by_completion = ins.filter_samples(ES_SAMPLES, ins.SampleFilter(text="  hello "))
    assert [s.member for s in by_completion] == [3]
    by_prompt = ins.filter_samples(ES_SAMPLES, ins.SampleFilter(text="BYE"))
    assert [s.member for s in by_prompt] == [1]


def test_the_reward_range_is_inclusive_and_drops_samples_without_reward():
    rows = [*ES_SAMPLES, sample(reward=None)]
    kept = ins.filter_samples(rows, ins.SampleFilter(reward=(0.4, 0.9)))
    assert [s.reward for s in kept] == [0.9, 0.4]
    assert len(ins.filter_samples(rows, ins.SampleFilter())) == 4


def lbes_samples(cfg: LbesConfig, rewards: np.ndarray) -> list[SampleRecord]:
    """A step's base samples, kept or dropped by the real LBES filters."""
    result = filter_rewards(rewards, cfg, reference_tiebreak(0, 0))
    return [
        sample(
            prompt_index=b,
            sample_index=j,
            reward=float(rewards[b, j]),
            kept=bool(result.kept[b, j]),
            dropped_by=result.dropped_by[b, j],
        )
        for b in range(rewards.shape[0])
        for j in range(rewards.shape[1])
    ]


EVERY_FILTER = LbesConfig(
    top_k_prompt_reward_var=3,
    top_k_rewards=2,
    bottom_k_rewards=1,
    exclude_same_rewards_samples=True,
    flat_top_k_rewards=2,
)
REWARDS = np.array(
    [
        [0.0, 0.0, 0.0, 0.0],  # no variance: the prompt-variance filter drops it
        [0.0, 1.0, 0.5, 0.2],  # keeps 0.0, 1.0, 0.5 (top 2, bottom 1), drops 0.2
        [1.0, 1.0, 1.0, 0.0],  # keeps 0.0 and two 1.0s (stable ties), drops a 1.0
        [0.3, 0.3, 0.3, 0.9],  # keeps 0.9, 0.3, 0.3: not all the same
    ]
)


def test_the_funnel_counts_each_filter_in_the_order_they_ran():
    samples = lbes_samples(EVERY_FILTER, REWARDS)
    stages = ins.funnel(samples, EVERY_FILTER.__dict__)
    assert [(s.label, s.remaining, s.dropped) for s in stages] == [
        ("generated", 16, 0),
        ("prompt-variance filter", 12, 4),
        ("top/bottom-k", 9, 3),
        ("same-reward prompts", 9, 0),  # configured, dropped nothing: still shown
        ("batch top/bottom-k", 2, 7),
        ("kept", 2, 0),
    ]
    assert ins.outcomes(samples) == [
        "kept",
        "dropped",
        "top_k_prompt_reward_var",
        "top_k_rewards+bottom_k_rewards",
        "flat_top_k_rewards",
    ]


def test_the_funnel_shows_only_what_the_run_configured_or_what_dropped():
    cfg = LbesConfig(top_k_rewards=1)
    stages = ins.funnel(lbes_samples(cfg, REWARDS[1:3]), cfg.__dict__)
    assert [(s.label, s.remaining) for s in stages] == [
        ("generated", 8),
        ("top/bottom-k", 2),
        ("kept", 2),
    ]
    assert ins.funnel(ES_SAMPLES, cfg.__dict__) == []  # no filter judged ES samples


def test_every_name_a_filter_records_has_its_stage():
    names = {
        name
        for s in lbes_samples(EVERY_FILTER, REWARDS)
        + lbes_samples(LbesConfig(bottom_k_rewards=1, flat_bottom_k_rewards=1), REWARDS)
        for name in [s.dropped_by]
        if name
    }
    assert {filter_stage(n) for n in names} == {0, 1, 3}
    assert len(ins.STAGE_LABELS) == len(FILTER_STAGES)
    assert filter_stage("something_else") is None
    assert ins.stage_label("something_else") == "other filters (something_else)"


@pytest.mark.parametrize(
    ("wanted", "indices"),
    [
        ("kept", [(1, 1), (1, 2)]),
        ("dropped", [(0, 0), (0, 1), (0, 2), (1, 0)]),
        ("top_k_prompt_reward_var", [(0, 0), (0, 1), (0, 2)]),
        ("top_k_rewards", [(1, 0)]),
    ],
)
def test_the_outcome_filter_finds_kept_and_dropped_by_filter(wanted, indices):
    cfg = LbesConfig(top_k_prompt_reward_var=1, top_k_rewards=2)
    samples = lbes_samples(cfg, np.array([[0.2, 0.2, 0.2], [0.0, 1.0, 0.5]]))
    found = ins.filter_samples(samples, ins.SampleFilter(outcome=wanted))
    assert [(s.prompt_index, s.sample_index) for s in found] == indices


def test_a_verdict_names_the_filter_for_people():
    dropped = sample(kept=False, dropped_by="top_k_rewards+bottom_k_rewards")
    assert ins.verdict(dropped) == "dropped by top/bottom-k (top_k_rewards+bottom_k_rewards)"
    assert ins.verdict(sample(kept=True)) == "kept"
    assert ins.verdict(sample()) == ""


def test_the_word_diff_marks_what_changed():
    runs = ins.word_diff("The answer is 7 because\n3 plus 4", "The answer is 12 because\n3 plus 4")
    assert runs == [
        ("equal", ["The", "answer", "is"]),
        ("delete", ["7"]),
        ("insert", ["12"]),
        ("equal", ["because", "\n", "3", "plus", "4"]),
    ]
    markdown = ins.diff_markdown(runs)
    assert markdown == (
        "The answer is :red-background[~~7~~] :green-background[12] because  \n3 plus 4"
    )
    assert "<br />" in PARSER.render(markdown)  # the line break is kept


def test_the_word_diff_renders_nothing_a_model_wrote():
    old, new = f"safe words {EVIL}", f"{MORE} safe words"
    markdown = ins.diff_markdown(ins.word_diff(old, new))
    shown = assert_inert([markdown])
    for word in (*EVIL.split(), *MORE.split()):
        assert word in shown  # every word is there, as written
