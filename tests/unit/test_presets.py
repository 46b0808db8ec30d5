import pytest

from engine.presets import load_preset, preset_names

PRESETS = ["es-alignment", "es-conciseness", "es-countdown", "lbes-countdown"]


def test_the_presets_exist():
    assert preset_names() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_a_valid_configuration(name):
    config = load_preset(name)
    assert config.method == name.split("-")[0]
    # small models need a larger step than the references' 5e-7 (the files say why)
    assert config.es.learning_rate > 5e-7


def test_an_unknown_preset_lists_the_known_ones():
    with pytest.raises(KeyError, match="es-conciseness"):
        load_preset("nope")
