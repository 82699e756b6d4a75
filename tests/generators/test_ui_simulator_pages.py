"""ui_simulator on real pages, the way users run it (`generators.runner.generate`), with scripted answers from the
fake OpenAI-compatible server: exploration of the shipped shop in Chromium (real elements clicked and typed into),
proposals written from those pages, rollouts, the judge, relabelling, Grow by success rate; the real pages recorded
to a state store; then the simulated web env seeded from that store (retrieval of real states)."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from backends.fake_server import FakeServer, Rule
from envs.base import Task
from envs.registry import make_env
from envs.simulated.real_states import load_real_states
from generators.page_walk import exploring_actions
from generators.runner import generate, load_config
from schemas.models import WebObservation
from schemas.store import Dataset
from tests.conftest import REPO
from envs.browser.solvers import parse_axtree
from tests.generators._browser_agent import ORDER_SOCKS, bid, call, first_user, next_move, text_of

SHOP = REPO / "samples" / "sites" / "tiny-shop"
LLM = {"backend": "openai", "model": "fake-model", "api_key_env": None, "max_retries": 0, "request_timeout_s": 20}
BROWSER = {"step_timeout_s": 20, "action_timeout_s": 3}
SOCKS = "Order two pairs of red socks as Ada."
HAT = "Find the price of the blue hat."
SCARF = "Find the price of the green scarf."
PRICES = {HAT: ("Blue hat", "12.00"), SCARF: ("Green scarf", "9.00")}


def _attempt(body: dict[str, Any]) -> int:
    """Attempt k is the agent's draw k - 1: its own sampling seed (the run's seed is 0)."""
    return int(body.get("seed") or 0) + 1


def shop_agent(body: dict[str, Any]) -> Any:
    """Orders socks; looks a price up (its second attempt answers a wrong price)."""
    task = first_user(body)
    if task == SOCKS:
        return next_move(body, ORDER_SOCKS)
    product, price = PRICES[task]
    wrong = task == HAT and _attempt(body) == 2
    return next_move(body, [lambda p: call("click", bid=bid(p, "link", product)),
                            lambda p: f"It costs {'99.00' if wrong else price}."])


GUIDES = ["Look at the red socks.", "Put two pairs of red socks in the cart."]
EXPLORE = [  # the teacher's actions under the guides, on the page the request shows
    lambda p: ("The shop lists Red socks.", call("click", bid=bid(p, "link", "Red socks")), "Open the red socks."),
    lambda p: ("A quantity box.", call("select_option", bid=bid(p, "combobox", "Quantity"), options="2"),
               "Choose two pairs."),
    lambda p: ("The add button.", call("click", bid=bid(p, "button", "Add to cart")), "Add them to the cart."),
]


def shop_explorer(prompt: str) -> Any:
    """The teacher's step-wise task control and its actions on the real pages."""
    done = prompt.count("\n", prompt.index("Steps so far:\n"), prompt.index("\n\n", prompt.index("Steps so far:\n")))
    steps = 0 if "(none yet)" in prompt.split("Steps so far:\n", 1)[1].split("\n\n", 1)[0] else done
    if prompt.startswith("TASK CONTROL"):
        return {"completed": steps == 1, "guide": GUIDES[0] if steps < 1 else GUIDES[1]}
    page = parse_axtree(prompt.split("Current page:\n", 1)[1].split("\n", 1)[1])
    thought, action, summary = EXPLORE[steps](page)
    return {"thought": thought, "action": {"tool": action.name, "arguments": action.arguments}, "summary": summary}


def shop_model(body: dict[str, Any]) -> Any:
    if body.get("tools"):
        return shop_agent(body)
    prompt = first_user(body)
    if prompt.startswith(("TASK CONTROL", "EXPLORE STEP")):
        return shop_explorer(prompt)
    if prompt.startswith("PROPOSE TASKS"):
        return {"tasks": [{"instruction": SOCKS, "expected_outcome": "an order of 2 red socks for Ada"},
                          {"instruction": HAT, "expected_outcome": "the answer says 12.00"}]}
    if prompt.startswith("JUDGE TASK COMPLETION"):
        task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
        transcript = prompt.split("Transcript:", 1)[1]
        answer = transcript.rsplit("AGENT:", 1)[-1]
        ok = ("Order placed" in transcript and "Red socks x 2" in transcript) if task == SOCKS \
            else PRICES[task][1] in answer
        return {"reasoning": "the pages show it" if ok else "wrong outcome", "success": ok}
    if prompt.startswith("REWRITE INSTRUCTION"):
        task = prompt.split("Original task: ", 1)[1].split("\n", 1)[0]
        n = int(prompt.split("Agent steps: ", 1)[1].split("\n", 1)[0])
        if "Order placed" in prompt.split("Transcript:", 1)[1]:
            return {"instruction": "Place an order of two red socks for Ada.",
                    "thoughts": [f"To order the socks for Ada, step {i + 1}." for i in range(n)]}
        product = PRICES[task][0].lower()
        return {"instruction": f"Tell me what the {product} costs.",
                "thoughts": [f"To learn what the {product} costs, step {i + 1}." for i in range(n)]}
    if prompt.startswith("GROW TASK VARIANTS"):
        return {"variants": [{"instruction": SCARF, "expected_outcome": "the answer says 9.00", "direction": "easier"}]}
    return None


def _run(config: dict[str, Any], out: Path, model: Any) -> tuple[Any, list[dict[str, Any]]]:
    with FakeServer(rules=[Rule(fn=model)]) as server:
        judge = {"llm": {**LLM, "base_url": server.base_url, "model": "fake-judge"}, "vision": True}
        summary = asyncio.run(generate(load_config({**config, "llm": {**LLM, "base_url": server.base_url},
                                                    "judge": judge}), out))
        return summary, [e["body"] for e in server.log if "body" in e]


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ui-simulator-browser") / "out"
    config = {"method": "ui_simulator", "loop": "propose", "env": "browser", "env_config": {"site_dir": str(SHOP), **BROWSER},
              "rounds": 1, "tasks_per_round": 2, "walk_steps": 3, "attempts": 4, "max_failures": 4, "max_steps": 10,
              "grow": True, "variants_per_task": 1, "concurrency": 1}
    summary, log = _run(config, out, shop_model)
    ds = Dataset.open(out)
    return {"out": out, "summary": summary, "log": log, "kept": {t.id: t for t in ds.iter_records()},
            "filtered": list(ds.iter_records("filtered")), "quarantined": list(ds.iter_records("quarantine"))}


def _states(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "real_states.jsonl").read_text().splitlines()]


def test_exploration_walks_real_pages_and_the_proposer_sees_them(shop: dict[str, Any]) -> None:
    assert not shop["quarantined"]
    (propose,) = [b for b in shop["log"] if first_user(b).startswith("PROPOSE TASKS")]
    prompt = first_user(propose)
    first = next(t for t in shop["kept"].values() if t.details["task"]["depth"] == 0)
    walk = first.details["walk"]
    # The start page and the pages three of the teacher's actions led to (real elements, under two guides).
    assert len(walk) == 4 and re.fullmatch(r"http://[a-z0-9-]+\.localhost/", walk[0])  # the served copy, no port
    for i, url in enumerate(walk, 1):
        assert f"Page {i}: {url}\n" in prompt
    assert "RootWebArea 'Tiny Shop'" in prompt and "[16] link 'Red socks'" in prompt
    assert re.findall(r"\(reached by: (click|type|select) ", prompt) == ["click", "select", "click"]
    assert first.details["explore"]["guides"] == [
        {"guide": GUIDES[0], "steps": ["Open the red socks."]},
        {"guide": GUIDES[1], "steps": ["Choose two pairs.", "Add them to the cart."]}]
    assert f"- {GUIDES[1]}: Choose two pairs.; Add them to the cart." in prompt
    walked = [s for s in _states(shop["out"]) if s["source"] == "walk"]
    assert [s["url"] for s in walked] == walk and walked[0]["action"] is None
    assert all(s["action_text"] in prompt for s in walked[1:])


def test_proposals_are_rolled_out_judged_and_relabelled_on_real_pages(shop: dict[str, Any]) -> None:
    kept, out = shop["kept"], shop["out"]
    socks = [t for t in kept.values() if t.details["original_instruction"] == SOCKS]
    assert len(socks) == 4 and all(t.success and t.reward == 1.0 for t in socks)
    for t in socks:
        # The first user step is the instruction rewritten from what the trajectory did; the original is kept.
        assert t.steps[1].source == "user" and t.steps[1].content == "Place an order of two red socks for Ada."
        # So is each action's thought, rewritten toward it.
        thoughts = [s.thought for s in t.steps if s.kind in ("api", "message")]
        assert thoughts == [f"To order the socks for Ada, step {i + 1}." for i in range(len(thoughts))]
        assert t.details["rewritten_instruction"] == t.steps[1].content
        assert t.details["judge"] == {"reasoning": "the pages show it", "success": True}
        pages = [s for s in t.steps if isinstance(s, WebObservation)]
        assert pages[-1].url.endswith("thanks.html?name=Ada") and "Red socks x 2" in pages[-1].axtree
        for page in pages:
            with Image.open(out / page.screenshot.path) as image:
                assert image.format == "PNG"
    # The judge (a model of its own, judge.vision) and the relabeller read each page with its URL; the judge also
    # saw every page's screenshot, in order.
    judged = [b for b in shop["log"] if first_user(b).startswith("JUDGE TASK COMPLETION")
              and f"Task: {SOCKS}" in first_user(b)]
    assert judged and all(b["model"] == "fake-judge" for b in judged)
    assert all(re.search(r"\n {4}SEEN: page http://\S+/thanks\.html\?name=Ada\n", first_user(b)) for b in judged)
    for body in judged:
        images = [p for p in body["messages"][1]["content"] if p.get("type") == "image_url"]
        assert len(images) == min(8, first_user(body).count("SEEN: page ")) > 1
    hats = {t.details["attempt"] for t in kept.values() if t.details["original_instruction"] == HAT}
    assert hats == {0, 2, 3}
    assert kept["ui_simulator/round-0000/t1#0"].steps[1].content == "Tell me what the blue hat costs."
    (wrong,) = shop["filtered"]
    assert wrong.record.id == "ui_simulator/round-0000/t1#1" and wrong.decision.reason == "unsuccessful: wrong outcome"


def test_grow_on_the_browser_falls_back_to_the_success_rate(shop: dict[str, Any]) -> None:
    c = shop["summary"].counts
    # The price task (3 of 4) lies in the band; the order (4 of 4) does not.
    assert c["grow_fallback"] == 1 and c["grow_selected_by_success_rate"] == 1 and c["outside_band"] == 1
    variants = [t for t in shop["kept"].values() if t.details["task"]["depth"] == 1]
    assert len(variants) == 4 and all(t.details["original_instruction"] == SCARF for t in variants)
    for t in variants:
        assert t.provenance.parent_ids == ["round-0000/t1"] and t.details["grow"]["success_rate"] == 0.75
        assert t.steps[1].content == "Tell me what the green scarf costs."
        assert re.fullmatch(r"http://[a-z0-9-]+\.localhost/", t.steps[2].url)


def test_the_real_pages_are_recorded_to_a_state_store(shop: dict[str, Any]) -> None:
    out, states = shop["out"], _states(shop["out"])
    assert len({s["id"] for s in states}) == len(states) == shop["summary"].counts["real_states"]
    placed = [s for s in states if s["action_text"] == "click button 'Place order'" and s["source"] == "rollout"]
    assert placed and placed[0]["title"] == "Order placed - Tiny Shop"
    assert placed[0]["from_url"].endswith("/cart.html") and placed[0]["url"].endswith("/thanks.html?name=Ada")
    assert any(s["action_text"] == "click link 'Blue hat'" and s["url"].endswith("product.html?sku=hat")
               for s in states)
    assert all((out / s["screenshot"]).is_file() for s in states)
    # The dataset directory reads as the same states (its trajectories' pages), without the walk.
    from_dataset = load_real_states(out)
    assert {(s.url, s.action_text) for s in from_dataset.states} <= {(s["url"], s["action_text"]) for s in states}


def test_the_walk_fills_forms_with_plausible_text_the_real_page_accepts() -> None:
    """On the shop's contact form the walk would type an address, choose a topic and write a message; done in
    Chromium, the form's own validation (an email field, required fields) accepts them and sends."""

    async def fill() -> tuple[dict[str, Any], WebObservation]:
        async with make_env("browser", site_dir=str(SHOP), observe=["axtree"], **BROWSER) as env:
            (_, page) = await env.reset(Task(id="contact", env="browser", instruction="x",
                                             params={"start_url": "contact.html"}))
            actions = {e.name: a for e, a in exploring_actions(page, env.tools(), random.Random(0))}
            for name in ("Your email", "Topic", "Message", "Send"):
                assert not (await env.step(actions[name])).info.get("error")
            return actions, env.history[-1]

    actions, sent = asyncio.run(fill())
    assert sorted(actions) == ["Back to the shop", "Message", "Send", "Topic", "Your email"]
    assert actions["Your email"].function == "type" and "@example." in actions["Your email"].arguments["text"]
    assert actions["Topic"].function == "select_option" and actions["Topic"].arguments["options"] in (
        "Order", "Returns", "Other")
    assert actions["Message"].function == "type" and len(actions["Message"].arguments["text"].split()) > 3
    assert actions["Send"].function == "click" and actions["Back to the shop"].function == "click"
    assert sent.url.split("?")[0].endswith("/sent.html")
    assert f"We will answer {actions['Your email'].arguments['text']}" in sent.axtree


# ---- the simulated web env seeded from the recorded real states ------------------------------------


def seeded_simulator(body: dict[str, Any]) -> Any:
    """The simulator writes back the real page retrieved first; the agent looks up the hat's price."""
    prompt = first_user(body)
    if body.get("tools"):
        return next_move(body, [lambda p: call("click", bid=bid(p, "link", "Blue hat")), lambda p: "It costs 12.00."])
    if prompt.startswith("SIMULATE PAGE"):
        found = re.search(r"\nReal page 1: on \S+ \(.*?\), .*? -> (\S+)\n(.*?)(?:\n\nReal page 2:|\Z)", prompt, re.S)
        assert found, prompt
        return {"url": found.group(1), "axtree": found.group(2), "done": False}
    if prompt.startswith("PROPOSE TASKS"):
        return {"tasks": [{"instruction": HAT, "expected_outcome": "the answer says 12.00"}]}
    if prompt.startswith("JUDGE TASK COMPLETION"):
        return {"reasoning": "it says 12.00", "success": "12.00" in prompt.split("Transcript:", 1)[1]}
    if prompt.startswith("REWRITE INSTRUCTION"):
        n = int(prompt.split("Agent steps: ", 1)[1].split("\n", 1)[0])
        return {"instruction": "Tell me what the blue hat costs.", "thoughts": ["Look the hat up."] * n}
    return None


def test_ui_simulator_in_the_simulated_env_seeded_from_recorded_real_states(shop: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    states = shop["out"] / "real_states.jsonl"
    config = {"method": "ui_simulator", "loop": "propose", "env": "simulated",
              "env_config": {"mode": "web", "policy": "Tiny Shop, a small web shop.", "real_states": str(states)},
              "rounds": 1, "tasks_per_round": 1, "walk_steps": 2, "explore": "random", "attempts": 1, "max_steps": 4}
    summary, log = _run(config, tmp_path / "out", seeded_simulator)
    (traj,) = Dataset.open(tmp_path / "out").iter_records()
    recorded = _states(shop["out"])
    entry = next(s for s in recorded if s["action"] is None)
    # The episode starts on the real entry page (no model writes it); the simulated pages copy real ones.
    assert not [b for b in log if first_user(b).startswith("SIMULATE START PAGE")]
    assert traj.steps[2].url == entry["url"] and traj.steps[2].axtree == entry["axtree"]
    assert traj.success and traj.steps[1].content == "Tell me what the blue hat costs."
    hat = next(s for s in recorded if s["action_text"] == "click link 'Blue hat'")
    (page,) = [s for s in traj.steps if isinstance(s, WebObservation) and s.url.endswith("sku=hat")]
    assert page.axtree == hat["axtree"]
    # The agent's click: the prompt names its target and carries the recorded page that click led to, first.
    simulated = [b for b in log if first_user(b).startswith("SIMULATE PAGE")]
    agent_step = next(b for b in simulated if "Find the price of the blue hat" in first_user(b))
    prompt = first_user(agent_step)
    assert ": click link 'Blue hat'\n" in prompt
    assert f"Real page 1: on {hat['from_url']} (Tiny Shop), click link 'Blue hat' -> {hat['url']}\n" \
           f"{hat['axtree']}" in prompt
    assert "exactly in the format of the real pages" in text_of(agent_step["messages"][0])
    # A simulated world's pages are not recorded as real ones.
    assert not (tmp_path / "out" / "real_states.jsonl").exists() and "real_states" not in summary.counts


def test_the_browser_needs_a_page_to_explore_from_and_its_accessibility_tree() -> None:
    base = {"method": "ui_simulator", "env": "browser", "llm": LLM}
    with pytest.raises(ValueError, match="explores from start_urls .* or from the tasks of a task source"):
        load_config(base)
    with pytest.raises(ValueError, match="keep axtree in env_config.observe"):
        load_config({**base, "env_config": {"site_dir": str(SHOP), "observe": ["html"]}})
    assert load_config({**base, "env_config": {"site_dir": str(SHOP)}}).start_urls == ["/"]
