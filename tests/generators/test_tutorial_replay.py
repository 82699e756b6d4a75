"""tutorial_replay (AgentTrek) on real pages: the shipped tutorials replayed in Chromium on the shipped shop
and on MiniWoB++ pages, with scripted answers from the fake OpenAI-compatible server; the decoys are dropped
with their reasons. Plus the start-page rules, the config's refusals and the simulated web env."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule
from generators.runner import generate, load_config
from generators.tutorial_replay import TutorialReplay, TutorialSite, load_tutorials, start_page
from schemas.store import Dataset
from tests.conftest import REPO
from tests.generators._browser_agent import LOGIN, ORDER_SOCKS, Move, bid, call, first_user, next_move, text_of
from tests.generators._leaks import leaks

CONFIG = REPO / "configs" / "tutorial_replay.yaml"
TUTORIALS = REPO / "samples" / "tutorials"
SHOP = REPO / "samples" / "sites" / "tiny-shop"
SITES = [
    {"name": "tiny-shop", "description": "Tiny Shop, a small web shop", "url": "index.html",
     "hosts": ["tinyshop.example"]},
    {"name": "miniwob", "description": "MiniWoB++ task pages", "miniwob": True},
]
REAL = ["miniwob-enter-text", "miniwob-login-form", "tiny-shop-contact-support", "tiny-shop-find-a-price",
        "tiny-shop-order-socks"]
DECOYS = ["github-reset-password", "sourdough-bread", "tiny-shop-spring-news", "tomato-gardening"]

CLASSES = {
    "tiny-shop-order-socks": {"is_tutorial": True, "site": "tiny-shop", "reason": "an ordering how-to for Tiny Shop"},
    "tiny-shop-find-a-price": {"is_tutorial": True, "site": "tiny-shop", "reason": "a search how-to for Tiny Shop"},
    "tiny-shop-contact-support": {"is_tutorial": True, "site": "tiny-shop", "reason": "a contact-form how-to"},
    "miniwob-login-form": {"is_tutorial": True, "site": "miniwob", "reason": "the login-user page"},
    "miniwob-enter-text": {"is_tutorial": True, "site": "miniwob", "reason": "the enter-text page"},
    "tiny-shop-spring-news": {"is_tutorial": False, "site": "tiny-shop", "reason": "a shop announcement, not a how-to"},
    "github-reset-password": {"is_tutorial": True, "site": "none", "reason": "a GitHub how-to; GitHub is not served"},
}
SPECS = {
    "tiny-shop-order-socks": {"start_url": "index.html", "goal": "Order two pairs of red socks from Tiny Shop as Ada.",
                              "steps": ["Click Red socks.", "Set Quantity to 2 and click Add to cart.",
                                        "Go to the cart, type Ada as the name, accept the terms, place the order."],
                              "expected_outcome": "An Order placed page listing Red socks x 2."},
    "tiny-shop-find-a-price": {"start_url": "https://tinyshop.example/index.html",
                               "goal": "What does the green scarf cost at Tiny Shop? Use the search.",
                               "steps": ["Type scarf into Search and press Enter.", "Read the price."],
                               "expected_outcome": "The scarf's price, 9.00."},
    "tiny-shop-contact-support": {"start_url": "contact.html",
                                  "goal": "Ask Tiny Shop, from ada@example.com, to take back the blue hat: too small.",
                                  "steps": ["Type the email.", "Select Returns as the topic.", "Write the message.",
                                            "Click Send."],
                                  "expected_outcome": "A Message sent page about Returns."},
    "miniwob-login-form": {"start_url": "login-user", "goal": "Sign in with the username and password the page gives.",
                           "steps": ["Type the username.", "Type the password.", "Click Login."],
                           "expected_outcome": "The page accepts the sign-in."},
    "miniwob-enter-text": {"start_url": "miniwob/enter-text.html",
                           "goal": "Type the word the page asks for into the text field and submit it.",
                           "steps": ["Type the word.", "Click Submit."], "expected_outcome": "The page accepts it."},
}
GOALS = {spec["goal"]: tid for tid, spec in SPECS.items()}


# Per tutorial: the scripted agent's moves, one per action taken (the last answers the user).
AGENT: dict[str, list[Move]] = {
    "tiny-shop-order-socks": ORDER_SOCKS,
    "tiny-shop-find-a-price": [
        lambda p: call("type", bid=bid(p, "textbox", "Search"), text="scarf", press_enter=True),
        lambda p: call("send_msg_to_user", text="The green scarf costs 9.00."),
    ],
    # This agent forgets to choose the topic: the judge sees "Order" on the final page and says so.
    "tiny-shop-contact-support": [
        lambda p: call("type", bid=bid(p, "textbox", "Your email"), text="ada@example.com"),
        lambda p: call("type", bid=bid(p, "textbox", "Message"), text="Please take back the blue hat: too small."),
        lambda p: call("click", bid=bid(p, "button", "Send")),
        lambda p: "Sent.",
    ],
    "miniwob-login-form": LOGIN,
    # This agent types a wrong word: the page's reward says it failed, the (lenient) judge does not.
    "miniwob-enter-text": [
        lambda p: call("type", bid=bid(p, "textbox"), text="wrong"),
        lambda p: call("click", bid=bid(p, "button", "Submit")),
    ],
}


def _judge(prompt: str) -> dict[str, Any]:
    task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
    page = prompt.split("# Final page\n", 1)[1]
    answer = prompt.split("# Final answer of the agent\n", 1)[1].split("\n", 1)[0]
    tid = GOALS[task]
    if tid == "tiny-shop-order-socks":
        ok = "Order placed" in page and "Red socks x 2" in page
    elif tid == "tiny-shop-find-a-price":
        ok = "9.00" in answer
    elif tid == "tiny-shop-contact-support":
        ok = 'about "Returns"' in page
    else:
        ok = True
    return {"reason": f"the final page {'shows' if ok else 'does not show'} the expected outcome", "success": ok}


class Script:
    """Every request the pipeline makes: classifier, spec writer, agent turns, judge."""

    def __init__(self) -> None:
        self.titles = {t["title"]: t["id"] for t in load_tutorials([str(TUTORIALS)])}

    def __call__(self, body: dict[str, Any]) -> Any:
        first = first_user(body)
        if first.startswith("CLASSIFY THIS TEXT"):
            return CLASSES[self.titles[first.split("Title: ", 1)[1].split("\n", 1)[0]]]
        if first.startswith("WRITE THE TASK SPEC"):
            return SPECS[self.titles[first.split("Title: ", 1)[1].split("\n", 1)[0]]]
        if first.startswith("JUDGE THIS REPLAY"):
            return _judge(first)
        if body.get("tools"):
            return next_move(body, AGENT[GOALS[first]])
        return None


def _llm(base_url: str, model: str = "fake-model") -> dict[str, Any]:
    return {"backend": "openai", "base_url": base_url, "model": model, "api_key_env": None, "max_retries": 0,
            "request_timeout_s": 20}


def _config(base_url: str, tutorials: list[str], **extra: Any) -> dict[str, Any]:
    return {"method": "tutorial_replay", "tutorials": tutorials, "sites": SITES, "env": "browser",
            "env_config": {"site_dir": str(SHOP), "step_timeout_s": 20, "action_timeout_s": 3},
            "llm": _llm(base_url), "judge": {"llm": _llm(base_url, "fake-judge"), "vision": True},
            "concurrency": 2, "unit_tasks": 3, "max_steps": 10, **extra}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The shipped tutorials with the shipped config, through `trajforge generate` (models: the fake server)."""
    from flows.cli import app

    root = tmp_path_factory.mktemp("tutorial-replay")
    config = yaml.safe_load(CONFIG.read_text())
    with FakeServer(rules=[Rule(fn=Script())]) as server:
        config.update(llm=_llm(server.base_url), judge={"llm": _llm(server.base_url, "fake-judge"), "vision": True},
                      tutorials=[str(TUTORIALS)], max_steps=10)
        config["env_config"].update(site_dir=str(SHOP), step_timeout_s=20, action_timeout_s=3)
        config["sites"][0]["hosts"] = ["tinyshop.example"]
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        cli = CliRunner().invoke(app, ["generate", "--method", "tutorial_replay", "--config", str(root / "config.yaml"),
                                       "--output", str(root / "out")], terminal_width=240)
        log = [e["body"] for e in server.log if "body" in e]
    assert cli.exit_code == 0, cli.output
    ds = Dataset.open(root / "out")
    return {"out": root / "out", "output": cli.output, "counts": ds.unit_counts(), "log": log,
            "kept": {t.details["tutorial"]["id"]: t for t in ds.iter_records()},
            "filtered": {f.record.details["tutorial"]["id"]: f for f in ds.iter_records("filtered")},
            "quarantined": list(ds.iter_records("quarantine"))}


def test_every_tutorial_is_kept_or_filtered_with_a_reason(run: dict[str, Any]) -> None:
    kept, filtered = run["kept"], run["filtered"]
    assert not run["quarantined"], [q.error for q in run["quarantined"]]
    assert sorted(kept) == ["miniwob-login-form", "tiny-shop-find-a-price", "tiny-shop-order-socks"]
    assert sorted([*kept, *filtered]) == sorted(REAL + DECOYS)
    reasons = {tid: (f.decision.filter, f.decision.reason) for tid, f in filtered.items()}
    # The decoys, each at the stage that should catch it.
    assert reasons["tomato-gardening"] == ("prefilter", "no keyword: none of the prefilter's keywords appears")
    assert reasons["sourdough-bread"][0] == "prefilter"
    assert reasons["tiny-shop-spring-news"] == ("classifier", "not a tutorial: a shop announcement, not a how-to")
    assert reasons["github-reset-password"] == ("classifier", "site not served: a GitHub how-to; GitHub is not served")
    # Replays that failed: by the judge's reason (no check of its own), by the page's reward (MiniWoB).
    assert reasons["tiny-shop-contact-support"] == (
        "outcome", "unsuccessful: the final page does not show the expected outcome")
    what, why = reasons["miniwob-enter-text"]
    assert what == "outcome" and why.startswith("unsuccessful: MiniWoB reward -1") and "(judge: the final page shows" in why
    counts = run["counts"]
    assert counts["tasks"] == 9 and counts["replay_success"] == 3 and counts["replay_failure"] == 2
    assert counts["judge_agrees_with_env"] == 1 and counts["judge_disagrees_with_env"] == 1
    printed = " ".join(run["output"].replace("│", " ").split())
    assert "prefilter: no keyword 2" in printed and "outcome: unsuccessful 2" in printed
    # The prefilter's drops cost no model call.
    classified = [text_of(b["messages"][1]) for b in run["log"] if text_of(b["messages"][1]).startswith("CLASSIFY")]
    assert len(classified) == 7 and not any("balcony" in c or "sourdough" in c for c in classified)


def test_kept_trajectories_start_with_their_tutorials_goal(run: dict[str, Any]) -> None:
    tutorials = {t["id"]: t for t in load_tutorials([str(TUTORIALS)])}
    agent_requests = [b for b in run["log"] if b.get("tools")]
    spec_requests = [b for b in run["log"] if text_of(b["messages"][1]).startswith("WRITE THE TASK SPEC")]
    for tid, traj in run["kept"].items():
        goal = SPECS[tid]["goal"]
        # The spec writer read this tutorial; its goal is the episode's first user turn.
        assert any(tutorials[tid]["text"] in text_of(b["messages"][1]) for b in spec_requests)
        assert traj.steps[1].kind == "text" and traj.steps[1].source == "user" and traj.steps[1].content == goal
        assert traj.steps[2].kind == "web" and traj.id == f"tutorial_replay/{tid}#0"
        assert traj.details["spec"]["goal"] == goal and traj.details["tutorial"]["title"] == tutorials[tid]["title"]
        assert traj.provenance.task_id == tid and traj.success is True
        # The agent was asked with the goal as the user's request and the spec's steps in its system prompt.
        mine = [b for b in agent_requests if text_of(b["messages"][1]) == goal]
        assert mine and all(step in mine[0]["messages"][0]["content"] for step in SPECS[tid]["steps"])
        assert "Follow it step by step" in mine[0]["messages"][0]["content"]
        # The trained agent acts from the goal alone: the record's system prompt has no tutorial step; the one the
        # agent replayed with is kept, and every action is declared answered to that other prompt.
        assert traj.steps[0].name == "system" and "Follow it step by step" not in traj.steps[0].content
        assert not any(step in traj.steps[0].content for step in SPECS[tid]["steps"])
        assert traj.details["replay_prompt"] == mine[0]["messages"][0]["content"]
        assert traj.details["train_prompt"] == "goal"
        assert traj.details["rewrites"] == [{"steps": [i for i, s in enumerate(traj.steps) if s.kind in ("api", "message")],
                                             "kind": "context", "reason": traj.details["rewrites"][0]["reason"]}]
    socks = run["kept"]["tiny-shop-order-socks"]
    assert socks.steps[-2].kind == "message" and "Order placed" in socks.steps[-3].axtree
    assert socks.details["success_source"] == "judge" and socks.details["judge"]["model"] == "openai:fake-judge"
    # A public URL of the site opened the served copy.
    price = run["kept"]["tiny-shop-find-a-price"]
    assert price.details["spec"]["start"] == {"start_url": "/index.html"}
    assert re.match(r"http://[a-z0-9-]+\.localhost/index\.html$", price.steps[2].url)  # no port: the same each run
    login = run["kept"]["miniwob-login-form"]
    assert login.details["spec"]["start"] == {"miniwob": "login-user"} and login.details["success_source"] == "env"
    assert login.reward == 1.0 and login.details["evaluation"]["reason"].startswith("MiniWoB reward +1")
    assert login.details["judge"]["agrees_with_env"] is True


def test_the_judge_sees_the_whole_replay_with_its_screenshots(run: dict[str, Any]) -> None:
    """AgentTrek's evaluator reads the replayed trajectory, not only where it ended: every step with the page it
    led to, and (judge.vision) every page's screenshot in order."""
    judged = [b for b in run["log"] if text_of(b["messages"][1]).startswith("JUDGE THIS REPLAY")]
    assert len(judged) == 5 and all(b["model"] == "fake-judge" for b in judged)
    socks = run["kept"]["tiny-shop-order-socks"]
    pages = [s for s in socks.steps if s.kind == "web"]
    final = pages[-1]
    (request,) = [b for b in judged if SPECS["tiny-shop-order-socks"]["goal"] in text_of(b["messages"][1])]
    prompt = text_of(request["messages"][1])
    assert 'AGENT: call select_option({"bid":' in prompt and "thanks.html?name=Ada" in prompt
    assert f"page {final.url}" in prompt and f"screenshot: {final.screenshot.path}" in prompt
    # The pages on the way, each as it looked after its step (the product page with its quantity box, the cart).
    for page in pages[1:-1]:
        assert f"SEEN: page {page.url}" in prompt and f"screenshot: {page.screenshot.path}" in prompt
    assert "Quantity" in prompt.split("# Final page")[0]
    # judge.vision: every page's screenshot went along, in order, the very files the record points to.
    images = [p for p in request["messages"][1]["content"] if p.get("type") == "image_url"]
    assert len(images) == len(pages) > 2
    for image, page in zip(images, pages):
        data = base64.b64decode(image["image_url"]["url"].split(",", 1)[1])
        assert data == (run["out"] / page.screenshot.path).read_bytes() and data.startswith(b"\x89PNG")
    assert run["counts"]["judge_screenshots_shown"] > 5


def test_start_pages_resolve_against_the_site() -> None:
    shop = TutorialSite(name="shop", description="a shop", url="index.html", hosts=["Shop.Example"])
    assert start_page(shop, "") == ({"start_url": "index.html"}, "")
    assert start_page(shop, "cart.html?x=1") == ({"start_url": "cart.html?x=1"}, "")
    assert start_page(shop, "https://shop.example/cart.html#top") == ({"start_url": "/cart.html#top"}, "")
    assert start_page(shop, "https://github.com/login")[1] == "start_url 'https://github.com/login' is not on site shop"
    assert "is not a web page" in start_page(shop, "file:///etc/passwd")[1]
    remote = TutorialSite(name="app", description="an app", url="http://127.0.0.1:8000/app/", hosts=["app.example"])
    assert start_page(remote, "settings") == ({"start_url": "http://127.0.0.1:8000/app/settings"}, "")
    assert start_page(remote, "http://127.0.0.1:8000/x") == ({"start_url": "http://127.0.0.1:8000/x"}, "")
    assert start_page(remote, "https://app.example/a?b=1") == ({"start_url": "http://127.0.0.1:8000/a?b=1"}, "")
    wob = TutorialSite(name="wob", description="MiniWoB", miniwob=True)
    assert start_page(wob, "http://x/miniwob/click-test.html") == ({"miniwob": "click-test"}, "")
    assert start_page(wob, "book-a-spaceship")[1].startswith("no MiniWoB++ task page 'book-a-spaceship'")


def test_config_refusals() -> None:
    base = {"method": "tutorial_replay", "sites": SITES[:1], "env_config": {"site_dir": str(SHOP)}}
    load_config(base)  # the browser by default
    with pytest.raises(ValueError, match="needs web pages to explore; environment 'retail'"):
        load_config({**base, "env": "retail", "env_config": {}})
    with pytest.raises(ValueError, match="MiniWoB\\+\\+ pages need env: browser"):
        load_config({**base, "env": "web", "env_config": {}, "sites": SITES})
    with pytest.raises(ValueError, match="its pages are relative"):
        load_config({**base, "env_config": {}})
    with pytest.raises(ValueError, match="duplicate names"):
        load_config({**base, "sites": [SITES[0], SITES[0]]})
    with pytest.raises(ValueError, match="may not be named 'none'"):
        load_config({**base, "sites": [{"name": "none", "description": "x"}]})
    with pytest.raises(ValueError, match="sites"):
        load_config({"method": "tutorial_replay", "env_config": {"site_dir": str(SHOP)}})
    method = TutorialReplay(load_config(base), llm=None)
    assert method.prefilter("Click the Search button, then type a word") == ["click", "button", "type", "search"]
    assert method.prefilter("A prototype of clickable buttons") == []  # whole words only


def test_replay_in_the_simulated_web_env(tmp_path: Path) -> None:
    """The simulated web env has pages too: the simulator is told the start page; the goal opens the episode."""
    tid = "tiny-shop-find-a-price"

    def script(body: dict[str, Any]) -> Any:
        first = first_user(body)
        if first.startswith("CLASSIFY THIS TEXT"):
            return CLASSES[tid]
        if first.startswith("WRITE THE TASK SPEC"):
            return {**SPECS[tid], "start_url": "/search.html?q=scarf"}
        if first.startswith("SIMULATE"):
            return {"url": "https://tinyshop.example/search.html?q=scarf", "done": False,
                    "axtree": '{"elements": [{"bid": "1", "role": "text", "name": "Green scarf costs 9.00"}]}'}
        if first.startswith("JUDGE THIS REPLAY"):
            return _judge(first)
        if body.get("tools"):
            return "The green scarf costs 9.00."
        return None

    with FakeServer(rules=[Rule(fn=script)]) as server:
        cfg = _config(server.base_url, [str(TUTORIALS / f"{tid}.md")], env="simulated",
                      env_config={"mode": "web", "policy": "Tiny Shop, a small web shop."},
                      sites=[{**SITES[0], "url": "https://tinyshop.example/"}])
        summary = asyncio.run(generate(load_config(cfg), tmp_path / "out"))
        starts = [text_of(b["messages"][1]) for b in (e["body"] for e in server.log) if
                  text_of(b["messages"][1]).startswith("SIMULATE START PAGE")]
    (traj,) = Dataset.open(tmp_path / "out").iter_records()
    assert summary.counts["replay_success"] == 1 and traj.success
    assert traj.steps[1].content == SPECS[tid]["goal"] and traj.steps[2].kind == "web"
    assert len(starts) == 1 and "https://tinyshop.example/search.html?q=scarf" in starts[0]


def test_exported_rows_of_the_shipped_replays_hold_no_tutorial_step(run: dict[str, Any], tmp_path: Path) -> None:
    """What trains is what the agent will see: the goal, not the tutorial it replayed (`train_prompt: goal`)."""
    from flows.cli import app

    exported = CliRunner().invoke(app, ["export", str(run["out"]), "--format", "trl-sft", "--output",
                                        str(tmp_path / "sft")], terminal_width=240)
    assert exported.exit_code == 0, exported.output
    rows = pq.read_table(tmp_path / "sft" / "data").to_pylist()
    assert {r["id"] for r in rows} >= {t.id for t in run["kept"].values()}
    for row in rows:
        prompt = json.dumps(row["prompt"], default=str)
        assert "Follow it step by step" not in prompt and "Steps:" not in prompt, row["id"]
        assert not any(step in prompt for spec in SPECS.values() for step in spec["steps"]), row["id"]


def test_no_trained_row_of_the_shipped_replays_holds_what_the_agent_could_not_know(run: dict[str, Any],
                                                                                     tmp_path: Path) -> None:
    """The guard of tests/generators/test_shipped_configs.py on tutorial_replay's shipped config: no trained text
    takes a span of 8 words or an id from the tutorial, the spec or the judge's reason that its prompt lacks."""
    assert leaks(run["out"], tmp_path) == []


def test_the_judge_reads_the_pages_not_the_agents_claims_and_replays_are_draws(tmp_path: Path) -> None:
    """A text-mode agent that claims success in its thoughts: the judge does not read the claim (only with
    judge.self_report); the second replay is another draw of the agent, with no attempt marker in its prompt."""
    tid = "tiny-shop-find-a-price"
    claim = "I have verified the price on the page, the task is complete."

    def script(body: dict[str, Any]) -> Any:
        first = first_user(body)
        if first.startswith("CLASSIFY THIS TEXT"):
            return CLASSES[tid]
        if first.startswith("WRITE THE TASK SPEC"):
            return {**SPECS[tid], "start_url": "/search.html?q=scarf"}
        if first.startswith("SIMULATE"):
            return {"url": "https://tinyshop.example/search.html?q=scarf", "done": False,
                    "axtree": '{"elements": [{"bid": "1", "role": "link", "name": "Green scarf"}]}'}
        if first.startswith("JUDGE THIS REPLAY"):
            return {"reason": "the page lists the scarf", "success": True}
        if "<tool_call>" in text_of(body["messages"][0]):
            if any(m["role"] == "tool" or "Observation" in text_of(m) for m in body["messages"][2:]):
                return "The green scarf costs 9.00."
            return f'{claim}\n<tool_call>{{"name": "click", "arguments": {{"bid": "1"}}}}</tool_call>'
        return None

    for self_report in (False, True):
        out = tmp_path / f"out-{self_report}"
        with FakeServer(rules=[Rule(fn=script)]) as server:
            cfg = _config(server.base_url, [str(TUTORIALS / f"{tid}.md")], env="simulated", agent_mode="text",
                          env_config={"mode": "web", "policy": "Tiny Shop, a small web shop."}, replays=2,
                          sites=[{**SITES[0], "url": "https://tinyshop.example/"}],
                          judge={"llm": _llm(server.base_url, "fake-judge"), "self_report": self_report})
            asyncio.run(generate(load_config(cfg), out))
            bodies = [e["body"] for e in server.log if "body" in e]
        judged = [first_user(b) for b in bodies if first_user(b).startswith("JUDGE THIS REPLAY")]
        assert judged and all((claim in j) == self_report for j in judged)  # the two replays read alike: one call
        assert all('call click({"bid":"1"})' in j for j in judged)  # the action itself is the world's to see
        kept = sorted(Dataset.open(out).iter_records(), key=lambda t: t.id)
        assert [t.details["judge"]["reads"] for t in kept] == ["world+self_report" if self_report else "world"] * 2
        agent = [b for b in bodies if "<tool_call>" in text_of(b["messages"][0])]
        assert {b.get("seed") for b in agent} == {0, 1}
        assert not any("Attempt" in text_of(b["messages"][0]) for b in agent)
        assert not any("Attempt" in t.steps[0].content or "Attempt" in t.details["replay_prompt"] for t in kept)


def test_thoughts_that_quote_the_tutorial_are_removed_or_the_replay_dropped(tmp_path: Path) -> None:
    """AgentTrek trains on the task, not the tutorial: a thought that repeats the tutorial word for word (which the
    goal-only rows do not hold) is removed and its action kept, declared written (`tutorial_quotes: strip`), or the
    replay is dropped with the quote (`drop`); the thought that quotes nothing stays."""
    tid = "tiny-shop-find-a-price"
    quote = "The tutorial says to click the Search box and type the product you want."
    own = "The scarf is listed, so I can read its price."

    def script(body: dict[str, Any]) -> Any:
        first = first_user(body)
        if first.startswith("CLASSIFY THIS TEXT"):
            return CLASSES[tid]
        if first.startswith("WRITE THE TASK SPEC"):
            return {**SPECS[tid], "start_url": "/search.html?q=scarf"}
        if first.startswith("SIMULATE"):
            return {"url": "https://tinyshop.example/search.html?q=scarf", "done": False,
                    "axtree": '{"elements": [{"bid": "1", "role": "link", "name": "Green scarf 9.00"}]}'}
        if first.startswith("JUDGE THIS REPLAY"):
            return {"reason": "the page lists the scarf", "success": True}
        if "<tool_call>" in text_of(body["messages"][0]):
            turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
            if turns >= 2:
                return "The green scarf costs 9.00."
            thought = quote if turns == 0 else own
            return f'{thought}\n<tool_call>{{"name": "click", "arguments": {{"bid": "1"}}}}</tool_call>'
        return None

    kept = {}
    for mode in ("strip", "drop"):
        out = tmp_path / mode
        with FakeServer(rules=[Rule(fn=script)]) as server:
            cfg = _config(server.base_url, [str(TUTORIALS / f"{tid}.md")], env="simulated", agent_mode="text",
                          env_config={"mode": "web", "policy": "Tiny Shop, a small web shop."}, tutorial_quotes=mode,
                          sites=[{**SITES[0], "url": "https://tinyshop.example/"}],
                          judge={"llm": _llm(server.base_url, "fake-judge")})
            summary = asyncio.run(generate(load_config(cfg), out))
        kept[mode] = list(Dataset.open(out).iter_records())
        if mode == "strip":
            (t,) = kept[mode]
            calls = [i for i, s in enumerate(t.steps) if s.kind == "api"]
            assert [t.steps[i].thought for i in calls] == [None, own]
            assert t.details["tutorial_quotes"] == {"stripped": [calls[0]]}
            assert {"steps": [calls[0]], "kind": "written", "reason": t.details["rewrites"][-1]["reason"]} \
                == t.details["rewrites"][-1] and calls[0] not in t.details["rewrites"][0]["steps"]
            assert summary.counts["tutorial_quotes_stripped"] == 1
        else:
            (f,) = Dataset.open(out).iter_records("filtered")
            assert not kept[mode] and f.decision.filter == "tutorial_quote"
            assert "click the search box and type the product" in f.decision.reason
