"""Best-of-n as the ensembles paper runs it (tlc4418/llm_optimization `src/bon/`): every seed's
and every ensemble rule's curve from one scoring, several UWO weights at once, per-seed reward
model folders, and pre-labelled gold generations.

The figures below are what the reference's own functions (`ensemble_rm.get_ensemble_score` and
`bon_sampling.unbiased_sampler`, run on these inputs outside this repository, each seed's rows
sorted by its proxy score as its `score_answers(sort=True)` leaves them) return.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import metrics as mk
from engine.best_of_n.evaluation import (
    ProxyMembers,
    evaluate_gold_generations,
    read_curves,
    source_members,
    spec_source,
    write_curves,
)
from engine.best_of_n.gold_generations import read_gold_generations
from engine.best_of_n.reward_models import parse_seeds, reward_model_folders
from engine.best_of_n.selections import best_of_n_selections
from engine.config import ConfigError
from engine.data.datasets import DatasetError
from engine.model_files import ModelError

# 3 seeds' proxy scores [prompts 2, N 5] and the gold scores of the same answers.
PROXY = {
    "seed1": [[0.3, -1.2, 2.5, 0.9, 1.7], [1.1, 0.4, -0.6, 2.2, 0.0]],
    "seed2": [[0.8, -0.5, 1.9, 1.4, 0.2], [0.7, 1.5, -1.0, 1.8, 0.9]],
    "seed3": [[-0.1, -0.9, 2.8, 0.5, 2.4], [1.6, 0.2, 0.3, 1.2, -0.4]],
}
GOLD = [[0.5, -1.0, 0.2, 1.3, 0.7], [-0.3, 0.9, 0.1, 0.6, 1.4]]
NS = [1, 2, 3, 5]

# The reference's (proxy_score, gold_score) at n = 1, 2, 3, 5.
REFERENCE = {
    "seed1": ([0.73, 1.505, 1.895, 2.35], [0.44, 0.535, 0.41, 0.4]),
    "seed2": ([0.77, 1.39, 1.63, 1.85], [0.44, 0.70, 0.665, 0.4]),
    "seed3": ([0.76, 1.505, 1.90, 2.2], [0.44, 0.385, 0.235, -0.05]),
    "mean": ([0.7533333333, 1.4, 1.7066666667, 2.0666666667], [0.44, 0.535, 0.41, 0.4]),
    "WCO": ([0.2, 0.815, 1.13, 1.55], [0.44, 0.535, 0.41, 0.4]),
    "UWO-0.5": ([0.6254444444, 1.2618888889, 1.5754444444, 1.9894444444], [0.44, 0.535, 0.41, 0.4]),
    "UWO-2.0": ([0.2417777778, 0.9088888889, 1.2887777778, 1.7577777778], [0.44, 0.535, 0.41, 0.4]),
    # `if weight` reads 0 as no weight: the default coefficient 1 applies
    "UWO-0.0": ([0.4975555556, 1.1341111111, 1.4648888889, 1.9122222222], None),
}
# The reference's ensembles keep the gold scores in seed 1's order; with them re-ordered by the
# ensemble's own sort (what ES Lab does), its functions give these gold figures instead.
GOLD_REORDERED = {"WCO": [0.44, 0.565, 0.47, 0.4], "UWO-2.0": [0.44, 0.555, 0.46, 0.4]}


def members() -> dict[str, np.ndarray]:
    return {name: np.array(scores) for name, scores in PROXY.items()}


def curve(points: list) -> tuple[list[float], list[float]]:
    return [p.proxy_score for p in points], [p.gold_score for p in points]


def flat(pair: tuple[list[float], list[float]]) -> list[float]:
    return [*pair[0], *pair[1]]


def test_one_scoring_gives_every_seed_and_rule_as_the_reference():
    curves = best_of_n_selections(members(), np.array(GOLD), NS, uwo_weights=[0.5, 2.0])
    ours = {
        "seed1": mk.bon_key("member", "seed1"),
        "seed2": mk.bon_key("member", "seed2"),
        "seed3": mk.bon_key("member", "seed3"),
        "mean": mk.bon_key("mean"),
        "WCO": mk.bon_key("min"),
        "UWO-0.5": mk.bon_key("uwo", 0.5),
        "UWO-2.0": mk.bon_key("uwo", 2.0),
    }
    assert list(curves) == list(ours.values())
    for reference_name, key in ours.items():
        proxy, gold = curve(curves[key])
        assert [p.n for p in curves[key]] == NS
        assert proxy == pytest.approx(REFERENCE[reference_name][0]), reference_name
        want_gold = GOLD_REORDERED.get(reference_name, REFERENCE[reference_name][1])
        assert gold == pytest.approx(want_gold), reference_name


def test_uwo_weight_zero_is_the_mean_where_the_reference_weighs_one():
    curves = best_of_n_selections(members(), np.array(GOLD), NS, uwo_weights=[0.0, 1.0])
    assert curve(curves["bon/uwo/0"]) == curve(curves["bon/mean"])
    assert curve(curves["bon/uwo/1"])[0] == pytest.approx(REFERENCE["UWO-0.0"][0])


def test_one_reward_model_gives_its_curve_alone():
    curves = best_of_n_selections({"seed2": np.array(PROXY["seed2"])}, np.array(GOLD), NS)
    assert list(curves) == ["bon/member/seed2"]
    assert flat(curve(curves["bon/member/seed2"])) == pytest.approx(flat(REFERENCE["seed2"]))


def test_curve_keys_are_defined_once():
    assert mk.bon_key("member", "seed1") == "bon/member/seed1"
    assert [mk.bon_key("mean"), mk.bon_key("min")] == ["bon/mean", "bon/min"]
    assert [mk.bon_key("uwo", w) for w in (0.5, 2, 1e-3)] == [
        "bon/uwo/0.5",
        "bon/uwo/2",
        "bon/uwo/0.001",
    ]
    with pytest.raises(KeyError, match="unknown best-of-n rule 'WCO'"):
        mk.bon_key("WCO")
    with pytest.raises(KeyError, match="needs"):
        mk.bon_key("uwo")
    with pytest.raises(KeyError, match="takes no"):
        mk.bon_key("mean", 0.5)


@pytest.mark.parametrize(
    ("weights", "count", "message"),
    [
        ([0.5], 1, "at least 2 reward models, got 1"),
        ([0.5, -0.1], 3, r"finite and >= 0, got \[-0.1\]"),
        ([0.5, float("nan")], 3, "finite"),
        ([0.5, 0.50], 3, "distinct"),
    ],
)
def test_bad_uwo_weights_are_refused_naming_the_option(weights, count, message):
    scores = dict(list(members().items())[:count])
    with pytest.raises(ConfigError, match=message) as caught:
        best_of_n_selections(scores, np.array(GOLD), NS, uwo_weights=weights)
    assert "--uwo-weights" in str(caught.value)


def rows(n: int = 3) -> list[dict]:
    return [
        {
            "instruction": "Name a colour.",
            "input": "",
            "answers": [f"colour {i}" for i in range(n)],
            "gold_scores": [float(i) for i in range(n)],
            "output": "ignored",
        },
        {
            "instruction": "Add the numbers.",
            "input": "2 and 3",
            "answers": [f"sum {i}" for i in range(n)],
            "gold_scores": [-float(i) for i in range(n)],
        },
    ]


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet"])
def test_gold_generations_are_read_in_the_references_layout(tmp_path, suffix):
    path = tmp_path / f"gens{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(rows()))
    elif suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows()) + "\n")
    else:
        pq.write_table(pa.Table.from_pylist(rows()), path)
    data = read_gold_generations(path)
    # the reference's RM text joins instruction and a non-empty input with a newline
    assert data.prompts == ["Name a colour.", "Add the numbers.\n2 and 3"]
    assert data.answers[1] == ["sum 0", "sum 1", "sum 2"]
    assert data.gold.tolist() == [[0.0, 1.0, 2.0], [0.0, -1.0, -2.0]]
    cut = read_gold_generations(path, samples=2)  # the reference's big_n: the first N
    assert cut.gold.shape == (2, 2) and cut.answers[0] == ["colour 0", "colour 1"]


@pytest.mark.parametrize(
    ("change", "samples", "message"),
    [
        (lambda r: r[1].pop("gold_scores"), None, r"row 2: 'gold_scores' must list one number"),
        (lambda r: r[0]["gold_scores"].pop(), None, r"row 1: 'gold_scores' .* \(3\), got 2"),
        (
            lambda r: [r[1][k].append(0.0) for k in ("answers", "gold_scores")],
            None,
            "row 2: 'answers' has 4 .* pass --samples",
        ),
        (lambda r: None, 4, "row 1: 'answers' has 3 answers, fewer than --samples 4"),
        (lambda r: r[0].update(instruction=""), None, "row 1: 'instruction' must be a non-empty"),
        (lambda r: r[1]["gold_scores"].__setitem__(0, "high"), None, "row 2: 'gold_scores' .*"),
        (lambda r: r[1]["answers"].__setitem__(0, 7), None, "row 2: 'answers' must be texts"),
    ],
)
def test_bad_gold_generations_name_the_file_row_and_field(tmp_path, change, samples, message):
    data = rows()
    change(data)
    path = tmp_path / "gens.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=message) as caught:
        read_gold_generations(path, samples)
    assert str(path) in str(caught.value)


def test_unreadable_gold_generation_files_are_named(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        read_gold_generations(tmp_path / "none.json")
    (tmp_path / "gens.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"gens.csv: expected a .parquet"):
        read_gold_generations(tmp_path / "gens.csv")
    (tmp_path / "gens.json").write_text('{"answers": []}')
    with pytest.raises(DatasetError, match="expected a JSON list of rows"):
        read_gold_generations(tmp_path / "gens.json")


def checkpoint(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_per_seed_reward_models_form_one_ensemble(tmp_path):
    for s in (1, 2, 3):
        checkpoint(tmp_path / f"rm_seed{s}")
    pattern = str(tmp_path / "rm_seed{seed}")
    folders = reward_model_folders(pattern, parse_seeds("1,2,3"))
    assert folders == {f"seed{s}": tmp_path / f"rm_seed{s}" for s in (1, 2, 3)}
    listed = reward_model_folders(f"{tmp_path / 'rm_seed1'}, {tmp_path / 'rm_seed3'}")
    assert list(listed) == ["rm_seed1", "rm_seed3"]


def test_bad_reward_model_folders_are_refused_before_any_loads(tmp_path):
    checkpoint(tmp_path / "rm_seed1")
    (tmp_path / "rm_seed2").mkdir()
    pattern = str(tmp_path / "rm_seed{seed}")
    with pytest.raises(ModelError, match=r"reward model seed2: .*rm_seed2 .*no config.json"):
        reward_model_folders(pattern, [1, 2])
    with pytest.raises(ModelError, match=r"reward model seed3: .*no such folder"):
        reward_model_folders(pattern, [1, 3])
    with pytest.raises(ModelError, match="placeholder: pass --seeds"):
        reward_model_folders(pattern)
    with pytest.raises(ModelError, match=r"--seeds needs a \{seed\} placeholder"):
        reward_model_folders(str(tmp_path / "rm_seed1"), [1])
    with pytest.raises(ModelError, match="two folders of one name"):
        reward_model_folders(f"{tmp_path / 'rm_seed1'},{tmp_path / 'rm_seed1'}")
    for bad in ("1,x", "1,1", ","):
        with pytest.raises(ModelError, match="--seeds must"):
            parse_seeds(bad)


def fake_members(calls: list) -> ProxyMembers:
    """Stands in for the reward models: each member's score is a fixed table (PROXY)."""

    def score(prompts, outputs, args):
        calls.append((prompts, [[c.text for c in cs] for cs in outputs], args))
        return members()

    return ProxyMembers(tuple(PROXY), score)


def test_gold_generations_are_scored_once_for_every_curve(tmp_path):
    path = tmp_path / "gens.json"
    data = [
        {"instruction": f"q{i}", "answers": [f"a{i}{j}" for j in range(5)], "gold_scores": g}
        for i, g in enumerate(GOLD)
    ]
    path.write_text(json.dumps(data))
    calls: list = []
    curves = evaluate_gold_generations(path, NS, fake_members(calls), uwo_weights=[0.5, 2.0])
    assert len(calls) == 1
    prompts, answers, args = calls[0]
    assert prompts == ["q0", "q1"] and answers[1][4] == "a14" and args == [{}, {}]
    assert curve(curves["bon/uwo/0.5"])[0] == pytest.approx(REFERENCE["UWO-0.5"][0])
    assert flat(curve(curves["bon/member/seed3"])) == pytest.approx(flat(REFERENCE["seed3"]))
    # the run's default weight (the configuration's uwo_weight) when none is asked for
    assert "bon/uwo/0.1" in evaluate_gold_generations(path, NS, fake_members([]))


def test_bad_weights_and_n_cost_no_scoring(tmp_path):
    path = tmp_path / "gens.json"
    path.write_text(json.dumps(rows()))
    calls: list = []
    with pytest.raises(ConfigError, match="--uwo-weights"):
        evaluate_gold_generations(path, [1], fake_members(calls), uwo_weights=[-1.0])
    with pytest.raises(ModelError, match=r"every n must be in 1\.\.N \(3"):
        evaluate_gold_generations(path, [1, 4], fake_members(calls))
    assert calls == []


def test_scorer_services_of_per_seed_models_form_one_ensemble():
    urls = "http://127.0.0.1:8001, http://127.0.0.1:8002"
    proxy = source_members(spec_source(urls))
    assert proxy.names == ("127.0.0.1_8001", "127.0.0.1_8002")
    with pytest.raises(ConfigError, match="names a reward twice"):
        spec_source("http://127.0.0.1:8001,http://127.0.0.1:8001")
    with pytest.raises(ConfigError, match="give the scorer's URL"):
        spec_source("scorer")


def test_curves_file_is_the_references_layout_for_one_and_keyed_for_several(tmp_path):
    curves = best_of_n_selections(members(), np.array(GOLD), NS, uwo_weights=[0.5])
    one = {"bon/member/seed1": curves["bon/member/seed1"]}
    single = write_curves(one, tmp_path / "one.json")
    first = json.loads(single.read_text())[0]
    assert [first["n"], first["proxy_score"], first["gold_score"]] == pytest.approx([1, 0.73, 0.44])
    assert list(read_curves(single)) == [""]
    several = read_curves(write_curves(curves, tmp_path / "all.json"))
    assert list(several) == list(curves)
    assert several["bon/uwo/0.5"][3]["proxy_score"] == pytest.approx(REFERENCE["UWO-0.5"][0][3])


def test_reward_model_folders_score_every_answer_with_each_model(tmp_path):
    """Two tiny random classifiers (real models): each member's scores are its model's own."""
    from scorer.folders import score_with_folders
    from scorer.models import ScoringModel
    from tests.integration.scorers import tiny_checkpoint

    folders = {f"seed{s}": tiny_checkpoint(tmp_path / f"rm{s}", 1, s, 0.5) for s in (1, 2)}
    prompts = ["how do i make a cake", "is the water safe"]
    answers = [["sorry", "make a cake"], ["the water is safe", "unsafe"]]
    scores = score_with_folders(folders, prompts, answers, log=lambda _: None)
    assert list(scores) == ["seed1", "seed2"]
    assert scores["seed1"].shape == (2, 2)
    assert not np.allclose(scores["seed1"], scores["seed2"])
    direct = ScoringModel(folders["seed2"]).score([prompts[1]], [answers[1][0]])
    # one answer alone against four padded in a batch: the CPU's sums may differ in the last
    # bits (5e-7 of 0.33 on an AVX2 EPYC), far less than another model's score differs
    own = pytest.approx(direct[0], rel=1e-4, abs=1e-6)
    assert scores["seed2"][1, 0] == own
    assert scores["seed1"][1, 0] != own


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--proxy-models", "m"], "give either RUN (sample answers) or --gold-gens FILE"),
        (["ckpt", "--gold-gens", "g.json", "--proxy", "x.y"], "either RUN"),
        (["ckpt"], "--gold is needed"),
        (["--gold-gens", "g.json", "--gold", "x.y", "--proxy", "x.y"], "leave out --gold"),
        (["--gold-gens", "g.json"], "--gold-gens needs a proxy"),
        (["--gold-gens", "g.json", "--proxy", "a.b", "--proxy-models", "m"], "not both"),
        (["--gold-gens", "g.json", "--proxy", "a.b", "--seeds", "1"], "--seeds goes with"),
        (["ckpt", "--gold", "a.b,c.d"], "--gold names one reward"),
        (["--gold-gens", "g.json", "--proxy", "a.b", "--uwo-weights", "0.5,x"], "floats"),
    ],
)
def test_cli_refuses_a_mixed_up_command_in_one_line(capsys, argv, message):
    from app.cli import main

    assert main(["bon", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_runs_the_papers_best_of_n_on_gold_generations(tmp_path, capsys):
    """`eslab bon --gold-gens FILE --proxy-models PATTERN --seeds --uwo-weights` on two tiny
    real reward models: every seed's, the mean, min and each weight's curve in one file."""
    from app.cli import main
    from tests.integration.scorers import tiny_checkpoint

    for s in (1, 2):
        tiny_checkpoint(tmp_path / f"rm_seed{s}", 1, s, 0.5)
    gens = tmp_path / "gold_labelled_gens.jsonl"
    words = ["sorry", "make a cake", "the water is safe", "unsafe", "help"]
    gens.write_text(
        "\n".join(
            json.dumps({"instruction": q, "input": "", "answers": words, "gold_scores": g})
            for q, g in zip(["how do i make a cake", "is the water safe"], GOLD, strict=True)
        )
    )
    argv = ["bon", "--gold-gens", str(gens), "--proxy-models", str(tmp_path / "rm_seed{seed}")]
    assert main([*argv, "--seeds", "1,2", "--uwo-weights", "0.5,2", "--n", "1,2,5"]) == 0
    curves = json.loads((tmp_path / "gold_labelled_gens.bon.json").read_text())
    assert list(curves) == [
        "bon/member/seed1",
        "bon/member/seed2",
        "bon/mean",
        "bon/min",
        "bon/uwo/0.5",
        "bon/uwo/2",
    ]
    for points in curves.values():
        assert [p["n"] for p in points] == [1, 2, 5]
        assert points[0]["gold_score"] == pytest.approx(np.mean(GOLD))  # n = 1: any answer
    assert "bon/uwo/2" in capsys.readouterr().out
