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
