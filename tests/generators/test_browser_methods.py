"""Methods on real pages, run the way users run them (`generators.runner.generate`) in Chromium with scripted
answers from the fake OpenAI-compatible server: rollout on a MiniWoB++ task and on the shipped multi-page shop,
mcts_splice on a MiniWoB++ task (one good path, one bad), step_verify judging the shop's pages."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from backends.fake_server import FakeServer, Rule, Samples
from envs.browser.solvers import parse_axtree
from generators.runner import generate, load_config
from schemas.models import Trajectory
from schemas.store import Dataset
from tests.conftest import REPO
from tests.generators._browser_agent import LOGIN, ORDER_SOCKS, call, first_user, next_move, text_of, textboxes

SHOP = REPO / "samples" / "sites" / "tiny-shop"
SOCKS = "Order two pairs of red socks as Ada."
LLM = {"backend": "openai", "model": "fake-model", "api_key_env": None, "max_retries": 0, "request_timeout_s": 20}
BROWSER = {"step_timeout_s": 20, "action_timeout_s": 3}


def agent(body: dict[str, Any]) -> Any:
    """The scripted agent: orders socks on the shop, signs in on MiniWoB's login page."""
    if not body.get("tools"):
        return None
    return next_move(body, ORDER_SOCKS if first_user(body) == SOCKS else LOGIN)


def _run(config: dict[str, Any], out: Path, rules: list[Rule]) -> tuple[Any, list[dict[str, Any]]]:
    with FakeServer(rules=rules) as server:
        summary = asyncio.run(generate(load_config({**config, "llm": {**LLM, "base_url": server.base_url}}), out))
        return summary, [e["body"] for e in server.log if "body" in e]


@pytest.fixture(scope="module")
def shop_rollout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser-rollout")
    tasks = root / "shop_tasks.jsonl"
    tasks.write_text(json.dumps({
        "id": "order-socks", "start_url": "index.html", "instruction": SOCKS,
        "evaluation": [{"type": "url", "contains": "thanks.html"}, {"type": "text", "text": "Red socks x 2"},
                       {"type": "js", "expression": "JSON.parse(localStorage.getItem('ordered') || '{}').socks / 2"}],
    }) + "\n")
    config = {"method": "rollout", "env": "browser", "env_config": {"site_dir": str(SHOP), **BROWSER},
              "tasks": {"source": "sites", "path": str(tasks)}, "max_steps": 10}
    out = root / "out"
    _run(config, out, [Rule(fn=agent)])
    return out


def _assert_pages_stored(out: Path, trajectory: Trajectory) -> None:
    pages = [s for s in trajectory.steps if s.kind == "web"]
    assert len(pages) >= 3
    for page in pages:
        assert page.url and page.axtree and page.html and page.screenshot is not None
        file = out / page.screenshot.path
        assert file.is_file() and not Path(page.screenshot.path).is_absolute()
        with Image.open(file) as image:
            image.verify()
            assert image.format == "PNG"


def test_rollout_on_the_shop_stores_web_observations_with_screenshots(shop_rollout: Path) -> None:
    (traj,) = Dataset.open(shop_rollout).iter_records()
    assert traj.id == "rollout/order-socks#0" and traj.success and traj.reward == 1.0
    # The agent's system prompt opens the record, then the request.
    assert traj.steps[0].name == "system" and traj.steps[1].content == SOCKS
    assert traj.details["env"]["name"] == "browser"
    assert [r["passed"] for r in traj.details["evaluation"]["details"]["checks"]] == [True, True, True]
    _assert_pages_stored(shop_rollout, traj)
    assert traj.steps[-3].url.endswith("thanks.html?name=Ada") and "Order placed" in traj.steps[-3].axtree


def test_rollout_on_a_miniwob_task(tmp_path: Path) -> None:
    config = {"method": "rollout", "env": "browser", "env_config": BROWSER, "max_steps": 5,
              "tasks": {"source": "miniwob", "options": {"tasks": ["login-user"]}}}
    _run(config, tmp_path / "out", [Rule(fn=agent)])
    (traj,) = Dataset.open(tmp_path / "out").iter_records()
    assert traj.id == "rollout/miniwob/login-user/0#0" and traj.success and traj.reward == 1.0
    assert traj.details["evaluation"]["reason"].startswith("MiniWoB reward +1")
    assert [s.function for s in traj.steps if s.kind == "api"] == ["type", "type", "click"]
    _assert_pages_stored(tmp_path / "out", traj)


# ---- mcts_splice ----------------------------------------------------------------------------------

WRONG_USER = "nobody"


def searcher(body: dict[str, Any]) -> Any:
    """Expansions (n = 2) at the root: the right username, then a wrong one; rollouts go on with LOGIN;
    the verifier names the wrong username as the first error."""
    if body.get("response_format"):
        prompt = text_of(body["messages"][-1])
        index = next(line.split("]")[0].strip("[ ") for line in prompt.splitlines()
                     if line.startswith("[") and f'"text":"{WRONG_USER}"' in line.replace(" ", ""))
        return {"steps": [{"index": int(index), "verdict": "Bad", "reason": "it typed a username the page did not ask for"}]}
    if not body.get("tools"):
        return None
    move = next_move(body, LOGIN)
    if int(body.get("n") or 1) > 1:
        wrong = call("type", bid=textboxes(parse_axtree(text_of(body["messages"][-1])))[0], text=WRONG_USER)
        return Samples([move, wrong])
    return move


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("browser-mcts") / "out"
    config = {"method": "mcts_splice", "env": "browser", "env_config": BROWSER,
              "tasks": {"source": "miniwob", "options": {"tasks": ["login-user"]}},
              "search": {"iterations": 1, "generations": 2, "max_depth": 5}, "verifier": "llm"}
    summary, log = _run(config, out, [Rule(fn=searcher)])
    ds = Dataset.open(out)
    return {"summary": summary, "log": log, "trajectories": {t.id: t for t in ds.iter_records()},
            "pairs": list(ds.iter_records("pairs")), "quarantined": list(ds.iter_records("quarantine"))}


def test_mcts_splice_on_miniwob_splices_the_bad_path_onto_the_good_one(search: dict[str, Any]) -> None:
    assert not search["quarantined"]
    trajs = search["trajectories"]
    (spliced,) = [t for t in trajs.values() if t.details["role"] == "spliced"]
    info = spliced.details["splice"]
    # [0] the system prompt, [1] the request, [2] the page, [3] the wrong username and [4] its page (masked),
    # [5] the revision, then the good path from its first action on: right username, password, Login.
    assert info["prefix_len"] == 3 and info["first_error"] == 3 and info["masked"] == [3, 4]
    assert info["error_source"] == "llm" and info["revision_index"] == 5
    assert spliced.steps[3].arguments["text"] == WRONG_USER and not spliced.steps[3].train
    assert spliced.steps[5].kind == "message" and spliced.steps[5].extra == {"kind": "revision"}
    assert [s.function for s in spliced.steps[6:] if s.kind == "api"] == ["type", "type", "click"]
    # The revision and the good path's actions are declared: no request of the agent produced them as recorded.
    assert [(r["kind"], r["steps"]) for r in spliced.details["rewrites"]] == [("written", [5]), ("context", [6, 8, 10])]
    assert spliced.success and spliced.reward == 1.0
    assert spliced.details["evaluation"]["reason"].startswith("MiniWoB reward +1")
    # The verifier read the pages of the failed path, not a placeholder.
    (verify,) = [b for b in search["log"] if b.get("response_format")]
    prompt = text_of(verify["messages"][-1])
    assert "SEEN: page http://miniwob.localhost/miniwob/login-user.html" in prompt
    assert "button 'Login'" in prompt and "SEEN: web" not in prompt


def test_mcts_splice_on_miniwob_makes_dpo_pairs_and_counts_replays(search: dict[str, Any]) -> None:
    trajs, pairs = search["trajectories"], search["pairs"]
    assert {p.level for p in pairs} == {"trajectory", "step"} and len(pairs) == 2
    for pair in pairs:
        chosen, rejected = trajs[pair.chosen_id], trajs[pair.rejected_id]
        assert pair.prefix_len == 3 and chosen.steps[:3] == rejected.steps[:3]
        assert chosen.steps[3].arguments["text"] != WRONG_USER and rejected.steps[3].arguments["text"] == WRONG_USER
        assert pair.chosen_reward == 1.0 and pair.rejected_reward == 0.0
    # The browser cannot copy itself: both children replay the root (a fresh episode), then each
    # rollout replays its child's one action.
    assert search["summary"].counts["mcts_replays"] == 4


# ---- step_verify on pages -------------------------------------------------------------------------


def judge_steps(body: dict[str, Any]) -> Any:
    if not body.get("response_format"):
        return None
    prompt = text_of(body["messages"][-1])
    return {"label": "good" if "Error:" not in prompt.split("After the step:", 1)[1] else "bad",
            "reason": "the page after shows the action's effect"}


def _verify(inputs: Path, out: Path, **extra: Any) -> tuple[Any, list[dict[str, Any]]]:
    config = {"method": "step_verify", "input": str(inputs), "verifier": "llm", **extra}
    return _run(config, out, [Rule(fn=judge_steps)])


def test_step_verify_judges_pages_before_and_after_with_screenshots(shop_rollout: Path, tmp_path: Path) -> None:
    summary, log = _verify(shop_rollout, tmp_path / "out", judge={"vision": True},
                           policy="Never place an order without the customer's name.")
    (source,) = Dataset.open(shop_rollout).iter_records()
    (labeled,) = Dataset.open(tmp_path / "out").iter_records()
    actions = [i for i, s in enumerate(labeled.steps) if s.kind in ("api", "message")]
    assert len(log) == len(actions) == 8
    assert all(labeled.steps[i].label == "good" for i in actions)
    by_step = {text_of(b["messages"][1]).split("The step:\n", 1)[1].split("\n\nAfter the step:", 1)[0]: b for b in log}
    # The click on "Place order": the cart before, the confirmation after, both as text and as screenshots.
    place = actions[6]
    before, after = source.steps[place - 1], source.steps[place + 1]
    (request,) = [b for step, b in by_step.items() if step.startswith("call click") and before.url.endswith("cart.html")
                  and f"page {after.url}" in text_of(b["messages"][1])]
    prompt = text_of(request["messages"][1])
    assert prompt.startswith("Rules the agent must follow:\nNever place an order without the customer's name.")
    assert f"Before the step:\npage {before.url}\nscreenshot: {before.screenshot.path}" in prompt
    assert f"After the step:\npage {after.url}\nscreenshot: {after.screenshot.path}" in prompt
    assert "button 'Place order'" in prompt and "Order placed" in prompt and "\nweb\n" not in prompt
    assert "customer-service" not in text_of(request["messages"][0])
    images = [p["image_url"]["url"] for p in request["messages"][1]["content"] if p.get("type") == "image_url"]
    assert [base64.b64decode(u.split(",", 1)[1]) for u in images] == [
        (shop_rollout / before.screenshot.path).read_bytes(), (shop_rollout / after.screenshot.path).read_bytes()]
    # The final answer has a page before it and a text after it: one screenshot.
    assert summary.counts["judge_screenshots_shown"] == 2 * 7 + 1 and summary.counts["policy_config"] == 1


def test_step_verify_without_vision_falls_back_to_text_with_a_warning(shop_rollout: Path, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trajforge.filters"):
        summary, log = _verify(shop_rollout, tmp_path / "out")
    assert all(isinstance(b["messages"][1]["content"], str) for b in log)
    assert summary.counts["judge_screenshots_text_only"] == 15 and "judge_screenshots_shown" not in summary.counts
    # The browser has no policy of its own: the rules are the agent's system prompt, recorded in the trajectory.
    assert summary.counts["policy_system"] == 1
    warnings = [r.getMessage() for r in caplog.records if "judge.vision is off" in r.getMessage()]
    assert len(warnings) == 1
