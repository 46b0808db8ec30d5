import pytest

from engine.config import RunConfig
from engine.presets import load_preset, preset_info, preset_names, preset_path

PRESETS = [
    "es-alignment",
    "es-at-scale-countdown",
    "es-at-scale-math",
    "es-conciseness",
    "es-countdown",
    "lbes-conciseness",
    "lbes-countdown",
]
COUNTDOWN = ["es-at-scale-countdown", "es-countdown", "lbes-countdown"]
# Presets that run a reference's experiment as it is, on the reference's model; the others are
# adjusted for the default model.
AS_THE_PAPER = ["es-at-scale-countdown", "es-at-scale-math"]


def test_the_presets_exist():
    assert preset_names() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_a_valid_configuration(name):
    config = load_preset(name)
    assert config.method == name.split("-")[0]
    if name not in AS_THE_PAPER:
        # small models need a larger step than the references' 5e-7 (the files say why)
        assert config.es.learning_rate > 5e-7
    # the file is a plain configuration, as `eslab train FILE` reads it
    assert RunConfig.from_yaml(preset_path(name)) == config


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_says_what_it_is_for(name):
    info = preset_info(name)
    assert info.name == name and len(info.purpose) > 30
    assert all(len(need) > 20 for need in info.needs)


def test_the_lbes_conciseness_preset_is_a_short_lbes_run_on_the_default_model():
    config = load_preset("lbes-conciseness")
    assert config.model.model == "data/models/smollm2-135m-instruct"
    assert config.reward.reward_func_path == "engine.rewards.conciseness.compute_score"
    assert config.sampling.n >= 2 and config.sampling.temperature > 0  # rewards must differ
    assert config.data.max_steps <= 20
    assert "default model" in preset_info("lbes-conciseness").purpose


@pytest.mark.parametrize("name", COUNTDOWN)
def test_the_countdown_presets_say_they_need_a_larger_model_and_their_data(name):
    info = preset_info(name)
    assert any("larger model" in need and "Qwen/Qwen2.5-" in need for need in info.needs)
    assert info.data_command and info.data_command.startswith("eslab data countdown ")


def test_a_preset_header_field_goes_on_over_indented_lines_and_ends_at_a_bare_hash(
    tmp_path, monkeypatch
):
    import engine.presets

    (tmp_path / "x.yaml").write_text(
        "# For: one\n#   two\n# Needs: a\n# Needs: b\n#  c\n"
        "# Data: eslab data conciseness --out d\n#\n# Note: free text, not a field\nmethod: es\n"
    )
    monkeypatch.setattr(engine.presets, "PRESET_DIR", tmp_path)
    info = preset_info("x")
    assert (info.purpose, info.needs) == ("one two", ("a", "b c"))
    assert info.data_command == "eslab data conciseness --out d"


@pytest.mark.parametrize(
    "header",
    ["# Needs: a\n", "# For: a\n# For: b\n", "# For: a\n# Purpose: b\n"],
)
def test_a_preset_header_without_one_for_or_with_an_unknown_field_is_refused(
    tmp_path, monkeypatch, header
):
    import engine.presets

    (tmp_path / "x.yaml").write_text(header + "method: es\n")
    monkeypatch.setattr(engine.presets, "PRESET_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"x\.yaml"):
        preset_info("x")


def test_an_unknown_preset_lists_the_known_ones():
    with pytest.raises(KeyError, match="es-conciseness"):
        load_preset("nope")
    with pytest.raises(KeyError, match="lbes-conciseness"):
        preset_info("nope")
