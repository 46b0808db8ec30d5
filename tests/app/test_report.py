"""The self-contained HTML report (app/report.py): no script and no network reference,
every chart as inline SVG holding the run's data, written by `eslab export --format html`,
and drawn by Chromium with all network blocked."""

from __future__ import annotations

import re

from app.cli import main
from app.report import run_report
from tests.app.browser import shots_folder


def test_report_is_self_contained(store):
    html = run_report(store, 1)
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", html, re.I)
    assert not re.search(r"@import|url\(", html)
    titles = [
        "population fitness per step",
        "train reward mean",
        "eval reward mean",
        "train noise std (planned: dashed)",
        "train learning rate (planned: dashed)",
        "seconds per phase",
    ]
    assert html.count("<svg") == len(titles)
    for title in titles:
        assert f">{title}</text>" in html  # drawn into the SVG, not left to a script
    assert "alpha-run says 4" in html  # samples
    assert "engine.rewards.conciseness.compute_score" in html  # configuration
    assert "2 / 5" in html  # summary


def test_export_html_command(seeded_url, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    out = tmp_path / "report.html"
    assert main(["export", "2", "--format", "html", "--out", str(out)]) == 0
    assert "beta-run" in out.read_text()
    assert f"to {out}" in capsys.readouterr().err


def test_report_renders_offline_in_chromium(store, browser, tmp_path):
    path = tmp_path / "report.html"
    path.write_text(run_report(store, 1))
    requests: list[str] = []
    context = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    page.goto(path.as_uri())
    charts = page.locator(".chart svg")
    assert charts.count() == 6
    box = charts.first.bounding_box()
    assert box and box["width"] > 300 and box["height"] > 200
    assert page.locator(".chart svg path").count() > 10  # lines and bands drawn
    page.screenshot(path=shots_folder(tmp_path) / "report.png", full_page=True)
    context.close()
    assert requests == [path.as_uri()]  # nothing but the file itself
