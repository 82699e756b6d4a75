"""A scripted agent / judge model for the retail environment: deterministic search trees without a real model.

Used by the search benchmark (`benchmarks/mcts.py`) and the tests of the search-based methods.
Sample i of an n-sample request is decided by i (FakeLLM answers every sample alike, so this
subclass asks its script per index): 0 = the next reference action (the greedy choice), 1 = a
wrong write (cancel with the other reason: the task can no longer succeed), 2 = a lookup of an
order that does not exist (an `Error:` observation), 3 = a question to the user. A one-sample
request with a sampling seed (an independent draw: Monte Carlo rollouts, curriculum attempts) is
decided by its seed the same way, so draw k takes choice k at every step. Structured
requests (step judge, first-error verifier, task evolution) call a step bad iff it is not a
reference action. A revision request (Agent-R's model-written revision) is answered with a
sentence that quotes the wrong step back.

`solved` overrides the script per task id: samples 0..k-1 of every request take the next
reference action and the others hand the user over to a human (which ends the episode unsolved),
so a task's rollouts are always solved (k >= n), never (k = 0) or k of n times.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson

from backends.config import LLMConfig
from backends.fake_backend import FakeLLM, tool_call
from backends.types import ChatRequest, Completion
from envs.base import Task
from envs.retail.tasks import generate_tasks

FINAL = "Your request has been processed successfully. Is there anything else?"
QUESTION = "Could you tell me the reason for this request?"
BAD_ORDER = "#W0000000"
REVISION_MARK = "just noticed a mistake"
REVISION_ANSWER = "I see that {step} was wrong, so I will go back and do it the right way."


def call_key(function: str, arguments: dict[str, Any]) -> str:
    return f"call {function}({orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()})"


def cancel_tasks(n: int = 2, seed: int = 0) -> list[Task]:
    return generate_tasks(n, seed=seed, kinds=["cancel"])


class ScriptedRetailLLM(FakeLLM):
    """Deterministic retail agent + judge; `latency` seconds per raw call."""

    def __init__(self, tasks: list[Task], latency: float = 0.0, wrong_from: int = 0,
                 solved: dict[str, int] | None = None):
        super().__init__(LLMConfig(backend="fake", model="scripted"))
        self.tasks = {t.instruction: t for t in tasks}
        self.latency = latency
        # Offer the wrong write only from this many successful reference actions on (shapes the tree).
        self.wrong_from = wrong_from
        self.solved = dict(solved or {})

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        self.requests.append(request)
        if self.latency:
            await asyncio.sleep(self.latency)
        if request.response_format is not None:
            return [self._to_completion(self._judge(request), request, 0)]
        text = str(request.messages[-1].get("content") or "")
        if REVISION_MARK in text:
            step = text.split("The wrong step:\n", 1)[1].split("\n\nWrite ", 1)[0].strip()
            return [self._to_completion(REVISION_ANSWER.format(step=step), request, 0)]
        progress = self._progress(request.messages)
        drawn = int(request.params.get("seed") or 0) if request.n == 1 else 0
        return [self._to_completion(self._agent(request, drawn + i, progress), request, i) for i in range(request.n)]

    # ---- the agent -------------------------------------------------------------------------------
    def _task(self, messages: list[dict[str, Any]]) -> Task:
        for m in messages:
            if m["role"] == "user" and m["content"] in self.tasks:
                return self.tasks[m["content"]]
        text = " ".join(str(m.get("content")) for m in messages)
        return next(t for ins, t in self.tasks.items() if ins in text)

    def _progress(self, msgs: list[dict[str, Any]]) -> tuple[Task, set[str], Any]:
        """(task, calls that succeeded, next reference action or None): the same for every sample."""
        task = self._task(msgs)
        answers: dict[str, str] = {}  # call id -> its first answer (one pass, not one scan per call)
        for m in msgs:
            if m.get("tool_call_id"):
                answers.setdefault(m["tool_call_id"], str(m.get("content", "")))
        done, failed = set(), set()
        for m in msgs:
            for c in m.get("tool_calls") or []:
                key = call_key(c["function"]["name"], orjson.loads(c["function"]["arguments"]))
                answer = answers.get(c["id"])
                ok = answer is not None and not answer.startswith("Error")
                (done if ok else failed).add(key)
        refs = task.goal["actions"]
        nxt = next((a for a in refs if call_key(a["function"], a["arguments"]) not in done), None)
        if nxt is not None and call_key(nxt["function"], nxt["arguments"]) in failed:
            nxt = None  # it failed once: give up and wrap up
        return task, done, nxt

    def _agent(self, request: ChatRequest, i: int, progress: tuple[Task, set[str], Any] | None = None) -> Any:
        task, done, nxt = progress or self._progress(request.messages)
        order_id = task.metadata["user_info"].get("order_id", BAD_ORDER)
        choice = i % 4
        if task.id in self.solved:
            if i >= self.solved[task.id]:
                return tool_call("transfer_to_human_agents", {"summary": "I cannot help with this."})
            choice = 0
        if choice == 1 and len(done) >= self.wrong_from and "reason" in task.metadata["user_info"]:
            other = "ordered by mistake" if task.metadata["user_info"]["reason"] == "no longer needed" else "no longer needed"
            return tool_call("cancel_pending_order", {"order_id": order_id, "reason": other})
        if choice == 2:
            return tool_call("get_order_details", {"order_id": BAD_ORDER})
        if choice == 3:
            return QUESTION
        if nxt is None:
            outputs = " ".join(str(o) for o in task.goal.get("outputs", []))
            return f"{FINAL} {outputs}".strip()
        return tool_call(nxt["function"], nxt["arguments"])

    # ---- the judges ------------------------------------------------------------------------------
    def _judge(self, request: ChatRequest) -> dict[str, Any]:
        text = request.messages[-1]["content"]
        if "new, easier task" in text or "new, harder task" in text:
            direction = "easier" if "new, easier" in text else "harder"
            return {"instruction": "Please cancel my order, I no longer need it.", "direction": direction}
        task = self._task(request.messages)
        refs = {call_key(a["function"], a["arguments"]) for a in task.goal["actions"]}
        if "numbered" in text:
            steps = []
            for m in re.finditer(r"^\[(\d+)\] AGENT: (.*)$", text, re.M):
                line = m.group(2)
                bad = line.startswith("call ") and line not in refs
                steps.append({"index": int(m.group(1)), "verdict": "Bad" if bad else "Good", "reason": "not a reference action" if bad else "fine"})
            return {"steps": steps}
        step = text.split("The step:\n", 1)[1].split("\n\nAfter the step:", 1)[0].strip().splitlines()[-1]
        bad = step.startswith("call ") and step not in refs
        return {"label": "bad" if bad else "good", "reason": "not a reference action" if bad else "a reference action or a message"}
