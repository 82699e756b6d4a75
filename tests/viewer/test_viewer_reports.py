"""`trajforge view` over eval and improve outputs, in headless Chromium: the eval page (per-task pass@1,
pass@k, failures by criterion, episodes), the improve page (before / after with the interval, per task,
plots) and its rounds, each linked to the episodes. Screenshots of each page are checked as PNGs.

The outputs are real `trajforge eval` runs against the fake server, inside improve reports written as
flows/improve.py writes them (tests/viewer/_reports.py)."""

from __future__ import annotations

import struct
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.viewer import _reports
from tests.viewer.conftest import Served
from tests.viewer.test_viewer_browser import CHROMIUM, FLAGS

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("reports")
    return {"root": root, **_reports.build(root)}


@pytest.fixture(scope="module")
def served(outputs):
    server = Served([str(outputs["root"]), "--port", "0"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(served):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.set_default_timeout(30_000)
        yield tab
        browser.close()
    assert not errors, errors


def report_index(served, name: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{served.url}/api/reports") as response:
        reports = json.loads(response.read())
    return next(r["index"] for r in reports if r["name"].endswith(name))


def shoot(page, path: Path) -> None:
    """A full-page screenshot, checked as a PNG of the page's size with real content (not a blank frame)."""
    page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 1400 and height >= 1000 and len(data) > 20_000, (width, height, len(data))


def test_served_reports_are_listed_by_the_command(served):
    text = " ".join("".join(served.output).split())  # the console wraps long lines
    assert text.count("(improve report)") == 2 and text.count("(eval report)") == 2, text


def test_eval_page_shows_per_task_pass_rates_failures_and_opens_an_episode(page, served, outputs, tmp_path):
    before = outputs["before"]
    r = report_index(served, "improve/eval-baseline")
    page.goto(f"{served.url}/#/report/{r}")
    page.wait_for_selector(".eval-report .tasks-table tbody tr")
    task = next(t for t in before["per_task"] if 0 < t["pass@1"] < 1)  # task 1: solved by 1 sample of 3
    row = page.locator(f".tasks-table tr[data-task='{task['task']}']")
    assert row.locator(".col-pass1").inner_text() == "33.3%"
    assert row.locator(".col-passk").inner_text() == "100.0%"  # pass@3 with one success in three samples
    assert row.locator(".col-passhatk").inner_text() == "0.0%"
    assert row.locator(".col-failures").inner_text() == "DB: 2"
    assert row.locator("a.episode.bad").count() == 2 and row.locator("a.episode.ok").count() == 1
    criterion = page.locator(".failures-table tr[data-criterion='DB']")
    assert criterion.locator("td").nth(1).inner_text() == str(before["failures"]["by_criterion"]["DB"]) == "5"
    assert criterion.locator("a.episode").count() == 5
    assert "58.3%" in page.inner_text(".headline") and "66.7%" in page.inner_text(".pass-k-table")
    page.wait_for_function("document.querySelector('.plots img.plot').naturalWidth > 0")
    shoot(page, tmp_path / "eval.png")
    # A failed episode opens as a trajectory.
    failed = row.locator("a.episode.bad").first
    episode = failed.get_attribute("data-id")
    failed.click()
    page.wait_for_selector(f"article.trajectory[data-id='{episode}']")
    assert "failed" in page.inner_text("article.trajectory .badges")


def test_improve_page_shows_before_and_after_with_the_interval(page, served, outputs, tmp_path):
    single = outputs["single"]
    delta = single["comparison"]["delta"]
    page.goto(f"{served.url}/")  # a folder with an improve run opens on its report
    page.wait_for_selector(".improve-report")
    r = report_index(served, "/improve")
    assert page.evaluate("location.hash") == f"#/report/{r}"
    assert page.inner_text(".headline .interval") == (
        f"+{100 * delta['mean']:.1f} points [+{100 * delta['low']:.1f}, +{100 * delta['high']:.1f}]")
    metrics = page.locator(".before-after-table tr[data-metric='pass@1'] td").all_inner_texts()
    assert metrics == ["pass@1", "58.3%", "75.0%"]
    assert page.locator(".rounds-table").count() == 0  # a single-round report has no rounds
    task = next(t for t in single["comparison"]["per_task"] if t["delta"] > 0)
    row = page.locator(f".per-task-table tr[data-task='{task['task']}']")
    assert row.locator("td").nth(3).inner_text() == "+66.7"
    page.wait_for_function("[...document.querySelectorAll('.plots img.plot')].every((i) => i.naturalWidth > 0)")
    shoot(page, tmp_path / "improve.png")
    # The task's episodes after training: its three samples, all solved.
    row.locator("a.task-link >> text=after").click()
    page.wait_for_selector("#count.counted")
    assert page.inner_text("#count") == "3" and page.input_value("#f-task") == task["task"]
    page.wait_for_selector(".results-table tbody tr")
    assert page.locator(".results-table .col-outcome .badge.ok").count() == 3


def test_improve_rounds_are_a_row_each_linked_to_their_eval(page, served, outputs, tmp_path):
    multi = outputs["multi"]
    r = report_index(served, "improve-rounds")
    page.goto(f"{served.url}/#/report/{r}")
    page.wait_for_selector(".rounds-table tbody tr")
    assert page.locator(".rounds-table tbody tr").count() == 2
    second = page.locator(".rounds-table tr[data-round='2']")
    vs = multi["rounds"][1]["vs_baseline"]
    assert second.locator(".col-pass1").inner_text() == "75.0%"
    assert second.locator(".col-vs-baseline").inner_text() == (
        f"+{100 * vs['mean']:.1f} points [+{100 * vs['low']:.1f}, +{100 * vs['high']:.1f}]")
    assert page.locator(".rounds-table tr[data-round='1'] .col-vs-previous").inner_text() == "–"
    assert "rollout: 5" in second.inner_text() and "last" in second.inner_text()
    assert {Path(src).name for src in page.locator(".plots img.plot").evaluate_all("els => els.map(e => e.src)")} == {
        "before_after.png", "rounds.png"}
    shoot(page, tmp_path / "improve-rounds.png")
    second.locator("a.eval-link").click()
    page.wait_for_selector(".eval-report")
    assert page.evaluate("location.hash") == f"#/report/{report_index(served, 'improve/eval-trained')}"
    assert quote(outputs["after"]["output"], safe="/") in page.inner_text(".eval-report .muted")
