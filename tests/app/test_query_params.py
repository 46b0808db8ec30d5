"""Ids and page numbers in a page's address are plain decimal numbers: anything else (an
exponent, a sign, hex, a space, another script's digits, an id past 64 bits) gets a clear
message on the page, never a traceback and never a different run."""

from __future__ import annotations

import pytest

from app.views import whole_number
from tests.app.test_pages import page

NOT_PLAIN = ["1e3", "-1", "0x10", " 5", "+1", "1_0", "٣", "1" + "0" * 30, "0"]


@pytest.mark.parametrize("text", NOT_PLAIN)
def test_only_plain_decimal_numbers_are_ids(text):
    assert whole_number(text) is None


def test_plain_decimal_numbers_are_ids():
    assert [whole_number(t) for t in ("1", "42", str(2**63 - 1))] == [1, 42, 2**63 - 1]


def bad_value_message(at, name: str) -> str:
    assert not at.exception, at.exception
    [error] = at.error
    assert f"bad `{name}` value" in error.value
    return error.value


@pytest.mark.parametrize("value", NOT_PLAIN)
def test_the_run_page_refuses_a_run_that_is_no_plain_number(store, value):
    at = page("app_pages/run.py", run=value)
    assert "plain decimal numbers such as `?run=12`" in bad_value_message(at, "run")
    assert not at.title or at.title[0].value != "alpha-run"


@pytest.mark.parametrize(
    ("path", "name", "value"),
    [
        ("app_pages/samples.py", "run", "٣"),
        ("app_pages/samples.py", "run", "1" + "0" * 30),
        ("app_pages/compare.py", "runs", "1,0x2"),
        ("app_pages/new_run.py", "clone", "-1"),
    ],
)
def test_other_pages_refuse_ids_that_are_no_plain_numbers(store, path, name, value):
    bad_value_message(page(path, **{name: value}), name)


@pytest.mark.parametrize("value", ["1e3", "-1", "0x10", " 2", "٢", "1" + "0" * 30])
def test_the_runs_page_shows_page_one_for_a_page_that_is_no_plain_number(store, value):
    at = page("app_pages/runs.py", page=value)
    assert not at.exception, at.exception
    assert "bad `page` value" in at.warning[0].value
    assert set(at.dataframe[0].value["name"]) == {"alpha-run", "beta-run"}
