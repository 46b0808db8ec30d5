"""`eslab presets` lists every preset with what it is for and needs, from the preset files."""

from app.cli import main
from engine.presets import preset_info, preset_names


def test_eslab_presets_lists_each_preset_with_its_purpose_needs_and_data(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for name in preset_names():
        info = preset_info(name)
        assert f"\n{name}\n" in f"\n{out}"
        assert info.purpose in flat
        assert all(f"Needs {need}" in flat for need in info.needs)
    assert "lbes-conciseness" in out
    assert "Data first: eslab data countdown --n-given-numbers 3 --out data/countdown3" in flat


def test_eslab_presets_names_the_sweep_that_tunes_a_preset(capsys):
    assert main(["presets"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    tuned = "Tuned by: eslab sweep {0} --space {0} (docs/sweeps.md, Tuning the presets)"
    assert tuned.format("es-conciseness") in out and tuned.format("lbes-conciseness") in out
    assert "--space es-countdown" not in out and "--space es-alignment" not in out
