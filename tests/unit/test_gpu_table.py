"""bench/gpu/table.py: the GPU tables rendered from utilization.py's JSON (older files and
rows of another kind included) and written between a page's marker comments."""

import json

import pytest

from bench.doc_section import replace_section
from bench.gpu import table

NEW = {
    "model": "/root/data/models/llama-1b-random",
    "card": "NVIDIA H100 80GB HBM3",
    "vllm": "0.26.0",
    "parameters": 1_073_809_408,
    "batched_tokens_per_s": 20_000.0,
    "weight_ops_s": {"copy": 0.002, "perturb": 0.008},
    "note": "a fixture",
    "rows": [
        {
            "engines": 1,
            "perturbation": "lora",
            "mode": "lora r4",
            "time/step": 2.0,
            "time/generation": 1.5,
            "time/perturb": 0.25,
            "time/update": 0.125,
            "train/num_tokens": 20_000.0,
        },
        {
            "engines": 1,
            "perturbation": "full",
            "time/step": 8.0,
            "time/generation": 7.5,
            "time/perturb": 0.25,
            "time/restore": 0.005,
            "time/update": 0.125,
            "train/num_tokens": 32_000.0,
            "members_per_s": 4.0,
        },
        {
            "engines": 2,
            "engines_per_gpu": 1,
            "perturbation": "full",
            "time/step": 4.0,
            "time/generation": 7.5,
            "train/num_tokens": 32_000.0,
            "members_per_s": 8.0,
        },
        {"phase": "an iteration.py row", "seconds": 3.0},  # a row of another kind
    ],
}
OLD = {  # before the card's vLLM version and the rows' perturbation were recorded
    "model": "/root/data/models/smollm2-135m-random",
    "card": "NVIDIA H200",
    "mps": True,
    "rows": [
        {"engines": 8, "time/step": 4.0, "time/generation": 16.0, "train/num_tokens": 32_000.0}
    ],
}


def cells(text: str) -> list[list[str]]:
    """The data rows of the Markdown tables in `text`, as cells."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [
        [c.strip() for c in r.strip("|").split("|")] for r in rows if not r.startswith("| card")
    ]


def test_every_row_shows_its_card_version_model_mode_and_each_phase():
    text = table.render(NEW, "results/new.json")
    header = next(line for line in text.splitlines() if line.startswith("| card"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "card",
        "vLLM",
        "model",
        "mode",
        "step s",
        "generation s",
        "perturb / slot writing s",
        "restore s",
        "update s",
        "tokens/s",
        "utilization",
        "members/s",
    ]
    full, spread, lora = cells(text)  # one engine, two, then the low-rank mode
    card = ["NVIDIA H100 80GB HBM3", "0.26.0", "llama-1b-random (1.07B)"]
    assert full == [
        *card,
        "full, 1 engine",
        "8.00",
        "7.50",
        "0.25",
        "0.005",
        "0.12",
        "4,000",
        "0.20",
        "4.0",
    ]
    assert spread[3:5] == ["full, 2 engines, 1 a GPU", "4.00"] and spread[-1] == "8.0"
    assert lora == [
        *card,
        "lora r4, one call",
        "2.00",
        "1.50",
        "0.25",
        "-",
        "0.12",
        "10,000",
        "0.50",
        "-",  # a figure of the newer rows only
    ]
    assert text.startswith(
        "`results/new.json`; one call of 256 prompts: 20,000 tokens/s. A fixture"
    )
    assert "(1 row(s) of another kind skipped)" in text
    assert "perturb 8.00 (4.0x)" in text


def test_an_older_file_renders_with_dashes_for_what_it_lacks():
    [row] = cells(table.render(OLD, "old.json"))
    assert row == [
        "NVIDIA H200",
        "-",  # no vLLM version
        "smollm2-135m-random (-)",  # no parameter count
        "full, 8 engines/GPU + MPS",
        "4.00",
        "16.00",
        "8,000",
        "-",  # no batched call to compare with
        "-",  # nor members per second
    ]


def test_files_of_another_kind_are_skipped_with_a_note(tmp_path):
    files = []
    for name, content in [
        ("a.json", json.dumps(OLD)),
        ("b.json", json.dumps({"method": "es", "phases": {"generation": 1.0}})),
        ("c.json", "not json"),
    ]:
        files.append(tmp_path / name)
        files[-1].write_text(content)
    text = table.render_files(files)
    assert "full, 8 engines/GPU + MPS" in text
    assert "(`b.json` skipped: not a bench/gpu/utilization.py result)" in text
    assert "(`c.json` skipped: not JSON:" in text


PAGE = "# Page\n\nprose before\n\n<!-- t:start -->\nold table\n<!-- t:end -->\n\nprose after\n"


def test_the_section_between_the_markers_is_replaced_and_the_rest_kept():
    once = replace_section(PAGE, "t", "new table\n")
    assert once == PAGE.replace("old table", "new table")
    assert replace_section(once, "t", "new table") == once  # idempotent


@pytest.mark.parametrize(
    "page",
    [
        "no markers at all\n",
        "<!-- t:start -->\nonly the start\n",
        "<!-- t:end -->\nout of order\n<!-- t:start -->\n",
        PAGE + PAGE,  # twice
    ],
)
def test_missing_or_repeated_markers_are_refused_naming_the_page_and_markers(page):
    with pytest.raises(ValueError) as info:
        replace_section(page, "t", "new", "docs/x.md")
    assert "docs/x.md needs one '<!-- t:start -->' line" in str(info.value)
    assert "'<!-- t:end -->'" in str(info.value)


def test_the_command_writes_the_page_once_and_fails_clearly_without_markers(tmp_path, capsys):
    results = tmp_path / "new.json"
    results.write_text(json.dumps(NEW))
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- gpu-table:start -->\n<!-- gpu-table:end -->\noutro\n")
    assert table.main([str(results), "--write", str(page)]) == 0
    written = page.read_text()
    assert written.startswith("intro\n<!-- gpu-table:start -->\n`new.json`")
    assert written.endswith("<!-- gpu-table:end -->\noutro\n")
    assert table.main([str(results), "--write", str(page)]) == 0
    assert page.read_text() == written
    assert "already up to date" in capsys.readouterr().out
    page.write_text("no markers\n")
    assert table.main([str(results), "--write", str(page)]) == 2
    assert "needs one '<!-- gpu-table:start -->' line" in capsys.readouterr().err
    assert page.read_text() == "no markers\n"


def test_an_engine_in_a_ray_actor_and_lora_engines_over_gpus_say_so_in_their_mode():
    rows = [
        {**NEW["rows"][1], "in_actors": True},
        {**NEW["rows"][0], "engines": 4, "engines_per_gpu": 1},
    ]
    full, lora = cells(table.render({**NEW, "rows": rows}, "results/x.json"))
    assert full[3] == "full, 1 engine in a Ray actor"
    assert lora[3] == "lora r4, 4 engines, 1 a GPU"


def test_utilization_is_per_card_where_a_row_ran_on_several_gpus():
    rows = [{**NEW["rows"][2], "gpus": 2}]  # 8,000 tokens/s over two cards of 20,000 each
    (spread,) = cells(table.render({**NEW, "rows": rows}, "results/x.json"))
    assert spread[-3:] == ["8,000", "0.20", "8.0"]


def test_engines_given_a_thread_count_say_it_in_their_mode():
    rows = [{**NEW["rows"][2], "engine_threads": 4}]
    (row,) = cells(table.render({**NEW, "rows": rows}, "results/x.json"))
    assert row[3].endswith(", 4 threads each")
