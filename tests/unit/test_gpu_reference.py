"""bench/gpu/reference.py and its helpers, without a GPU: the arguments, members/s and the
ratio, the JSON kept across runs, the listing of patches, the vllm.utils shim (on a fake
vllm.utils), the token count, a side's partial record when it fails, and a side's process
stopped at its timeout."""

import json
import sys
import types
from pathlib import Path

import pytest

from bench.gpu import reference, reference_shims, reference_sides


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """A folder with the files a snapshot must have (contents do not matter here)."""
    root = tmp_path / "es-at-scale"
    for name in reference_shims.USED_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    return root


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_defaults_are_the_issues_settings(snapshot: Path, model: Path) -> None:
    args = reference.parse_args([str(model), "--reference", str(snapshot)])
    assert reference.settings(args) == {
        "model": str(model),
        "population": 32,
        "prompts": 8,
        "max_tokens": 128,
        "steps": 2,
        "engines": 1,
    }
    assert args.sides == ["eslab", "reference"]
    assert args.reference_executor == "ray"  # the trainer's own
    assert args.tensor_parallel_size == 1  # what utilization.py's helpers read


def test_a_folder_that_is_not_a_snapshot_is_refused(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        reference.parse_args([str(model), "--reference", str(tmp_path)])
    err = capsys.readouterr().err
    assert "--reference" in err
    assert "it has no es_at_scale/trainer/es_trainer.py" in err


def test_a_model_folder_without_config_is_refused(
    tmp_path: Path, snapshot: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        reference.parse_args([str(tmp_path), "--reference", str(snapshot)])
    assert "has no config.json" in capsys.readouterr().err


def test_zero_steps_are_refused(snapshot: Path, model: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        reference.parse_args([str(model), "--reference", str(snapshot), "--steps", "0"])
    assert "--steps must be at least 1" in capsys.readouterr().err


def test_engines_take_a_number_or_auto(
    snapshot: Path, model: Path, capsys: pytest.CaptureFixture
) -> None:
    base = [str(model), "--reference", str(snapshot), "--engines"]
    assert reference.parse_args([*base, "AUTO"]).engines == "auto"
    assert reference.parse_args([*base, "4"]).engines == 4
    for bad in ("0", "many"):
        with pytest.raises(SystemExit):
            reference.parse_args([*base, bad])
        assert "whole number from 1, or auto" in capsys.readouterr().err


def test_the_table_shows_what_auto_chose() -> None:
    table = results({"engines": 8, "step_s": 2.0, "start_s": 60.0}, None)
    table["settings"]["engines"] = "auto"
    assert "ES Lab (auto: 8 engine(s))" in reference.render(reference.summarize(table))
    assert "ES Lab (1 engine(s))" in reference.render(reference.summarize(results({}, None)))


def results(eslab: dict | None, ref: dict | None) -> dict:
    out: dict = {
        "settings": {
            "model": "m",
            "population": 32,
            "prompts": 8,
            "max_tokens": 128,
            "steps": 2,
            "engines": 1,
        }
    }
    if eslab is not None:
        out["eslab"] = eslab
    if ref is not None:
        out["reference"] = ref
    return out


def test_each_side_gets_an_even_share_of_the_budget_left() -> None:
    assert reference.side_timeout(570, 0, 2) == 285
    assert reference.side_timeout(570, 170, 1) == 400  # ES Lab ended early
    assert reference.side_timeout(570, 600, 1) == 0


def test_members_per_second_and_ratio_leave_out_the_warm_up() -> None:
    ref = {
        "iterations": [
            {"s": 100.0, "tokens": 1},
            {"s": 8.0, "tokens": 32768},
            {"s": 12.0, "tokens": 32768},
        ]
    }
    out = reference.summarize(results({"step_s": 4.0}, ref))
    assert out["reference"]["step_s"] == 10.0  # mean of the two timed iterations
    assert out["reference"]["tokens"] == 32768
    assert out["reference"]["members_per_s"] == 3.2
    assert out["eslab"]["members_per_s"] == 8.0
    assert out["ratio"] == 2.5


def test_a_side_without_timed_iterations_has_no_rate_and_no_ratio() -> None:
    ref = {"iterations": [{"s": 100.0, "tokens": 1}], "error": "stopped"}
    out = reference.summarize(results({"step_s": 4.0}, ref))
    assert out["reference"]["members_per_s"] is None
    assert out["ratio"] is None
    assert reference.summarize(results({"error": "boom"}, None))["ratio"] is None


def test_an_earlier_file_is_kept_only_for_the_same_settings(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    earlier = results({"step_s": 4.0}, None)
    path.write_text(json.dumps(earlier))
    assert reference.load_previous(path, earlier["settings"]) == earlier
    other = {**earlier["settings"], "population": 16}
    assert reference.load_previous(path, other) == {"settings": other}
    path.write_text("{not json")
    assert reference.load_previous(path, other) == {"settings": other}
    assert reference.load_previous(None, other) == {"settings": other}


def test_the_output_lists_every_patch_and_a_failed_sides_error() -> None:
    ref = {"patches": ["patch one", "patch two"], "error": "RuntimeError: no GPU"}
    text = reference.render(reference.summarize(results({"step_s": 4.0}, ref)))
    assert "  - patch one\n  - patch two" in text
    assert "failed: RuntimeError: no GPU" in text
    assert "ES Lab / ES at Scale members/s: -" in text


def test_the_vllm_shim_sets_only_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    utils = types.ModuleType("vllm.utils")
    network = types.ModuleType("vllm.utils.network_utils")
    network.get_ip = lambda: "127.0.0.1"
    network.get_open_port = lambda: 5000
    utils.get_open_port = lambda: 6000  # still where vLLM 0.11 had it
    vllm = types.ModuleType("vllm")
    vllm.utils = utils
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.utils", utils)
    monkeypatch.setitem(sys.modules, "vllm.utils.network_utils", network)
    applied = reference_shims.vllm_import_shims()
    assert len(applied) == 1 and applied[0].startswith("vllm.utils.get_ip = ")
    assert utils.get_ip() == "127.0.0.1"
    assert utils.get_open_port() == 6000
    assert reference_shims.vllm_import_shims() == []


def test_the_executor_patch_changes_only_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    class ESNcclLLM:  # stands in for the trainer's engine class
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.kwargs = kwargs

    trainer = types.ModuleType("es_at_scale.trainer.es_trainer")
    trainer.ESNcclLLM = ESNcclLLM
    monkeypatch.setitem(sys.modules, "es_at_scale.trainer.es_trainer", trainer)
    applied = reference_shims.set_executor("uni")
    assert "distributed_executor_backend='uni'" in applied[0]
    engine = ESNcclLLM(model="m", distributed_executor_backend="ray", dtype="bfloat16")
    assert engine.kwargs == {
        "model": "m",
        "distributed_executor_backend": "uni",
        "dtype": "bfloat16",
    }


def test_the_token_count_returns_the_trainers_result_unchanged() -> None:
    result = {"raw_lens_per_prompt": [[128], [100]], "avg_reward": 0.5}

    class Trainer:
        def _postprocess_outputs(self, outputs: object, targets: object) -> dict:
            return result

    trainer = Trainer()
    count = reference_shims.TokenCount(trainer)
    assert trainer._postprocess_outputs("o", "t") is result
    trainer._postprocess_outputs("o", "t")
    assert count.take() == 456
    assert count.take() == 0


def test_member_seeds_are_seeded_by_iteration() -> None:
    first = reference_sides.member_seeds(0, 32)
    assert first == reference_sides.member_seeds(0, 32)
    assert first != reference_sides.member_seeds(1, 32)
    assert len(set(first)) == 32 and all(0 <= s < 2**30 for s in first)


def test_a_failing_side_leaves_its_partial_record_and_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def side(args: object, data: Path, report: reference_sides.Report) -> None:
        report({"start_s": 12.5})
        raise RuntimeError("engine lost")

    monkeypatch.setitem(reference_sides.SIDES, "reference", side)
    out = tmp_path / "side.record"
    args = types.SimpleNamespace(side="reference", data=str(tmp_path))
    assert reference_sides.run_side(args, out) == 1
    record = json.loads(out.read_text())
    assert record["start_s"] == 12.5
    assert record["error"] == "RuntimeError: engine lost"
    assert "Traceback" in record["traceback"]


def fake_interpreter(tmp_path: Path, body: str) -> Path:
    """A stand-in for sys.executable: a shell script that gets reference.py's side command."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_a_side_past_its_timeout_is_stopped_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sys, "executable", str(fake_interpreter(tmp_path, "echo started\nsleep 60"))
    )
    record = reference.run_side("reference", [], tmp_path, tmp_path / "r", timeout=1)
    assert record["error"] == "stopped after the 1 s timeout"
    assert record["wall_s"] < 30
    assert "started" in record["log_tail"]
    assert (tmp_path / "r-reference.log").is_file()


def test_a_side_that_exits_with_an_error_keeps_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the side command ends in: --side NAME --side-out FILE --data DIR
    body = 'out=$(echo "$@" | sed "s/.*--side-out \\([^ ]*\\).*/\\1/")\n'
    body += 'echo \'{"start_s": 3.0}\' > "$out"\nexit 3'
    monkeypatch.setattr(sys, "executable", str(fake_interpreter(tmp_path, body)))
    record = reference.run_side("eslab", [], tmp_path, tmp_path / "r", timeout=30)
    assert record["start_s"] == 3.0
    assert record["rc"] == 3
    assert record["error"] == "exit status 3"
