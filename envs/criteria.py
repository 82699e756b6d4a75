"""tau2-bench evaluation criteria, for any environment that records the tool calls it made.

A task's `goal` may hold tau2's `evaluation_criteria`: reference `actions` (`{name, arguments,
compare_args?}`), `communicate_info`, `nl_assertions` and `reward_basis`. Each criterion named in
the basis gets a verdict; the reward is their product (tau2's composition), so it is 1 only when
every checked criterion holds.

- DB: the world's state matches the state the reference actions produce. Where the environment
  can give a state digest it compares digests (its own `db_check`); elsewhere every reference
  write action must have been made successfully with the same arguments, and no other
  state-changing call may have succeeded (order is not checked); a reference write that fails on a
  fresh state (where the environment can tell) is not required, as in tau2's replay of the gold
  actions.
- ACTION: every reference action (reads too) was called with matching arguments (`compare_args`
  limits which; tau2's rule).
- COMMUNICATE: every `communicate_info` string appears in something the agent told the user
  (case-insensitive, commas ignored; tau2's rule).
- NL_ASSERTION: an LLM judge grades each assertion over the conversation; without a judge the
  criterion is recorded as unchecked and does not lower the reward.
- ENV_ASSERTION: tau2's `env_assertions`, domain functions called on the episode's world where the
  environment exposes them (`env_check`: an MCP server's tools of those names); else unchecked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

from backends.base import LLM
from envs.base import Evaluation, said_to_user
from envs.judge import check_assertions
from schemas.models import Step

CRITERIA_KEYS = ("actions", "communicate_info", "nl_assertions", "reward_basis")
DEFAULT_BASIS = ("DB", "COMMUNICATE")  # tau2's default when a task names none
KNOWN_BASIS = ("DB", "ACTION", "COMMUNICATE", "NL_ASSERTION", "ENV_ASSERTION")


@dataclass(frozen=True)
class CallRecord:
    """One tool call an environment made for the agent: what, with which (agent-visible) arguments,
    whether it succeeded, and whether the tool changes state."""

    name: str
    arguments: dict[str, Any]
    ok: bool
    writes: bool


DBCheck = Callable[[], Awaitable[dict[str, Any]]]


def has_criteria(goal: Mapping[str, Any]) -> bool:
    return any(key in goal for key in CRITERIA_KEYS)


def reference_actions(goal: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The goal's reference actions as `{name, arguments, compare_args}`."""
    out = []
    for action in goal.get("actions") or []:
        out.append({"name": action.get("name") or action.get("function"), "arguments": action.get("arguments") or {},
                    "compare_args": action.get("compare_args"), "requestor": action.get("requestor", "assistant")})
    return out


def _show(name: str, arguments: Mapping[str, Any]) -> str:
    return f"{name}({json.dumps(arguments, ensure_ascii=False, sort_keys=True)})"


def _args_match(reference: Mapping[str, Any], call: CallRecord, keys: set[str]) -> bool:
    pick = lambda args: {k: v for k, v in args.items() if k in keys}  # noqa: E731
    return reference["name"] == call.name and pick(reference["arguments"]) == pick(call.arguments)


def _same_call(reference: Mapping[str, Any], call: CallRecord) -> bool:
    """Same tool, every argument the same: a write's effect depends on all of them (compare_args is ACTION's)."""
    return _args_match(reference, call, set(reference["arguments"]) | set(call.arguments))


def _tau2_action_match(reference: Mapping[str, Any], call: CallRecord) -> bool:
    """tau2's ACTION rule: compare the arguments the call has (or compare_args), nothing else."""
    keys = reference.get("compare_args")
    return _args_match(reference, call, set(call.arguments) if keys is None else set(keys))


def db_by_reference_writes(goal: Mapping[str, Any], calls: Sequence[CallRecord], is_write: Callable[[str], bool],
                           reference_ok: Sequence[bool] | None = None) -> dict[str, Any]:
    """DB without a digest: each reference write made (successfully, same arguments), nothing else written.

    `reference_ok` says which reference actions succeed on a fresh state (where the environment
    replayed them): a reference write that fails there changes nothing, so it is not required.
    """
    made = [c for c in calls if c.ok and c.writes]
    used: set[int] = set()
    missing: list[str] = []
    refs = reference_actions(goal)
    ok = list(reference_ok) if reference_ok is not None and len(reference_ok) == len(refs) else [True] * len(refs)
    for ref in (a for a, good in zip(refs, ok) if good and is_write(a["name"])):
        hit = next((i for i, c in enumerate(made) if i not in used and _same_call(ref, c)), None)
        if hit is None:
            missing.append(_show(ref["name"], ref["arguments"]))
        else:
            used.add(hit)
    unexpected = [_show(c.name, c.arguments) for i, c in enumerate(made) if i not in used]
    passed = not missing and not unexpected
    detail = "; ".join([*(f"reference write not made: {m}" for m in missing),
                        *(f"state-changing call not in the reference: {u}" for u in unexpected)])
    return {"passed": passed, "method": "reference writes", "missing": missing, "unexpected": unexpected,
            "note": detail or "every reference write made, nothing else written"}


def action_check(goal: Mapping[str, Any], calls: Sequence[CallRecord]) -> dict[str, Any]:
    missing = [_show(a["name"], a["arguments"]) for a in reference_actions(goal)
               if not any(_tau2_action_match(a, c) for c in calls)]
    return {"passed": not missing, "missing": missing,
            "note": "; ".join(f"reference action not called: {m}" for m in missing) or "every reference action called"}


def communicate_check(goal: Mapping[str, Any], history: Sequence[Step]) -> dict[str, Any]:
    said = said_to_user(history).lower().replace(",", "")
    infos = [str(x) for x in goal.get("communicate_info") or []]
    missing = [x for x in infos if x.lower() not in said]
    return {"passed": not missing, "missing": missing,
            "note": "; ".join(f"not told to the user: {m}" for m in missing) or "everything told to the user"}


async def nl_assertion_check(goal: Mapping[str, Any], history: Sequence[Step], judge: LLM | None,
                             policy: str | None) -> dict[str, Any]:
    assertions = [str(x) for x in goal.get("nl_assertions") or []]
    if not assertions:
        return {"passed": True, "note": "no assertions to check"}
    if judge is None:
        return {"passed": None, "unchecked": True, "assertions": assertions, "note": "no judge configured"}
    results = await check_assertions(judge, history, assertions, policy)
    failed = [r.assertion for r in results if not r.met]
    return {"passed": not failed, "assertions": [r.model_dump() for r in results],
            "note": "; ".join(f"assertion not met: {f}" for f in failed) or "every assertion met"}


async def evaluate_criteria(goal: Mapping[str, Any], history: Sequence[Step], calls: Sequence[CallRecord], *,
                            is_write: Callable[[str], bool], db_check: DBCheck | None = None,
                            reference_ok: Sequence[bool] | None = None, judge: LLM | None = None,
                            policy: str | None = None, env_check: DBCheck | None = None) -> Evaluation:
    """The episode's evaluation under the goal's tau2 criteria; `details` holds each verdict."""
    basis = [str(b).upper() for b in goal.get("reward_basis") or DEFAULT_BASIS]
    unknown = sorted(set(basis) - set(KNOWN_BASIS))
    if unknown:
        return Evaluation(0.0, False, f"unknown reward_basis {', '.join(unknown)}; known: {', '.join(KNOWN_BASIS)}",
                          {"basis": basis})
    verdicts: dict[str, dict[str, Any]] = {}
    for criterion in basis:
        if criterion == "DB":
            verdicts[criterion] = (await db_check() if db_check is not None
                                   else db_by_reference_writes(goal, calls, is_write, reference_ok))
        elif criterion == "ACTION":
            verdicts[criterion] = action_check(goal, calls)
        elif criterion == "COMMUNICATE":
            verdicts[criterion] = communicate_check(goal, history)
        elif criterion == "NL_ASSERTION":
            verdicts[criterion] = await nl_assertion_check(goal, history, judge, policy)
        elif env_check is not None and goal.get("env_assertions"):
            verdicts[criterion] = await env_check()
        else:
            verdicts[criterion] = {"passed": None, "unchecked": True,
                                   "note": "environment assertions are domain code this environment cannot run"}
    failed = [c for c, v in verdicts.items() if v["passed"] is False]
    unchecked = [c for c, v in verdicts.items() if v["passed"] is None]
    reward = 0.0 if failed else 1.0
    if failed:
        reason = "failed " + "; ".join(f"{c}: {verdicts[c]['note']}" for c in failed)
    else:
        reason = f"criteria met: {', '.join(c for c in basis if c not in unchecked) or 'none'}"
    if unchecked:
        reason += "; unchecked: " + ", ".join(f"{c} ({verdicts[c]['note']})" for c in unchecked)
    return Evaluation(reward, not failed, reason, {"basis": basis, **verdicts, "failed": failed, "unchecked": unchecked})
