"""The schema describes every option and group in people's words, once, for the form and the
CLI: a label and a help text per option, a title per group."""

from dataclasses import dataclass

import pytest

from engine.config import GROUP_TITLES, config_fields
from engine.config.fields import group_title, option
from engine.config.schema import GROUPS


def test_every_option_has_a_label_of_its_own_and_a_help_text():
    specs = config_fields()
    for spec in specs:
        assert spec.label and spec.label[0].isupper(), spec.name
        assert spec.label != spec.name and "`" not in spec.label, spec.name
        assert len(spec.help) > 10, spec.name
    labels = [s.label for s in specs]
    assert len(set(labels)) == len(labels)  # two fields never read the same


def test_every_group_has_a_title_in_the_same_style():
    assert list(GROUP_TITLES) == ["", *GROUPS]
    titles = list(GROUP_TITLES.values())
    assert all(t[0].isupper() for t in titles), titles
    assert len(set(titles)) == len(titles)
    assert (GROUP_TITLES["alignment"], GROUP_TITLES["ensemble"]) == ("Alignment", "Reward ensemble")


def test_an_option_without_a_label_or_a_group_without_a_title_is_a_schema_bug():
    with pytest.raises(TypeError, match="label"):
        option(1, "a help text")

    @dataclass(frozen=True)
    class Untitled:
        seed: int = option(1, "a help text", label="Seed")

    with pytest.raises(TypeError, match="Untitled has no TITLE"):
        group_title(Untitled)
