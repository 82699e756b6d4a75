"""The rule check of a service policy (tau2's retail and airline): the agent authenticates the user before it
touches private data, and makes each write only after stating it and hearing an explicit yes.

    filters: [{name: policy_rules}]                                  # tau2 retail's tools by default
    filters: [{name: policy_rules, auth_tools: [], write_tools: [book_reservation, ...]}]

- Authentication: a tool outside `auth_tools` and `public_tools` called before an authentication tool
  answered without an error is a violation ("acts before authentication"). `auth_tools: []` turns it off
  (a domain where the user's id is its credential).
- Confirmation: every call of a write tool needs, since the previous write, an agent message asking for
  confirmation (a question that asks to confirm or proceed) answered by a user message that opens with an
  explicit yes. Each write is confirmed on its own ("writes without a confirmation").

The write tools are `write_tools`, else the record's tools less the environment's `read_only_tools`
(`details.env_config`). Calls given as context (tau2's message history, `extra.given`) are not the agent's
turns: they break no rule, though a confirmation or lookup among them counts. Demonstrations built from blueprints (generators/blueprint.py) run this check and drop violators.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from envs.scenario_user import CONFIRM_ASK
from filters.base import BaseFilter, Decision, drop, keep, register
from schemas.models import Step, Trajectory

# tau2 retail: the user is located by email or by name and zip code; these tools read nothing private.
AUTH_TOOLS = ("find_user_id_by_name_zip", "find_user_id_by_email")
PUBLIC_TOOLS = ("calculate", "list_all_product_types", "get_product_details", "transfer_to_human_agents", "think")
EXPLICIT_YES = re.compile(r"^\W*(yes|yeah|yep|sure|confirm(?:ed)?|go ahead|please (?:do|go ahead|proceed)|"
                          r"i confirm|correct|that's right|ok(?:ay)?,? (?:go|do it|proceed))\b", re.I)
UNAUTHENTICATED = "acts before authentication"
UNCONFIRMED = "writes without a confirmation"


def write_tools_of(record: Trajectory) -> set[str]:
    """The record's state-changing tools: all its tools less the environment's declared read-only ones."""
    read_only = set(((record.details.get("env_config") or {}).get("read_only_tools")) or [])
    return {t.name for t in record.tools or []} - read_only


def policy_violations(steps: Sequence[Step], *, writes: Iterable[str], auth_tools: Iterable[str] = AUTH_TOOLS,
                      public_tools: Iterable[str] = PUBLIC_TOOLS) -> list[tuple[int, str, str]]:
    """(step, rule, what) for each call that breaks the policy's rules (see the module doc)."""
    writes, auth, public = set(writes), set(auth_tools), set(public_tools)
    authenticated = not auth
    asked = confirmed = False
    out: list[tuple[int, str, str]] = []
    for i, step in enumerate(steps):
        if step.kind == "message":
            asked, confirmed = "?" in step.content and CONFIRM_ASK.search(step.content) is not None, False
        elif step.kind == "text" and step.source == "user":
            confirmed = asked and EXPLICIT_YES.search(step.content) is not None
        elif step.kind == "api":
            answer = steps[i + 1] if i + 1 < len(steps) else None
            failed = answer is None or str(getattr(answer, "content", "")).startswith("Error")
            given = bool(step.extra.get("given"))  # the task's conversation so far: context, not this agent's turn
            if step.function in auth:
                authenticated = authenticated or not failed
            elif step.function not in public and not authenticated and not given:
                out.append((i, UNAUTHENTICATED, f"{step.function} before the user was authenticated"))
            if step.function in writes:
                if not confirmed and not given:
                    out.append((i, UNCONFIRMED, f"{step.function} without an explicit yes to a stated action"))
                asked = confirmed = False
    return out


@register("policy_rules")
class PolicyRules(BaseFilter):
    """Drops a trajectory whose agent writes without a confirmation or acts before authentication."""

    def __init__(self, auth_tools: list[str] | None = None, public_tools: list[str] | None = None,
                 write_tools: list[str] | None = None) -> None:
        self.auth_tools = AUTH_TOOLS if auth_tools is None else tuple(auth_tools)
        self.public_tools = PUBLIC_TOOLS if public_tools is None else tuple(public_tools)
        self.write_tools = None if write_tools is None else set(write_tools)

    def decide(self, record: Trajectory) -> Decision:
        found = policy_violations(record.steps, writes=self.write_tools or write_tools_of(record),
                                  auth_tools=self.auth_tools, public_tools=self.public_tools)
        if not found:
            return keep(record)
        step, rule, what = found[0]
        return drop(record, f"policy: {rule} (step {step}: {what})")

