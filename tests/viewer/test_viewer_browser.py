"""`trajforge view` end to end in headless Chromium (Playwright, the system browser): one served
pipeline-like root (a dataset of real Agent-R output plus an export of it), one browser for the module.

Each test writes a screenshot of the page it checked to `out/viewer-screenshots/` (git-ignored;
TRAJFORGE_VIEWER_SCREENSHOTS overrides it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest

from generators.mcts_splice import REVISION_TEMPLATES
from schemas.store import Dataset
from tests.viewer import _data
from tests.viewer.conftest import REPO

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = Path(os.environ.get("TRAJFORGE_VIEWER_SCREENSHOTS", REPO / "out" / "viewer-screenshots"))
SPLICED = "mcts_splice/retail-w0-s0-0000/n2+n1/spliced"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")


@pytest.fixture(scope="module")
def page(served):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.errors = errors
        tab.set_default_timeout(30_000)
        yield tab
        browser.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def records(viewer_dataset):
    return list(Dataset.open(viewer_dataset).iter_records())


def open_hash(page, served, fragment: str) -> None:
    page.goto(f"{served.url}/#{fragment}")


def dataset_index(page, served) -> int:
    """The source index of the dataset (the root also holds the export)."""
    open_hash(page, served, "/")
    page.wait_for_selector("#source option", state="attached")
    labels = page.locator("#source option").all_inner_texts()
    return next(k for k, label in enumerate(labels) if "generate/mcts" in label)


def shoot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def count_after(page, action) -> int:
    """Do `action` (a navigation, a filter) and read the count the list shows for it, not the previous one."""
    page.evaluate("() => document.querySelectorAll('#count').forEach((c) => { c.dataset.stale = '1'; })")
    action()
    page.wait_for_selector("#count.counted:not([data-stale])")
    return int(page.inner_text("#count"))


def test_search_finds_a_known_trajectory(page, served):
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/trajectories")
    page.wait_for_selector(".results-table tbody tr")
    page.fill("#q", _data.SEARCH_TEXT)
    assert count_after(page, lambda: page.press("#q", "Enter")) == 1
    page.wait_for_function("document.querySelectorAll('.results-table tbody tr').length === 1")
    assert page.locator(".results-table tbody tr").get_attribute("data-id") == _data.SEARCH_ID
    shoot(page, "search")
    page.click(".results-table .record-link")
    page.wait_for_selector("article.trajectory")
    assert page.locator("article.trajectory").get_attribute("data-id") == _data.SEARCH_ID
    assert _data.SEARCH_TEXT in page.inner_text(".step.kind-api .arguments")


def test_filters_change_the_counts(page, served, records):
    i = dataset_index(page, served)
    assert count_after(page, lambda: open_hash(page, served, f"/{i}/trajectories")) == len(records)
    assert int(page.inner_text("#total")) == len(records)
    expected = {
        ("success", "false"): sum(t.success is False for t in records),
        # The system prompt's step (train = false) is context, not a masked step.
        ("masked", "yes"): sum(any(not s.train and getattr(s, "name", None) != "system" for s in t.steps)
                               for t in records),
        ("label", "bad"): sum(any(s.label == "bad" for s in t.steps) for t in records),
    }
    for (name, value), n in expected.items():
        assert count_after(page, lambda: page.select_option(f"#f-{name}", value)) == n, (name, value)
        assert f"{name}={value}" in page.evaluate("location.hash")
        assert count_after(page, lambda: page.click(".controls .clear")) == len(records)
    # Filters combine: failed trajectories with a reward of at most 0.5.
    page.fill("#f-reward_max", "0.5")
    assert count_after(page, lambda: page.select_option("#f-success", "false")) == sum(
        t.success is False and t.reward is not None and t.reward <= 0.5 for t in records)
    # A facet narrows further.
    page.wait_for_selector(".facet[data-facet=source]")
    assert count_after(page, lambda: page.click(".facet[data-facet=source][data-value=test]")) == sum(
        t.success is False and t.reward is not None and t.reward <= 0.5 and t.source == "test" for t in records) > 0
    shoot(page, "filters")


def test_spliced_trajectory_shows_masked_steps_and_revision(page, served, records):
    spliced = next(t for t in records if t.id == SPLICED)
    splice = spliced.details["splice"]
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/t/{quote(SPLICED, safe='')}")
    page.wait_for_selector("article.trajectory .step")
    masked = [int(x) for x in page.locator(".step.masked").evaluate_all("els => els.map(e => e.dataset.index)")]
    assert masked == splice["masked"] == [k for k, s in enumerate(spliced.steps) if not s.train and k > 0]
    assert all("train=false (masked)" in t for t in page.locator(".step.masked .step-head").all_inner_texts())
    assert page.locator(".step.seg-bad").count() == len(masked)
    revision = page.locator(".step.revision")
    assert revision.count() == 1 and int(revision.get_attribute("data-index")) == splice["revision_index"]
    assert spliced.steps[splice["revision_index"]].content in revision.inner_text()
    continuation = page.locator(".step.seg-continuation").evaluate_all("els => els.map(e => +e.dataset.index)")
    assert continuation == list(range(splice["revision_index"] + 1, len(spliced.steps)))
    summary = page.inner_text(".revision-summary")
    assert "bad segment, loss masked: steps 2–3" in summary and f"revision thought: step {splice['revision_index']}" in summary
    shoot(page, "spliced")
    # The source paths link to the bad and the good path the splice was made of.
    page.click(".revision-summary .source-path >> text=bad source path")
    page.wait_for_function(f"location.hash.endsWith({quote(spliced.provenance.parent_ids[0], safe='')!r})")
    page.wait_for_selector(f"article.trajectory[data-id='{spliced.provenance.parent_ids[0]}']")


def test_pair_shows_the_fork_step(page, served, viewer_dataset):
    pair = next(p for p in Dataset.open(viewer_dataset).iter_records("pairs") if p.level == "trajectory")
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/pairs")
    page.click(f".results-table tr[data-id='{pair.id}'] .record-link")
    page.wait_for_selector("article.pair .side-by-side .cell")
    fork = page.locator(".cell.fork .step.fork")
    assert fork.count() == 2
    assert {int(x) for x in fork.evaluate_all("els => els.map(e => e.dataset.index)")} == {pair.prefix_len}
    chosen, rejected = page.inner_text(".cell.chosen.fork"), page.inner_text(".cell.rejected.fork")
    assert "fork" in chosen and chosen != rejected
    assert page.locator(".prefix .step").count() == pair.prefix_len
    assert f"fork at step {pair.prefix_len}" in page.inner_text("article.pair .badges")
    # Its DPO row, rendered by the exporter: the prompt is the shared prefix.
    page.wait_for_selector(".preview .preview-row .conv-prompt")
    assert page.input_value("#preview-format") == "trl-dpo"
    shoot(page, "pair")


def test_web_step_shows_its_screenshot(page, served):
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/t/{quote(_data.WEB_ID, safe='')}")
    image = page.locator(".step.kind-web img.screenshot")
    image.wait_for()
    page.wait_for_function("document.querySelector('img.screenshot').complete")
    assert image.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [320, 180]
    assert image.get_attribute("src").endswith(_data.SCREENSHOT)
    assert "http://shop.local/checkout/1042" in page.inner_text(".step.kind-web .url")
    assert 'button "Pay now"' in page.inner_text(".step.kind-web .axtree")
    shoot(page, "web-screenshot")


def test_quarantined_record_shows_its_reason(page, served):
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/quarantine")
    page.wait_for_selector(".results-table tbody tr")
    assert _data.QUARANTINE_REASON in page.inner_text(".results-table")
    page.select_option("#sort", "stage")
    page.wait_for_function("location.hash.includes('sort=stage')")
    page.click(".results-table tr[data-id='bad/1'] .record-link")
    page.wait_for_selector(".reason-box")
    assert page.inner_text(".reason-box .quarantine-reason") == _data.QUARANTINE_REASON
    assert "input.jsonl:17" in page.inner_text(".location")
    assert re.search(r'"steps": \[\s+1,', page.inner_text("pre.raw"))  # the raw input, pretty-printed
    shoot(page, "quarantine")
    # A filtered record shows the filter and its reason.
    open_hash(page, served, f"/{i}/filtered")
    page.click(".results-table .record-link")
    page.wait_for_selector(".decision")
    assert "no_loops" in page.inner_text(".decision") and "the same call repeats 3 times" in page.inner_text(".decision .reason")


def test_judged_trajectory_shows_labels_and_the_judge(page, served):
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/t/{quote(_data.JUDGED_ID, safe='')}")
    page.wait_for_selector(".judge")
    assert "score 2" in page.inner_text(".judge") and "answers without evidence" in page.inner_text(".judge")
    assert page.locator(".step .label.bad").count() == 1 and page.locator(".step .label.good").count() == 1
    assert "claims stock without checking the count" in page.inner_text(".step[data-index='3'] .judge-reason")


def test_export_preview_highlights_the_tokens_that_carry_loss(page, served, tokenizer_dir):
    if tokenizer_dir is None:
        pytest.skip("transformers is not installed")
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/t/{quote(SPLICED, safe='')}")
    page.wait_for_selector(".preview .preview-row")
    page.select_option("#preview-format", "openai")
    page.wait_for_selector(".preview .tokens .tok.loss")
    trained = "".join(page.locator(".tok.loss").all_inner_texts())
    untrained = "".join(page.locator(".tok:not(.loss)").all_inner_texts())
    assert "ordered by mistake" in untrained and "ordered by mistake" not in trained  # the masked wrong call
    assert any(thought in trained for thought in REVISION_TEMPLATES)  # the revision thought is trained
    assert page.locator(".turn .badge.masked").first.inner_text() == "weight 0"
    shoot(page, "export-preview-tokens")


def test_an_export_is_browsable(page, served, viewer_export):
    i = dataset_index(page, served)
    open_hash(page, served, f"/{i}/trajectories")
    page.wait_for_selector(".results-table.trajectories tbody tr")
    labels = page.locator("#source option").all_inner_texts()
    k = next(n for n, label in enumerate(labels) if "export/sft" in label)
    assert "trl-sft" in labels[k]
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in (viewer_export / "data").glob("train-*.parquet"))
    assert count_after(page, lambda: page.select_option("#source", str(k))) == rows > 0
    page.wait_for_selector(".results-table.rows tbody tr")
    page.fill("#q", _data.SEARCH_TEXT)
    assert count_after(page, lambda: page.press("#q", "Enter")) == 1
    page.wait_for_function("document.querySelectorAll('.results-table tbody tr').length === 1")
    page.click(".results-table .record-link")
    page.wait_for_selector(".export-row .conv-completion .turn")
    assert _data.SEARCH_TEXT in page.inner_text(".export-row")
