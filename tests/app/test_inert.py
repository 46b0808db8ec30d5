"""What people wrote is shown as text on every page (under AppTest): a run whose name, tags,
error and completions hold a Markdown image, a javascript: link, raw HTML, a bare URL and
LaTeX renders none of them. Each element that Streamlit renders as Markdown (titles,
captions, alerts, markdown, widget labels) is parsed with a CommonMark parser, which must
find no link, image or HTML in it, and must read back exactly what was written."""

from __future__ import annotations

import html
import re

import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from app.views import inert
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.app.conftest import make_config
from tests.app.test_pages import MAIN, TIMEOUT, page

EVIL = "![x](http://evil/x.png) [click](javascript:alert(1)) <img src=x onerror=alert(1)>"
MORE = "www.evil.example $\\href{javascript:alert(1)}{x}$ :red[red] # heading"
ERROR = f"Traceback (most recent call last):\n  File 'x.py'\nValueError: {EVIL}"
PARSER = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
UNSAFE_TOKENS = {"link_open", "image", "html_inline", "html_block"}


@pytest.fixture
def store(store, tmp_path, dataset):
    """The seeded database plus a failed run named EVIL, tagged EVIL and MORE, whose
    error and completions hold EVIL."""
    config = make_config(dataset, tmp_path / "evil").to_flat()
    run = store.create_run(
        name=EVIL, method="es", config=config, tags=[EVIL, MORE], status=RunStatus.RUNNING
    )
    store.finish_run(run.id, RunStatus.FAILED, error=ERROR)
    store.add_event(run.id, "error", EVIL)
    return store


def evil_id(store: Store) -> int:
    return store.search_runs(text="evil")[0][0].id


def markdown_shown(at: AppTest) -> list[str]:
    """The source of every element and widget label that Streamlit renders as Markdown."""
    sources = []
    for kind in ("title", "header", "subheader", "markdown", "caption"):
        sources += [e.value for e in at.get(kind)]
    for kind in ("error", "warning", "info", "success", "toast"):
        sources += [e.proto.body for e in at.get(kind)]
    for kind in ("selectbox", "multiselect", "radio", "text_input", "button", "metric"):
        sources += [e.label for e in at.get(kind)]
    sources += [e.proto.label for e in at.get("expander")]
    return sources


def assert_inert(sources: list[str]) -> str:
    """Fails on any link, image or HTML that one of `sources` would render (also a GFM
    autolink: a URL or "www." not broken by an escape, or LaTeX); returns the text
    they render, joined."""
    shown = []
    for source in sources:
        tokens = PARSER.parse(source)
        found = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or []}
        assert not found & UNSAFE_TOKENS, source
        unescaped = re.sub(r"\\.", "", source)  # what is left once escaped characters go
        assert not re.search(r"://|www\.|javascript:|\$", unescaped), source
        shown.append(html.unescape(re.sub(r"<[^>]+>", "", PARSER.render(source))))
    return "\n".join(shown)


def test_the_runs_page_shows_the_name_as_text(store):
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert_inert(markdown_shown(at))
    assert EVIL in set(at.dataframe[0].value["name"])  # a table cell is text


def test_the_run_page_shows_name_tags_and_error_as_text(store):
    at = page("app_pages/run.py", run=str(evil_id(store)))
    assert not at.exception
    shown = assert_inert(markdown_shown(at))
    assert EVIL in shown and MORE in shown  # written as typed, not dropped
    assert f"ValueError: {EVIL}" in shown
    assert any(c.value == ERROR for c in at.code)  # the whole traceback, verbatim


def test_the_compare_page_shows_names_as_text(store):
    at = page("app_pages/compare.py", runs=f"1,{evil_id(store)}")
    assert not at.exception
    assert EVIL in assert_inert(markdown_shown(at))


def test_the_samples_page_and_new_run_clone_show_names_as_text(store):
    run_id = str(evil_id(store))
    at = page("app_pages/samples.py", run=run_id)
    assert not at.exception
    assert_inert(markdown_shown(at))
    at = page("app_pages/new_run.py", clone=run_id)
    assert not at.exception
    assert_inert(markdown_shown(at))


@pytest.mark.parametrize(
    "path, key", [("app_pages/run.py", "run"), ("app_pages/new_run.py", "clone")]
)
def test_a_crafted_link_is_refused_without_echoing_its_value(store, path, key):
    at = page(path, **{key: EVIL})
    assert not at.exception
    shown = assert_inert(markdown_shown(at))
    assert f"bad {key} value" in shown and "javascript" not in shown


def open_delete_dialog(run_id: int) -> None:
    from app import actions
    from app.state import get_store

    store = get_store()
    actions.confirm_delete(store, [store.get_run(run_id)])


def test_the_delete_dialog_shows_names_as_text(store):
    at = AppTest.from_function(open_delete_dialog, args=(evil_id(store),), default_timeout=60)
    at.run()
    assert not at.exception
    assert EVIL in assert_inert(markdown_shown(at))


def test_inert_escapes_every_construct():
    for text in (EVIL, MORE, ERROR, "a@b.example", "| a | b |\n|---|---|", "~~x~~ **b** `c`"):
        tokens = PARSER.parse(inert(text))
        assert PARSER.render(inert(text)).count("<") == 2  # only the paragraph's <p>..</p>
        assert {t.type for t in tokens} == {"paragraph_open", "inline", "paragraph_close"}
