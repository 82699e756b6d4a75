"""Every method's shipped config, on its real environment, the way users run it (`trajforge envs check`,
`trajforge generate`), against the fake OpenAI-compatible server with answers scripted to exercise the method's
own logic, not only its plumbing:

- rollout (tau2 retail over MCP, a persona user): the agent solves the task by tau2's own criteria;
- mcts_splice: the judge names the failed path's wrong step, which is revised; IPR's step values come from
  rollouts of distinct draws (one solves, one gives up) and make the step pair;
- curriculum: the reward variance comes from distinct draws; the task writer's variant is verified by tau2;
- reflection: the teacher finds the wrong step of a failed search path, corrects it, and the episode succeeds;
- step_verify: the judge reads the user's request as the task (not the policy) and is measured against tau2's
  reference actions;
- self_challenging: the challenger writes under the retail policy; its task is checked and the agent's rollout
  scored by its verifier;
- simia_sft: failed episodes are no seeds; a seed keeps its own policy; its shipped chain (seeds from
  demonstrations) yields data, broken simulated users excluded and counted;
- ui_simulator (the paper's loop, as shipped): the teacher explores the simulated shop (pages written from recorded
  real ones) under guides; the wrapped explorations are the rows, judged from the pages; its PAE-style option
  (loop: propose, MiniWoB in Chromium): attempts are judged and relabelled, their thoughts rewritten;
- tutorial_replay: its shipped config runs in tests/generators/test_tutorial_replay.py (the whole replay judged).

Each config is first checked as shipped: it loads, acts in a real environment, and has a model of its own for
every role beside acting (the paper's own choices aside); the environments pass `trajforge envs check`.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from envs.browser.solvers import parse_axtree
from envs.scenario_user import CONFIRM_ASK, YES
from envs.spec import EnvFactory, EnvSpec
from flows.cli import app
from flows.agent_r_config import AgentRConfig
from filters.policy_rules import policy_violations, write_tools_of
from generators.base import role_fields
from generators.registry import all_methods, get_method
from generators.runner import load_config
from schemas.models import ApiAction, MessageAction, Trajectory
from schemas.store import Dataset
from tests.conftest import REPO
from tests.generators._browser_agent import LOGIN, bid, call, first_user
from tests.generators._generic_model import GIVE_UP, GenericModel, _as_text, _from_text
from tests.generators._leaks import leaks

CONFIGS = REPO / "configs"
SHIPPED = {"rollout": "mcp_tau2_retail.yaml", "demonstrations": "demonstrations.yaml", "mcts_splice": "mcts_splice.yaml", "curriculum": "curriculum.yaml",
           "reflection": "reflection.yaml", "step_verify": "step_verify.yaml", "self_challenging": "self_challenging.yaml",
           "simia_sft": "simia_sft.yaml", "ui_simulator": "ui_simulator.yaml", "tutorial_replay": "tutorial_replay.yaml"}
TASK = "tau2-retail-0"
WORLD_KEYS = ("env", "env_config", "tasks")
runner = CliRunner()

# The challenge the scripted challenger writes on tau2: a cancellation read back through the order's details.
CANCEL = "Cancel my pending order #W4776164, I no longer need it. I'm Yusuf Rossi, zip 19122."
CANCEL_CALL = {"name": "cancel_pending_order", "arguments": {"order_id": "#W4776164", "reason": "no longer needed"}}
CHALLENGE = {"instruction": CANCEL, "verifier": "def verify(state):\n    return 'cancelled' in str(state[0])\n",
             "solution": [CANCEL_CALL],
             "state_calls": [{"name": "get_order_details", "arguments": {"order_id": "#W4776164"}}],
             "failure_cases": [[], [{"name": "get_order_details", "arguments": {"order_id": "#W4776164"}}],
                               [{"name": "get_user_details", "arguments": {"user_id": "yusuf_rossi_9620"}}]]}
LOGIN_TASK = "Sign in with the username and password the page gives."


def _shipped(name: str) -> dict[str, Any]:
    return yaml.safe_load((CONFIGS / name).read_text())


def _world(data: dict[str, Any]) -> dict[str, Any]:
    """What `envs check` reads of a config, the task count aside."""
    world = {k: data.get(k) for k in WORLD_KEYS}
    if isinstance(world["tasks"], dict):
        world["tasks"] = {k: v for k, v in world["tasks"].items() if k != "n"}
    return world


# ---- the configs as shipped ---------------------------------------------------------------------------


def test_every_method_ships_a_real_environment_config_with_models_of_its_own_for_its_roles() -> None:
    assert set(SHIPPED) == set(all_methods())
    tau2 = _world(_shipped("mcp_tau2_retail.yaml"))
    assert tau2["env_config"]["judge"] == {}  # tau2's NL assertions are graded by each config's judge role
    for method, name in SHIPPED.items():
        data = _shipped(name)
        config = load_config(data)
        assert config.method == method
        if method == "demonstrations":  # no model acts or talks: the placeholder that names the reference
            assert (config.llm.backend, config.llm.model) == ("fake", "reference-solution")
        else:
            assert config.llm.backend == "llamacpp" and config.llm.n_ctx == 8192
        # ui_simulator's world is the paper's: a simulated site grounded in real pages recorded in Chromium.
        assert data["env"] in (("simulated",) if method == "ui_simulator" else ("mcp", "browser")), name
        if data["env"] == "mcp":  # one world: tau2's retail server, its train split (what one envs check checks)
            world = _world(data)
            if method == "demonstrations":  # gold actions: tau2's DB check decides, NL assertions counted unchecked
                assert "judge" not in data and "judge" not in data["env_config"]
                world = {**world, "env_config": {**world["env_config"], "judge": {}}}
            assert world == tau2, name
        instance = get_method(method)(config, None)
        for role in instance.roles_in_use():
            if role.by_design is None:
                assert set(role.fields) & set(role_fields(config)), f"{name}: no model of its own for the {role.name}"
    # Agent-R's rounds search the same world with a fixed judge of their own.
    agent_r = AgentRConfig.model_validate(yaml.safe_load((CONFIGS / "agent_r.yaml").read_text()))
    [entry] = agent_r.pipeline["generate"]
    assert entry["method"] == "mcts_splice" and _world(entry) == tau2 and entry["judge"]["llm"]["model"] == "judge"


@pytest.mark.parametrize("name", ["mcts_splice.yaml", "tutorial_replay.yaml", "ui_simulator_eval.yaml"])
def test_the_shipped_configs_worlds_pass_envs_check(name: str, tmp_path: Path) -> None:
    """tau2's world (every tau2 config has the same, see above) and the browser worlds, on their first task: the
    tutorials' pages, and the real pages ui_simulator's simulated shop copies, where its output is measured."""
    data = _shipped(name)
    if data["env"] == "mcp":
        data["env_config"]["sessions"] = 1
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["envs", "check", "--config", str(path), "--tasks", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["healthy"] and report["reference"]["passed"] == report["reference"]["total"] == 1


# ---- the scripted model ------------------------------------------------------------------------------


def in_my_words(text: str) -> str:
    """A scenario's second-person brief as the customer says it (quoting it word for word is a leak)."""
    for you, me in ((r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\byou'd\b", "I'd"),
                    (r"\bYou\b", "I"), (r"\byou\b", "I"), (r"\byour\b", "my"), (r"\bYour\b", "My")):
        text = re.sub(you, me, text)
    return text


def _persona(body: dict[str, Any], references: dict[str, list[Any]]) -> str | None:
    """The simulated customer: opens with its reason for calling and who it is, in its own words; says yes to a
    stated action; leaves once answered."""
    system = str(body["messages"][0]["content"])
    if "playing a customer" not in system:
        return None
    if any(m["role"] == "assistant" for m in body["messages"]):
        asked = str(body["messages"][-1].get("content") or "")
        return YES if "?" in asked and CONFIRM_ASK.search(asked) else "Thanks, that is all. ###STOP###"
    request = next((r for r in references if r in system), "I need help with an order.")
    known = system.split("Known info: ", 1)[1].split("\n", 1)[0] if "Known info: " in system else ""
    return in_my_words(f"{request} {known}".strip())


LEAVES_EARLY = "it says goodbye before the customer's request is done"  # a verifier's reason, long enough to quote


def _verdicts(body: dict[str, Any]) -> dict[str, Any] | None:
    """The judge: a premature goodbye is the wrong step (first-error verifier, step judge)."""
    system = str(body["messages"][0]["content"])
    prompt = str(body["messages"][-1]["content"])
    if system.startswith("You review a failed attempt"):
        steps = []
        for line in prompt.split("(agent steps are numbered):\n", 1)[1].splitlines():
            if line.startswith("["):
                index = int(line[1:line.index("]")])
                bad = "I am done here" in line
                steps.append({"index": index, "verdict": "Bad" if bad else "Good",
                              "reason": LEAVES_EARLY if bad else "fine"})
        return {"steps": steps}
    if system.startswith("You verify the steps"):
        step = prompt.split("The step:\n", 1)[1].split("\n\nAfter the step:", 1)[0]
        bad = "I am done here" in step
        return {"label": "bad" if bad else "good", "reason": "it leaves early" if bad else "it moves the task on"}
    return None


def _login(body: dict[str, Any]) -> Any:
    """The agent on MiniWoB's login page, in text mode: the next move on the page the request ends on."""
    messages = _from_text(body["messages"])
    done = sum(1 for m in messages if m["role"] == "tool")
    page = str(messages[-1].get("content") or "")
    if done >= len(LOGIN) or "URL:" not in page:
        return "I have signed in."
    return _as_text(LOGIN[done](parse_axtree(page[page.index("URL:"):])))


SHOP_GUIDE = "Put the blue hat in the cart."
SHOP_EXPLORE = [lambda p: call("click", bid=bid(p, "link", "Blue hat")),
                lambda p: call("click", bid=bid(p, "button", "Add to cart"))]
WRAPPED = "Add the blue hat to my cart."
WRAPPED_ANSWER = "The blue hat is in your cart."


def _explorer(prompt: str) -> dict[str, Any]:
    """The teacher exploring MiniWoB's login page (one guide, the login moves under it), or the simulated shop
    (one guide: the blue hat into the cart)."""
    steps = prompt.split("Steps so far:\n", 1)[1].split("\n\n", 1)[0]
    taken = 0 if steps == "(none yet)" else len(steps.splitlines())
    shop = "Tiny Shop" in prompt
    if prompt.startswith("TASK CONTROL"):
        return {"completed": False, "guide": SHOP_GUIDE if shop else "Sign in with the given credentials."}
    page = prompt.split("Current page:\n", 1)[1].split("\n", 1)[1]
    move: ToolCallAnswer = (SHOP_EXPLORE if shop else LOGIN)[taken](parse_axtree(page))
    return {"thought": "The form asks for the credentials.", "action": {"tool": move.name, "arguments": move.arguments},
            "summary": f"Use the {move.name} action on the form."}


class Shipped:
    """Every request the shipped configs make, answered by script."""

    def __init__(self, references: dict[str, list[Any]]) -> None:
        self.references = references
        # The agent knows a task by the customer's words for it too.
        self.generic = GenericModel({**references, **{in_my_words(k): v for k, v in references.items()}},
                                    judge=_verdicts)

    def __call__(self, body: dict[str, Any]) -> Any:
        if (said := _persona(body, self.references)) is not None:
            return said
        first = first_user(body) if any(m["role"] == "user" for m in body["messages"]) else ""
        system = str(body["messages"][0].get("content") or "")
        if first.startswith(("TASK CONTROL", "EXPLORE STEP")):
            return _explorer(first)
        if first.startswith("SIMULATE PAGE"):  # the simulated shop writes the real page retrieved first
            found = re.search(r"\nReal page 1: on \S+ \(.*?\), .*? -> (\S+)\n(.*?)(?:\n\nReal page 2:|\Z)", first, re.S)
            assert found, first
            return {"url": found.group(1), "axtree": found.group(2), "done": False}
        if first.startswith("WRAP TRAJECTORY"):
            n = int(first.split("Agent steps: ", 1)[1].split("\n", 1)[0])
            return {"instruction": WRAPPED, "thoughts": [f"Toward the hat, step {i + 1}." for i in range(n)],
                    "answer": WRAPPED_ANSWER}
        if first.startswith("PROPOSE TASKS"):
            return {"tasks": [{"instruction": LOGIN_TASK, "expected_outcome": "the page accepts the sign-in"}]}
        if first.startswith("JUDGE TASK COMPLETION"):
            ok = "click" in first.split("Transcript:", 1)[1]
            return {"reasoning": "the login button was clicked" if ok else "nothing was done", "success": ok}
        if first.startswith("REWRITE INSTRUCTION"):
            n = int(first.split("Agent steps: ", 1)[1].split("\n", 1)[0])
            return {"instruction": "Log in as the page's user.",
                    "thoughts": [f"To log in as the page's user, step {i + 1}." for i in range(n)]}
        if first.startswith("WRITE CHALLENGE"):
            return CHALLENGE
        if first.startswith("REVIEW THE AGENT'S STEP"):  # a teacher that restates the task it was shown
            review = self.generic(body)
            if review["verdict"] == "wrong":
                task = first.split("Task: ", 1)[1].split("\n\nConversation so far", 1)[0]
                review["reflection"] = f"The request is: {task} {review['reflection']}"
            return review
        if "URL:" in json.dumps(body["messages"][-1]) and "<tool_call>" in system:
            return _login(body)
        return self.generic(body)


def _references() -> dict[str, list[Any]]:
    """tau2's reference solution of the task (replayed by the environment), and the scripted challenge's."""
    data = _shipped("mcp_tau2_retail.yaml")
    spec = EnvSpec(**{k: data[k] for k in WORLD_KEYS}, user={"kind": "none"})
    spec.env_config["sessions"] = 1
    spec.env_config.pop("judge")  # the judge role is a run's; the references are only replayed here
    spec.tasks.ids = [TASK]

    async def solve() -> dict[str, list[Any]]:
        factory = EnvFactory(spec)
        out = {}
        try:
            for task in factory.tasks():
                async with factory.make() as env:
                    out[task.instruction] = await env.reference_solution(task) or []
        finally:
            await factory.aclose()
        return out

    done = MessageAction(content="Your order is cancelled. Is there anything else?")
    find = ApiAction(function="find_user_id_by_name_zip", arguments={"first_name": "Yusuf", "last_name": "Rossi",
                                                                      "zip": "19122"})
    cancel = [find, ApiAction(function=CANCEL_CALL["name"], arguments=CANCEL_CALL["arguments"]), done]
    reads = set(data["env_config"]["read_only_tools"])
    return {request: confirmed(actions, reads) for request, actions in {**asyncio.run(solve()), CANCEL: cancel}.items()}


def confirmed(actions: list[Any], reads: set[str]) -> list[Any]:
    """`actions` as an agent that obeys the retail policy plays them: each write stated and asked about first."""
    out: list[Any] = []
    for action in actions:
        if isinstance(action, ApiAction) and action.function not in reads:
            out.append(MessageAction(content=f"I will {action.function.replace('_', ' ')} with "
                                             f"{json.dumps(action.arguments)}. Do you confirm (yes/no)?"))
        out.append(action)
    return out


# ---- runs --------------------------------------------------------------------------------------------


def _llm(base_url: str, model: str) -> dict[str, Any]:
    return {"backend": "openai", "base_url": base_url, "model": model, "api_key_env": None, "max_retries": 0,
            "request_timeout_s": 30}


# What each method's run changes in its shipped config here (beside the fake server's models and one tau2 task);
# `SEARCH` stands for mcts_splice's output. Each runs once per module: its own test and the guard read the output.
SEARCH = "<mcts_splice output>"
PLACEHOLDER = {"backend": "fake", "model": "reference-solution"}  # as shipped: no model acts (demonstrations)
SETTINGS: dict[str, dict[str, Any]] = {
    "rollout": {},
    # tau2-retail-82: tau2's gold is the return alone, with an order id and item ids nobody said.
    "demonstrations": {"llm": PLACEHOLDER, "tasks": {"ids": [TASK, "tau2-retail-82"]}},
    "mcts_splice": {"search": {"iterations": 2, "generations": 2, "max_depth": 8}},
    "curriculum": {"rollouts": 2},
    "reflection": {"input": SEARCH, "max_corrections": 1},
    "step_verify": {"input": SEARCH},
    "self_challenging": {"challenges": 1, "rollouts": 1, "explore_steps": 1},
    "simia_sft": {"seeds": [SEARCH], "samples_per_seed": 1, "max_seeds": 2},
    "ui_simulator": {"rounds": 1, "walk_steps": 2},
}


class Runs:
    """The shipped configs run through `trajforge generate` against one fake server, outputs under `root`; each
    (method, tag) runs once, and keeps what it printed and the requests it made."""

    def __init__(self, root: Path, server: FakeServer) -> None:
        self.root, self.server = root, server
        self.done: dict[str, tuple[str, Path, list[dict[str, Any]]]] = {}

    def shipped(self, method: str) -> tuple[str, Path]:
        """The method's run with its SETTINGS (once per module)."""
        changes = json.loads(json.dumps(SETTINGS[method]).replace(json.dumps(SEARCH), json.dumps(
            str(self.shipped("mcts_splice")[1])))) if SEARCH in json.dumps(SETTINGS[method]) else SETTINGS[method]
        return self.run(method, **changes)

    def requests_of(self, method: str, tag: str = "") -> list[dict[str, Any]]:
        """The requests the fake server got during that run."""
        return self.done[f"{method}{tag}"][2]

    def run(self, method: str, tag: str = "", **changes: Any) -> tuple[str, Path]:
        if f"{method}{tag}" in self.done:
            printed, out, _ = self.done[f"{method}{tag}"]
            return printed, out
        before = len(self.bodies())
        data = _shipped(SHIPPED[method])
        data["llm"] = _llm(self.server.base_url, "fake-actor")
        for role in ("judge", "teacher"):
            if isinstance(data.get(role), dict) and data[role].get("llm"):
                data[role] = {**data[role], "llm": _llm(self.server.base_url, f"fake-{role}")}
        if data.get("env") == "mcp":
            data["env_config"]["sessions"] = 1
            data["tasks"] = {**{k: v for k, v in data["tasks"].items() if k != "n"}, "ids": [TASK],
                             **changes.pop("tasks", {})}
        data.update(changes)
        path = self.root / f"{method}{tag}.yaml"
        path.write_text(yaml.safe_dump(data))
        out = self.root / f"{method}{tag}"
        result = runner.invoke(app, ["generate", "--method", method, "--config", str(path), "--output", str(out)],
                               terminal_width=200)
        assert result.exit_code == 0, result.output
        quarantined = list(Dataset.open(out).iter_records("quarantine"))
        assert not quarantined, [q.error for q in quarantined]
        self.done[f"{method}{tag}"] = (result.output, out, self.bodies()[before:])
        return result.output, out

    def bodies(self) -> list[dict[str, Any]]:
        return [e["body"] for e in self.server.log if "body" in e]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    references = _references()
    with FakeServer(rules=[Rule(fn=Shipped(references))]) as server:
        yield Runs(tmp_path_factory.mktemp("shipped"), server)


@pytest.fixture(scope="module")
def search(runs: Runs) -> Path:
    """mcts_splice's output: failed and solved paths of the task (reflection, step_verify and simia_sft read it)."""
    return runs.shipped("mcts_splice")[1]


def _records(out: Path) -> list[Trajectory]:
    ds = Dataset.open(out)
    return [*ds.iter_records(), *(f.record for f in ds.iter_records("filtered"))]


def test_rollout_solves_the_task_by_tau2s_criteria(runs: Runs) -> None:
    _, out = runs.shipped("rollout")
    [t] = _records(out)
    assert t.success and t.reward == 1.0 and t.details["evaluation"]["details"]
    assert t.steps[0].name == "system" and "# Policy" in t.steps[0].content and t.steps[1].source == "user"


def test_demonstrations_play_tau2s_gold_actions_and_succeed_without_an_acting_model(runs: Runs) -> None:
    # As shipped: no `llm` (the placeholder), so the agent's messages are the blueprint's templates.
    _, out = runs.shipped("demonstrations")
    [t] = [t for t in _records(out) if t.provenance.source_id == TASK]
    assert t.success and t.reward == 1.0 and t.provenance.model == "reference-solution"
    assert t.steps[0].name == "system" and "# Policy" in t.steps[0].content and t.steps[1].source == "user"
    calls = [s.function for s in t.steps if s.kind == "api"]
    assert calls == [a["name"] for a in t.details["task"]["goal"]["actions"]]
    # A dialogue that obeys the policy: the scenario user opens in its own words, every write is confirmed.
    assert t.steps[1].content.startswith("I received my order #W2378156") and t.details["dialogue"] == "blueprint"
    assert policy_violations(t.steps, writes=write_tools_of(t)) == [] and t.details["agent_text"] == {"template": 3}
    assert runs.requests_of("demonstrations") == []  # no model was asked anything


def test_mcts_splice_revises_the_wrong_step_the_judge_names_and_pairs_steps_by_monte_carlo_values(
        runs: Runs, search: Path) -> None:
    records = _records(search)
    spliced = [t for t in records if t.details.get("role") == "spliced"]
    assert len(spliced) == 2  # the goodbye at the start, and after finding the user
    for t in spliced:
        info = t.details["splice"]
        assert info["error_source"] == "llm" and info["reason"] == LEAVES_EARLY
        wrong = t.steps[info["first_error"]]
        assert wrong.kind == "message" and wrong.content == GIVE_UP and not wrong.train
        revision = t.steps[info["revision_index"]]
        assert revision.extra == {"kind": "revision"} and revision.train and t.success
        # Agent-R: the whole bad path before the revision is context (the shared lookup included).
        assert all(not s.train for s in t.steps[: info["revision_index"]] if s.kind in ("api", "message"))
        assert t.details["roles"]["first-error verifier"] == "openai:fake-judge" and t.details["actor_roles"] == []
    assert any(info["prefix_len"] > 2 for info in (t.details["splice"] for t in spliced))
    steps = [p for p in Dataset.open(search).iter_records("pairs") if p.level == "step"]
    assert len(steps) == 2
    for step in steps:
        values = step.details["step_values"]
        # The good step's rollouts: draw 0 solves, draw 1 gives up (distinct seeds, no shared answer); after the
        # goodbye nothing is left to do.
        assert values["chosen"]["rewards"] == [1.0, 0.0] and values["rejected"]["rewards"] == [0.0, 0.0]
        assert (step.chosen_reward, step.rejected_reward) == (0.5, 0.0)
    drawn = [b for b in runs.bodies() if b.get("seed") is not None and TASK_REQUEST in json.dumps(b["messages"])]
    assert {b["seed"] for b in drawn} >= {0, 1}


TASK_REQUEST = "wish to exchange the mechanical keyboard"  # the task's request, in the customer's words too


def test_curriculum_selects_by_variance_over_distinct_draws_and_verifies_the_evolved_task(runs: Runs) -> None:
    _, out = runs.shipped("curriculum")
    records = _records(out)
    seed = sorted((t for t in records if t.details["curriculum"]["generation"] == 0), key=lambda t: t.id)
    assert [t.reward for t in seed] == [1.0, 0.0]
    assert seed[0].details["curriculum"]["variance"] == 0.25 and seed[0].details["curriculum"]["in_band"]
    assert [s["seed"] for s in seed[0].details["curriculum"]["samples"]] == [0, 1]
    evolved = [t for t in records if t.details["curriculum"]["generation"] == 1]
    assert evolved, "the selected task was not evolved"
    checks = {c["case"]: c for c in evolved[0].details["evolution"]["checks"]}
    assert checks["solution"]["passed"] and not checks["do-nothing"]["passed"]
    assert evolved[0].details["task"]["metadata"]["evolved_from"] == TASK


def test_reflection_corrects_the_wrong_step_and_succeeds(runs: Runs, search: Path) -> None:
    _, out = runs.shipped("reflection")
    kept = list(Dataset.open(out).iter_records())
    assert kept and all(t.success for t in kept)
    fixed = kept[0]
    [correction] = fixed.details["reflection"]["corrections"]
    assert correction["reason"].startswith("the next step is")
    assert fixed.steps[correction["wrong_step"]].label == "bad" and not fixed.steps[correction["wrong_step"]].train
    assert fixed.details["reflection"]["teacher"] == "openai:fake-judge"


def test_step_verify_judges_the_users_request_and_is_measured_against_reference_actions(
        runs: Runs, search: Path) -> None:
    printed, out = runs.shipped("step_verify")
    judged = [first_user(b) for b in runs.bodies() if str(b["messages"][0]["content"]).startswith("You verify the steps")]
    tasks = {j.split("Task:\n", 1)[1].split("\n\nBefore the step:", 1)[0] for j in judged}
    assert tasks and all(t.startswith("I received my order #W2378156") for t in tasks)  # the customer's words
    assert all("Rules the agent must follow:" in j for j in judged)
    labelled = {(s.content if s.kind == "message" else s.function, s.label)
                for t in _records(out) for s in t.steps if s.kind in ("api", "message") and s.label != "unknown"}
    assert (GIVE_UP, "bad") in labelled and ("find_user_id_by_name_zip", "good") in labelled
    assert "judge vs reference actions" in printed


def test_self_challenging_writes_under_the_policy_and_scores_rollouts_with_its_verifier(runs: Runs) -> None:
    _, out = runs.shipped("self_challenging")
    written = [b for b in runs.bodies() if first_user(b).startswith("WRITE CHALLENGE")]
    assert written and "# Policy" in written[-1]["messages"][0]["content"]
    assert "Retail agent policy" in written[-1]["messages"][0]["content"]
    [rollout] = list(Dataset.open(out).iter_records())
    assert rollout.reward == 1.0 and rollout.details["verifier"]["passed"] and rollout.success
    # A user who answers: the agent authenticates, states the cancellation, hears a yes, then cancels (the policy's
    # rule check finds nothing; without a user, the statement would end the episode before the write).
    cancel = next(i for i, s in enumerate(rollout.steps) if s.kind == "api" and s.function == CANCEL_CALL["name"])
    assert rollout.steps[cancel - 1].content == YES and "policy" not in rollout.details
    assert rollout.details["roles"]["challenger"] == "openai:fake-actor"  # the paper's own design, recorded


def test_simia_sft_uses_no_failed_episode_and_keeps_each_seeds_policy(runs: Runs, search: Path) -> None:
    printed, out = runs.shipped("simia_sft")
    seeds = {t.id: t for t in Dataset.open(search).iter_records()}
    assert any(t.success is False for t in seeds.values())
    written = list(Dataset.open(out).iter_records())
    assert written
    for t in written:
        seed = seeds[t.provenance.parent_ids[0]]
        assert seed.success is not False and t.details["policy_source"] == "seed"
        assert t.steps[0].content == seed.steps[0].content.strip()
    assert "seeds whose episode failed (not used)" in printed


def test_simia_sfts_shipped_chain_yields_data_from_seeds_no_model_had_to_solve(runs: Runs, tmp_path: Path) -> None:
    """The chain simia_sft.yaml's header gives, as shipped: its seeds come from a config whose episodes succeed
    without the acting model (the embedded model solves nothing, and failed episodes are no seeds); a seed whose
    simulated user broke the episode is not used either, and counted."""
    header = (CONFIGS / "simia_sft.yaml").read_text()
    (method, config, seeds_out), *_ = re.findall(r"trajforge generate --method (\w+) --config configs/(\S+) "
                                                 r"--output (\S+)", header)
    assert _shipped("simia_sft.yaml")["seeds"] == [seeds_out] and SHIPPED[method] == config
    # As shipped the seeds' config has no acting model (its messages are templates): the demonstrations run.
    _, demos = runs.shipped(method)
    assert runs.requests_of(method) == []  # no model was asked anything: the seeds do not depend on it
    seeds = list(Dataset.open(demos).iter_records())
    assert seeds and all(t.success for t in seeds)
    broken = seeds[0].model_copy(update={"id": f"{seeds[0].id}-broken-user", "details": {
        **seeds[0].details, "user_fidelity": {"ok": False, "reason": "the user answered as the agent"}}})
    spoiled = Dataset.create(tmp_path / "spoiled", stage="test")
    with spoiled.unit("u-000") as unit:
        unit.write("trajectories", broken)
    printed, out = runs.run("simia_sft", "-chain", seeds=[str(demos), str(tmp_path / "spoiled")], samples_per_seed=1)
    written = list(Dataset.open(out).iter_records())
    assert written and {t.provenance.parent_ids[0] for t in written} == {t.id for t in seeds}
    assert "seeds whose simulated user broke the" in printed  # the summary table (wrapped)
    report = json.loads((out / "_manifest.json").read_text())["last_run"]["report"]
    assert report["seeds whose simulated user broke the episode (not used)"] == 1


def test_ui_simulator_trains_on_the_teachers_wrapped_exploration_of_the_simulated_site(runs: Runs) -> None:
    """The paper's loop as shipped: the simulated shop (pages written from recorded real ones), the teacher exploring
    under a guide, the wrapper relabelling, the judge reading the pages; the rows are the wrapped explorations."""
    _, out = runs.shipped("ui_simulator")
    [t] = list(Dataset.open(out).iter_records())
    assert t.details["loop"] == "wrap" and t.details["env"]["name"] == "simulated" and t.success
    assert t.details["explore"]["guides"] == [{"guide": SHOP_GUIDE, "steps": ["Use the click action on the form."] * 2}]
    # The teacher's actions, in the simulated world: its pages are the recorded real pages the simulator was given.
    calls = [s for s in t.steps if s.kind == "api"]
    assert [s.function for s in calls] == ["click", "click"]
    pages = [s for s in t.steps if s.kind == "web"]
    assert pages[0].url == "http://tinyshop.example/" and "Blue hat" in pages[1].axtree
    bodies = runs.requests_of("ui_simulator")
    assert sum(first_user(b).startswith("SIMULATE PAGE") for b in bodies) == 2
    assert not any(first_user(b).startswith(("PROPOSE TASKS", "REWRITE INSTRUCTION")) for b in bodies)
    assert not any("<tool_call>" in str(b["messages"][0]["content"]) for b in bodies)  # the agent never acted
    # Wrapped: the user's request, every thought and the final answer are the wrapper's, declared written.
    assert t.steps[0].name == "system" and t.steps[1].content == WRAPPED
    assert [s.thought for s in calls] == ["Toward the hat, step 1.", "Toward the hat, step 2."]
    assert t.steps[-1].kind == "message" and t.steps[-1].content == WRAPPED_ANSWER
    [rewrite] = t.details["rewrites"]
    assert rewrite["kind"] == "written" and rewrite["steps"] == [i for i, s in enumerate(t.steps)
                                                                 if s.kind in ("api", "message")]
    # The judge read the pages and actions, not the teacher's thoughts.
    [judged] = [first_user(b) for b in bodies if first_user(b).startswith("JUDGE TASK COMPLETION")]
    assert WRAPPED in judged and "Toward the hat" not in judged and "Add to cart" in judged
    assert t.details["judge"]["reads"] == "world"


def test_ui_simulator_propose_loop_explores_under_guides_judges_and_relabels_thoughts(runs: Runs) -> None:
    _, out = runs.run("ui_simulator", "-propose", loop="propose", env="browser", start_urls=[],
                      env_config={"observe": ["axtree"], "step_timeout_s": 30, "max_contexts": 2},
                      tasks={"source": "miniwob", "options": {"tasks": ["login-user"]}}, rounds=1,
                      tasks_per_round=1, attempts=1, walk_steps=2)
    [t] = list(Dataset.open(out).iter_records())
    assert t.details["explore"]["guides"] == [{"guide": "Sign in with the given credentials.",
                                               "steps": ["Use the type action on the form."] * 2}]
    assert t.success and t.steps[1].content == "Log in as the page's user."
    actions = [s for s in t.steps if s.kind in ("api", "message")]
    assert [s.thought for s in actions] == [f"To log in as the page's user, step {i + 1}." for i in range(len(actions))]
    assert t.details["roles"] == {"explorer": "openai:fake-judge", "proposer": "openai:fake-judge",
                                  "judge": "openai:fake-judge", "relabeller": "openai:fake-judge"}
    assert t.details["actor_roles"] == [] and t.details["loop"] == "propose"


# ---- the guard -----------------------------------------------------------------------------------------


def test_no_trained_row_of_a_shipped_method_holds_what_its_agent_could_not_know(runs: Runs, tmp_path: Path) -> None:
    """Every shipped method config (tutorial_replay's in tests/generators/test_tutorial_replay.py), its output
    exported as users export it: no trained text takes a span of 8 words or an id from what the record keeps hidden
    (the user's scenario, reference calls, guides, verifier, judge and teacher reasons) that its prompt lacks."""
    assert set(SETTINGS) == set(SHIPPED) - {"tutorial_replay"}
    found = {method: leaks(runs.shipped(method)[1], tmp_path) for method in SETTINGS}
    assert not any(found.values()), "\n".join(f"{m}: {len(f)}, e.g. {f[:2]}" for m, f in found.items() if f)
