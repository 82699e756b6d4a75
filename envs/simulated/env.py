"""SimulatedEnv: an LLM plays the environment (tool results, user turns, page states) for any tool list.

Simia-RL / UI-Simulator style. The environment is given tool specs (`Tool`s or OpenAI-style
function dicts), a policy text (the rules the simulated world enforces, e.g. a tau-bench
policy, or a site description in web mode) and optional seed trajectories (examples of
realistic outputs). Users can so simulate their own APIs without implementing them:

    env = make_env("simulated", tools=[...], policy="...", llm=LLMConfig(...) | llm, seeds=[...])

Each tool call sends the task, the history and the agent's action to the model and asks
(structured output) for `{observation, done}` — in `mode="web"` for the next page
`{url, axtree, done}`, returned as a `WebObservation`. What never needs a model call does
not get one: an api action naming an unknown tool or with arguments that fail the tool's
JSON Schema gets an error observation at once (the state is unchanged); code actions are
refused. The user is a component of its own: by default the simulator plays it too
(`SimulatorUser`, the same model under the same policy, seeing the whole episode), or any
`UserSimulator` given. The episode ends when the model says `done`, when a user turn carries
`###STOP###`, after `max_steps` actions, or (web mode) when the agent answers with a message.
Web mode can be seeded with real pages of the site (`real_states`: a JSONL of recorded states or a
dataset directory of real-world trajectories; `envs/simulated/real_states.py`): an episode starts
on the recorded entry page most like its task, and each step's prompt carries the `real_states_k`
recorded pages that followed the most similar real actions (BM25 over page and action words), so
simulated pages take the real site's format, structure and wording (UI-Simulator's
retrieval-augmented simulation).
The reward is an LLM judge's `{reasoning, reward}` over the transcript (one call per history,
reused until the history grows). The world's whole state is the episode's history, so snapshots
are free and repeatable.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field

from backends.base import LLM
from backends.config import LLMConfig
from envs.base import USER_STOP, Environment, Evaluation, StepResult, Task, UserReply, UserSimulator, refused, unsupported
from envs.pages import describe_action, page_elements, page_title
from envs.simulated import prompts as P
from envs.simulated.real_states import load_real_states
from envs.toolspec import as_tool
from schemas.models import Action, ApiAction, MessageAction, Observation, Step, TextObservation, Tool, Trajectory, WebObservation
from schemas.toolcalls import call_problem

Mode = Literal["tool", "web"]


class SimulationError(RuntimeError):
    """The simulator model gave no usable answer (invalid output or a failed request; see the LLM ledger)."""


class ToolTurn(BaseModel):
    """The simulator's answer in tool mode: a tool result or a user turn, and whether the episode ends."""

    observation: str
    done: bool


class PageTurn(BaseModel):
    """The simulator's answer in web mode: the next page state."""

    url: str
    axtree: str = Field(description="the page's accessibility tree, written in the format the instructions give")
    done: bool


class Judgement(BaseModel):
    reasoning: str
    reward: float


def _load_seeds(seeds: list[Any]) -> list[Trajectory]:
    """Seeds as Trajectory objects, dicts, or paths (a dataset directory or an interlingua JSONL file)."""
    out: list[Trajectory] = []
    for seed in seeds:
        if isinstance(seed, Trajectory):
            out.append(seed)
        elif isinstance(seed, dict):
            out.append(Trajectory.model_validate(seed))
        else:
            path = Path(seed)
            if path.is_dir():
                from schemas.store import Dataset

                out.extend(Dataset.open(path).iter_records())
            else:
                out.extend(Trajectory.model_validate_json(line) for line in path.read_text().splitlines() if line.strip())
    return out


def _as_axtree(text: str) -> str:
    """Compact JSON when the model wrote valid JSON (the usual case), else its text unchanged."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    except (ValueError, TypeError):
        return text


class SimulatorUser(UserSimulator):
    """The user played by the simulator model itself, under the environment's policy (Simia)."""

    kind = "simulated"

    def __init__(self, env: SimulatedEnv) -> None:
        self.env = env

    async def reply(self, task: Task, conversation: Sequence[Step]) -> UserReply:
        answer = await self.env.ask(self.env.step_prompt(task, conversation[:-1], conversation[-1], "the user's reply"),
                                    ToolTurn)
        return UserReply(text=answer.observation, stop=answer.done or USER_STOP in answer.observation)


class SimulatedEnv(Environment):
    """An environment whose every reaction is written by an LLM under a policy; works for any tool list."""

    name = "simulated"
    can_snapshot = True
    needs_llm = True
    default_user = "per config"  # what `trajforge envs` lists
    evaluation = "LLM judge over the transcript, under the policy"

    @classmethod
    def offers(cls, config: dict[str, Any]) -> set[str]:
        out = super().offers(config)
        if config.get("mode") == "web":
            out.add("pages")
        if not config.get("tasks"):
            out.discard("generator")  # it generates only from the tasks its config lists
        return out

    def __init__(
        self,
        tools: list[Tool | dict[str, Any]] | None = None,
        policy: str = "",
        llm: LLM | LLMConfig | dict[str, Any] | None = None,
        seeds: list[Any] | None = None,
        mode: Mode = "tool",
        tasks: list[str | dict[str, Any]] | None = None,
        start_page: dict[str, str] | None = None,
        real_states: str | list[str] | None = None,
        real_states_k: int = 2,
        max_steps: int = 30,
        max_history_chars: int = 12_000,
        max_example_chars: int = 6_000,
        seed: int = 0,
        user: UserSimulator | None = None,
        judge: LLM | None = None,
    ) -> None:
        if mode not in ("tool", "web"):
            raise ValueError(f"mode must be 'tool' or 'web', not {mode!r}")
        if mode == "tool" and not tools:
            raise ValueError("a simulated tool environment needs tools=[...] (Tool objects or JSON Schema dicts)")
        if real_states and mode != "web":
            raise ValueError("real_states are recorded web pages: they seed the simulated env in mode: web")
        if real_states_k < 1:
            raise ValueError(f"real_states_k must be >= 1, not {real_states_k}")
        # Web mode has no user: the agent's message is its final answer.
        super().__init__(max_steps=max_steps, user=user if user is not None or mode == "web" else SimulatorUser(self))
        self.mode: Mode = mode
        self._tools = [as_tool(t) for t in tools] if tools else list(P.DEFAULT_WEB_TOOLS)
        self.rules = policy.strip() or "(no special rules)"
        # Tool mode: the domain policy binds the agent too (it is in its system prompt, as in tau-bench);
        # web mode: the site description is for the simulator only.
        self.policy = policy.strip() or None if mode == "tool" else None
        self.seeds = _load_seeds(list(seeds or []))
        self.task_pool = list(tasks or [])
        self.start_page = start_page
        # Real pages of the site (UI-Simulator's retrieval-augmented simulation): an entry page to start on,
        # and for every step the real pages that followed the most similar recorded actions.
        self.real = load_real_states(real_states) if real_states else None
        if self.real is not None and not self.real.states:
            raise ValueError(f"real_states: {real_states} holds no pages")
        self.real_states_k = real_states_k
        self.max_example_chars = max_example_chars
        self.max_history_chars = max_history_chars
        self.seed = seed
        self._own_llm = llm is not None and not isinstance(llm, LLM)
        self._llm_source = llm
        self._llm: LLM | None = llm if isinstance(llm, LLM) else None
        self._judge = judge  # the grading model; default: the simulator's own
        # The last judgement: (history it judged, its evaluation).
        self._judged: tuple[tuple[Step, ...], Evaluation] | None = None
        template = P.WEB_SYSTEM if mode == "web" else P.TOOL_SYSTEM
        self._system = template.format(policy=self.rules, tools=P.tools_block(self._tools),
                                       examples=P.examples_block(self.seeds, max_example_chars),
                                       page_format=P.PAGE_FORMAT_REAL if self.real is not None else P.PAGE_FORMAT_JSON)

    # ---- configuration ------------------------------------------------------------------------

    @property
    def llm(self) -> LLM:
        if self._llm is None:
            if self._llm_source is None:
                raise ValueError("the simulated environment needs llm=LLMConfig(...) or an LLM instance")
            from backends.registry import make_llm

            self._llm = make_llm(self._llm_source)  # type: ignore[arg-type]
        return self._llm

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        """`n` tasks cycled from the configured `tasks=[...]` (strings or Task-like dicts), shuffled by `seed`."""
        if not self.task_pool:
            raise NotImplementedError("the simulated environment generates tasks only from tasks=[...] in its config")
        pool = list(self.task_pool)
        random.Random(f"simulated-tasks-{seed}").shuffle(pool)
        out: list[Task] = []
        for i in range(n):
            item = pool[i % len(pool)]
            data = {"instruction": item} if isinstance(item, str) else dict(item)
            data.setdefault("id", f"simulated-s{seed}-{i:04d}")
            data["env"] = self.name
            data.setdefault("seed", seed)
            out.append(Task.model_validate(data))
        return out

    # ---- episodes -----------------------------------------------------------------------------

    async def _reset(self, task: Task) -> Observation | None:
        self._judged = None
        if self.mode == "tool":
            return None  # the user's request opens the episode; no model call needed
        page = task.params.get("start_page") or self.start_page
        if page:
            return WebObservation(url=page.get("url"), axtree=_as_axtree(page.get("axtree", "")))
        start = str(task.params.get("start_url") or "")
        entry = ((self.real.at(start) if start else None) or self.real.entry(f"{task.instruction} {start}")
                 if self.real else None)
        if entry is not None:
            return WebObservation(url=entry.url, axtree=entry.axtree)  # a real page needs no model call
        answer = await self.ask(P.WEB_START.format(task=P.task_block(task)), PageTurn)
        return WebObservation(url=answer.url, axtree=_as_axtree(answer.axtree))

    async def _act(self, action: Action) -> StepResult:
        task = self.task
        assert task is not None
        if isinstance(action, ApiAction):
            problem = call_problem(self._tools, action.function, action.arguments)
            if problem is not None:
                # Checked locally: a schema violation needs no model call and changes nothing.
                return refused(action, problem)
            if self.mode == "web":
                page = next((s for s in reversed(self.history) if isinstance(s, WebObservation)), None)
                elements = page_elements(page.axtree if page is not None else None)
                # The action's target by name: the simulator (and the retrieval) need not look the bid up.
                said = describe_action(action, elements)
                real = self.real.similar(page.url if page else None, page_title(page.axtree if page else None), said,
                                         self.real_states_k) if self.real else []
                answer = await self.ask(P.WEB_USER.format(task=P.task_block(task), history=self._history_text(self.history),
                                                          action=f"{P.step_line(action)}: {said}",
                                                          real_pages=P.real_pages_block(real, self.max_example_chars)),
                                        PageTurn)
                obs: Observation = WebObservation(url=answer.url, axtree=_as_axtree(answer.axtree),
                                                  tool_call_id=action.tool_call_id)
                return StepResult(obs, done=answer.done)
            turn = await self.ask(self.step_prompt(task, self.history, action, "the tool's output (JSON or text)"), ToolTurn)
            obs = TextObservation(content=turn.observation, source="environment", name=action.function,
                                  tool_call_id=action.tool_call_id)
            return StepResult(obs, done=turn.done)
        if isinstance(action, MessageAction):
            # Without a user (web mode), a message is the agent's final answer (WebArena's `stop`).
            return StepResult(TextObservation(content="The answer was submitted.", source="environment"),
                              done=True, info={"answer": action.content})
        return unsupported(action)

    def step_prompt(self, task: Task, history: Sequence[Step], action: Step, what: str) -> str:
        return P.TOOL_USER.format(task=P.task_block(task), history=self._history_text(history),
                                  action=P.step_line(action), what=what)

    def _history_text(self, history: Sequence[Step]) -> str:
        return P.history_block(tuple(history), self.max_history_chars)

    async def ask(self, prompt: str, schema: type[BaseModel]) -> Any:
        answer = await self.llm.structured([{"role": "system", "content": self._system},
                                            {"role": "user", "content": prompt}], schema)
        if answer is None:
            raise SimulationError(f"no valid {schema.__name__} from the simulator model (invalid output or failed request)")
        return answer

    # ---- reward -------------------------------------------------------------------------------

    async def _evaluate(self, task: Task, history: Sequence[Step]) -> Evaluation:
        """The judge's verdict for the episode so far (one model call, reused until the history grows)."""
        key = tuple(history)
        if self._judged is not None and self._judged[0] == key:
            return self._judged[1]
        prompt = P.JUDGE_USER.format(task=P.task_block(task), history=self._history_text(history))
        judge = self._judge or self.llm
        verdict = await judge.structured([{"role": "system", "content": P.JUDGE_SYSTEM.format(policy=self.rules)},
                                             {"role": "user", "content": prompt}], Judgement)
        if verdict is None:
            raise SimulationError("no valid judgement from the judge model (invalid output or failed request)")
        evaluation = Evaluation.of(verdict.reward, verdict.reasoning, judge="llm")
        self._judged = (key, evaluation)
        return evaluation

    # ---- state --------------------------------------------------------------------------------

    def _snapshot_world(self) -> None:
        return None  # the base's episode (task + history) is the whole state

    def _restore_world(self, payload: None) -> None:
        self._judged = None

    async def close(self) -> None:
        """Close an LLM this env made itself (a passed-in LLM belongs to the caller)."""
        if self._own_llm and self._llm is not None:
            llm, self._llm = self._llm, None
            await llm.aclose()
