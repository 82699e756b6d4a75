"""Validate an environment before spending GPU hours on it: `trajforge envs check`.

For every task of an env config, two agents that need no model:

- the task's reference solution (`env.reference_solution`: for tau2 tasks, the reference actions,
  then a message carrying what the user must hear), which a healthy environment passes;
- a do-nothing agent (one message, "I cannot help with that."), which a healthy environment
  fails, except on tasks that ask for no change and no information (a pass that leans on a
  criterion nothing checked, such as NL assertions without a judge, is reported as such).

The references run twice: first each task alone, then every task's reference and do-nothing agent
side by side, `concurrency` episodes at a time on shared server sessions. A healthy environment
repeats itself: the same calls in a fresh episode give the same results either way. A call that
failed in one pass and not in the other is a *tool error* (state leaking between episodes, a
flaky server); a call that fails in both is part of the task's own reference (tau2's references
sometimes probe a wrong email first) as far as the task declares such probes (`goal.probes`, a
reference action's `probe: true`, or the config's `tasks.probes`); more than that is a broken
environment (a server pointed at the wrong place fails every call, and its references "pass"
because failed writes are not required).

Healthy means: there are references, every reference passes, no tool error, no environment error,
no failing reference call beyond the declared probes, and do-nothing passes no task whose
reference changes state (a digest or a check that cannot see a change passes anything).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence

from envs.base import EnvError, Environment, Task
from envs.spec import EnvFactory
from schemas.models import Action, ApiAction, MessageAction

DO_NOTHING = "I cannot help with that."


class Progress(Protocol):
    def start(self, total: int, completed: int = 0) -> None: ...

    def advance(self, n: int = 1) -> None: ...


@dataclass(frozen=True)
class CallError:
    task: str
    index: int  # position in the reference solution
    tool: str
    error: str


@dataclass
class TaskResult:
    task: str
    reference: bool | None = None  # None: the task has no reference solution
    reference_reason: str = ""
    do_nothing: bool | None = None
    do_nothing_reason: str = ""
    do_nothing_unchecked: list[str] = field(default_factory=list)  # criteria the verdict could not check
    reference_writes: bool | None = None  # a reference call that changes state succeeded (None: unknown)
    env_error: str | None = None


@dataclass
class CheckReport:
    env: str
    tasks: int
    with_reference: int
    reference_passed: int
    do_nothing_passed: int
    tool_errors: list[CallError]
    reference_errors: list[CallError]  # calls that fail in the reference itself, alone and together
    steps: int
    seconds_per_step: float
    wall_seconds: float
    results: list[TaskResult] = field(default_factory=list)
    unexpected_reference_errors: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (failed, probes)

    @property
    def problems(self) -> list[str]:
        """Why the environment is not healthy, one line each (empty: healthy)."""
        out = []
        if not self.with_reference:
            out.append("no task has a reference solution (goal.actions): nothing shows the tasks can be solved here")
        elif self.reference_passed < self.with_reference:
            out.append(f"{self.with_reference - self.reference_passed} of {self.with_reference} references failed")
        if self.tool_errors:
            out.append(f"{len(self.tool_errors)} reference call(s) gave different outcomes alone and side by side "
                       "(state shared between episodes, or a flaky server)")
        if self.env_errors:
            out.append(f"{len(self.env_errors)} task(s) ended with an environment error")
        for task, (failed, probes) in self.unexpected_reference_errors.items():
            out.append(f"{task}: {failed} reference call(s) failed in both passes, more than its {probes} declared "
                       "probe(s) (goal.probes, tasks.probes)")
        for r in self.results:
            if r.do_nothing and r.reference_writes:
                out.append(f"{r.task}: do-nothing passed though the reference changes state (the evaluation does not "
                           "see the change: a state digest that misses it?)")
        return out

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def env_errors(self) -> list[TaskResult]:
        return [r for r in self.results if r.env_error]

    def as_dict(self) -> dict[str, Any]:
        return {
            "env": self.env, "tasks": self.tasks, "healthy": self.healthy, "problems": self.problems,
            "reference": {"passed": self.reference_passed, "total": self.with_reference,
                          "rate": _rate(self.reference_passed, self.with_reference),
                          "failed": {r.task: r.reference_reason for r in self.results if r.reference is False}},
            "do_nothing": {"passed": self.do_nothing_passed, "total": self.tasks,
                           "rate": _rate(self.do_nothing_passed, self.tasks),
                           "passed_tasks": [r.task for r in self.results if r.do_nothing],
                           # passes that lean on a criterion nothing checked (NL assertions without a judge)
                           "passed_unchecked": {r.task: r.do_nothing_unchecked for r in self.results
                                                if r.do_nothing and r.do_nothing_unchecked}},
            "tool_errors": len(self.tool_errors), "tool_error_calls": [asdict(e) for e in self.tool_errors],
            "reference_errors": len(self.reference_errors),
            "reference_error_calls": [asdict(e) for e in self.reference_errors],
            "unexpected_reference_errors": {t: {"failed": f, "probes": p}
                                            for t, (f, p) in self.unexpected_reference_errors.items()},
            "env_errors": {r.task: r.env_error for r in self.env_errors},
            "steps": self.steps, "seconds_per_step": round(self.seconds_per_step, 5),
            "wall_seconds": round(self.wall_seconds, 2),
        }


def _rate(n: int, total: int) -> float | None:
    return round(n / total, 4) if total else None


@dataclass
class _Run:
    errors: dict[int, str] = field(default_factory=dict)  # reference index -> error
    steps: int = 0
    played: int = 0  # actions played before the episode ended
    seconds: float = 0.0


async def _play(env: Environment, task: Task, actions: Sequence[Action], run: _Run) -> None:
    """A fresh episode of `task` playing `actions` (until the episode ends)."""
    await env.reset(task)
    for i, action in enumerate(actions):
        if env.done:
            break
        started = time.perf_counter()
        result = await env.step(action)
        run.seconds += time.perf_counter() - started
        run.steps += 1
        run.played = i + 1
        if result.info.get("error"):
            run.errors[i] = str(result.info["error"])


async def check_env(factory: EnvFactory, tasks: Sequence[Task], *, concurrency: int = 4,
                    progress: Progress | None = None) -> CheckReport:
    """Reference and do-nothing agents over `tasks`; see the module doc."""
    started = time.perf_counter()
    results = {t.id: TaskResult(t.id) for t in tasks}
    references: dict[str, list[Action] | None] = {}
    alone: dict[str, _Run] = {}
    together: dict[str, _Run] = {}
    if progress is not None:
        progress.start(2 * len(tasks))

    async def solo(env: Environment, task: Task) -> None:
        references[task.id] = reference = await env.reference_solution(task)
        if reference is not None:
            alone[task.id] = run = _Run()
            await _play(env, task, reference, run)

    async def both(env: Environment, task: Task) -> None:
        result = results[task.id]
        reference = references.get(task.id)
        if reference is not None:
            together[task.id] = run = _Run()
            await _play(env, task, reference, run)
            verdict = await env.evaluate()
            result.reference, result.reference_reason = verdict.success, verdict.reason
            writes = getattr(env, "state_changing_tools", None)
            if writes is not None:
                result.reference_writes = any(isinstance(a, ApiAction) and a.function in writes and i not in run.errors
                                              for i, a in enumerate(reference[:run.played]))
        await _play(env, task, [MessageAction(content=DO_NOTHING)], _Run())
        verdict = await env.evaluate()
        result.do_nothing, result.do_nothing_reason = verdict.success, verdict.reason
        result.do_nothing_unchecked = list(verdict.details.get("unchecked") or [])

    # One environment stays open across both passes, so they share the servers a run would share.
    async with factory.make():
        await _each(factory, tasks, solo, 1, results, progress)
        await _each(factory, [t for t in tasks if not results[t.id].env_error], both, concurrency, results, progress)

    tool_errors: list[CallError] = []
    reference_errors: list[CallError] = []
    unexpected: dict[str, tuple[int, int]] = {}
    for task in tasks:
        reference = references.get(task.id)
        if reference is None or task.id not in together:
            continue
        first, second = alone[task.id].errors, together[task.id].errors
        both_failed = 0
        for i in sorted(set(first) | set(second)):
            tool = reference[i].function if isinstance(reference[i], ApiAction) else reference[i].kind
            error = CallError(task.id, i, tool, second.get(i) or first[i])
            (reference_errors if i in first and i in second else tool_errors).append(error)
            both_failed += i in first and i in second
        probes = declared_probes(task)
        if both_failed > probes:
            unexpected[task.id] = (both_failed, probes)
    runs = list(alone.values())
    steps = sum(r.steps for r in runs)
    return CheckReport(
        env=factory.spec.env, tasks=len(tasks), with_reference=sum(1 for r in references.values() if r is not None),
        reference_passed=sum(1 for r in results.values() if r.reference), do_nothing_passed=sum(
            1 for r in results.values() if r.do_nothing), tool_errors=tool_errors, reference_errors=reference_errors,
        steps=steps, seconds_per_step=sum(r.seconds for r in runs) / steps if steps else 0.0,
        wall_seconds=time.perf_counter() - started, results=list(results.values()),
        unexpected_reference_errors=unexpected)


def declared_probes(task: Task) -> int:
    """Reference calls the task expects to fail: `goal.probes`, `metadata.probes` (the config's
    `tasks.probes`), or reference actions marked `probe: true`, whichever says most."""
    marked = sum(1 for a in task.goal.get("actions") or [] if isinstance(a, dict) and a.get("probe") is True)
    counts = [task.goal.get("probes"), task.metadata.get("probes")]
    return max([marked, *(c for c in counts if isinstance(c, int) and not isinstance(c, bool))])


async def _each(factory: EnvFactory, tasks: Sequence[Task], work: Any, workers: int, results: dict[str, TaskResult],
                progress: Progress | None) -> None:
    """Run `work(env, task)` over `tasks` with `workers` environments; an EnvError fails that task only."""
    queue: asyncio.Queue[Task] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)

    async def worker() -> None:
        async with factory.make() as env:
            while not queue.empty():
                task = queue.get_nowait()
                try:
                    await work(env, task)
                except EnvError as exc:
                    results[task.id].env_error = str(exc)
                    if results[task.id].reference is None:
                        results[task.id].reference_reason = f"env error: {exc}"
                if progress is not None:
                    progress.advance()

    await asyncio.gather(*(worker() for _ in range(max(1, min(workers, len(tasks))))))


def summary_rows(report: CheckReport) -> list[tuple[str, str]]:
    """The report as (what, value) rows for a table."""
    return [("environment", report.env), ("tasks", str(report.tasks)),
            ("reference passed", f"{report.reference_passed}/{report.with_reference}"),
            ("do-nothing passed", f"{report.do_nothing_passed}/{report.tasks}"),
            ("  of which only through unchecked criteria",
             str(sum(1 for r in report.results if r.do_nothing and r.do_nothing_unchecked))),
            ("tool errors in reference replays", str(len(report.tool_errors))),
            ("failing calls in the references themselves", str(len(report.reference_errors))),
            ("  of which beyond the tasks' declared probes",
             str(sum(f - p for f, p in report.unexpected_reference_errors.values()))),
            ("environment errors", str(len(report.env_errors))),
            ("seconds per step", f"{report.seconds_per_step:.4f}"), ("wall seconds", f"{report.wall_seconds:.1f}")]

