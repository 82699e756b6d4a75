"""The rule check of a service policy (tau2's retail and airline): the agent authenticates the user before it
touches private data, and makes each write only after stating it and hearing an explicit yes.

    filters: [{name: policy_rules}]                                  # each record's tau2 domain, else retail's
    filters: [{name: policy_rules, domain: airline}]                 # a domain's rules (DOMAINS)
    filters: [{name: policy_rules, auth_tools: [], write_tools: [book_reservation, ...]}]

The rules differ by domain (`DOMAINS`, read from tau2-bench's policies): retail authenticates the user by a lookup
(email, or name and zip) and lists the tools that read nothing private; airline has no lookup (the user id is the
credential the user gives) and confirms every write; mock asks for neither. A record's domain is its tau2 task's
(`details.task`: the scenario's `domain`, else the `tau2-<domain>-` id); `domain` or the tool lists override it.

- Authentication: a tool outside `auth_tools` and `public_tools` called before an authentication tool
  answered without an error is a violation ("acts before authentication"). `auth_tools: []` turns it off
  (a domain where the user's id is its credential).
- Confirmation: every call of a write tool needs, since the previous write, an agent message asking for
  confirmation (a question that asks to confirm or proceed) answered by a user message that opens with an
  explicit yes. Each write is confirmed on its own ("writes without a confirmation").

The write tools are `write_tools`, else the record's tools less the environment's `read_only_tools`
(`details.env_config`). Calls given as context (tau2's message history, `extra.given`) are not the agent's
turns: they break no rule, though a confirmation or lookup among them counts. Every method that acts in an
environment holds its successes to this check (a success that breaks it is recorded as a failure,
generators/env_method.py), demonstrations from blueprints drop violators, step_verify labels violating steps bad.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envs.scenario_user import CONFIRM_ASK
from filters.base import BaseFilter, Decision, drop, keep, register
from schemas.models import Step, Trajectory

# tau2 retail: the user is located by email or by name and zip code; these tools read nothing private.
AUTH_TOOLS = ("find_user_id_by_name_zip", "find_user_id_by_email")
PUBLIC_TOOLS = ("calculate", "list_all_product_types", "get_product_details", "transfer_to_human_agents", "think")


@dataclass(frozen=True)
class Rules:
    """A policy's rules as the check reads them: the tools that authenticate, those allowed before, and whether
    each write needs a stated action and an explicit yes."""

    auth_tools: tuple[str, ...] = ()
    public_tools: tuple[str, ...] = ()
    confirm_writes: bool = True


# tau2-bench's domains, from their policies: retail "authenticate the user identity by locating their user id via
# email, or via name + zip code"; airline "must first obtain the user id from the user" (no lookup: the id is the
# credential) and "obtain explicit user confirmation (yes)" before a write; mock's policy asks for neither.
DOMAINS: dict[str, Rules] = {
    "retail": Rules(AUTH_TOOLS, PUBLIC_TOOLS),
    "airline": Rules(),
    "mock": Rules(confirm_writes=False),
}


def domain_of(task: Mapping[str, Any] | None) -> str | None:
    """A tau2 task's domain (a task as `details["task"]` keeps it): its scenario's, else its `tau2-<domain>-` id."""
    if not task:
        return None
    scenario = (task.get("metadata") or {}).get("user_scenario")
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else None
    if isinstance(instructions, dict) and isinstance(instructions.get("domain"), str):
        return instructions["domain"]
    parts = str(task.get("id") or "").split("-")
    return parts[1] if len(parts) > 2 and parts[0] == "tau2" and parts[1] in DOMAINS else None


class PolicyCheck(BaseModel):
    """`policy_check`: the policy's rules a method's rows are checked by (defaults: the tau2 domain's, `DOMAINS`)."""

    model_config = ConfigDict(extra="forbid")

    domain: str | None = Field(None, description=f"the rules of a tau2 domain ({', '.join(DOMAINS)}); default: each "
                                                 "task's own domain")
    auth_tools: list[str] | None = Field(None, description="tools that authenticate the user ([]: no such rule)")
    public_tools: list[str] | None = Field(None, description="tools that read nothing private (allowed before)")
    confirm_writes: bool | None = Field(None, description="each write needs a stated action and an explicit yes")

    @field_validator("domain")
    @classmethod
    def _known_domain(cls, domain: str | None) -> str | None:
        if domain is not None and domain not in DOMAINS:
            raise ValueError(f"unknown domain {domain!r} (known: {', '.join(DOMAINS)})")
        return domain

    def rules(self, task: Mapping[str, Any] | None, default: Rules | None = None) -> Rules | None:
        """The rules for `task`: the named or the task's domain, the given tools over them; `default` where neither
        names a domain and no tools are given (None: nothing to check)."""
        base = DOMAINS.get(self.domain or domain_of(task) or "")
        given = any(v is not None for v in (self.auth_tools, self.public_tools, self.confirm_writes))
        if base is None and not given:
            return default
        base = base or default or Rules()
        return Rules(tuple(base.auth_tools if self.auth_tools is None else self.auth_tools),
                     tuple(base.public_tools if self.public_tools is None else self.public_tools),
                     base.confirm_writes if self.confirm_writes is None else self.confirm_writes)
EXPLICIT_YES = re.compile(r"^\W*(yes|yeah|yep|sure|confirm(?:ed)?|go ahead|please (?:do|go ahead|proceed)|"
                          r"i confirm|correct|that's right|ok(?:ay)?,? (?:go|do it|proceed))\b", re.I)
UNAUTHENTICATED = "acts before authentication"
UNCONFIRMED = "writes without a confirmation"


def write_tools_of(record: Trajectory) -> set[str]:
    """The record's state-changing tools: all its tools less the environment's declared read-only ones (a world
    simulated from an MCP server declares them with the server's config, `from_mcp`)."""
    config = record.details.get("env_config") or {}
    declared = config.get("read_only_tools") or (config.get("from_mcp") or {}).get("read_only_tools")
    return {t.name for t in record.tools or []} - set(declared or [])


def policy_violations(steps: Sequence[Step], *, writes: Iterable[str], auth_tools: Iterable[str] = AUTH_TOOLS,
                      public_tools: Iterable[str] = PUBLIC_TOOLS, confirm_writes: bool = True
                      ) -> list[tuple[int, str, str]]:
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
                if confirm_writes and not confirmed and not given:
                    out.append((i, UNCONFIRMED, f"{step.function} without an explicit yes to a stated action"))
                asked = confirmed = False
    return out


def violations_of(record: Trajectory, rules: Rules, writes: Iterable[str] | None = None) -> list[tuple[int, str, str]]:
    """`policy_violations` of a record under `rules` (its writes: `writes`, else `write_tools_of`)."""
    return policy_violations(record.steps, writes=write_tools_of(record) if writes is None else writes,
                             auth_tools=rules.auth_tools, public_tools=rules.public_tools,
                             confirm_writes=rules.confirm_writes)


def describe(found: Sequence[tuple[int, str, str]]) -> str:
    step, rule, what = found[0]
    return f"policy: {rule} (step {step}: {what})"


@register("policy_rules")
class PolicyRules(BaseFilter):
    """Drops a trajectory whose agent writes without a confirmation or acts before authentication."""

    def __init__(self, domain: str | None = None, auth_tools: list[str] | None = None,
                 public_tools: list[str] | None = None, write_tools: list[str] | None = None,
                 confirm_writes: bool | None = None) -> None:
        self.check = PolicyCheck(domain=domain, auth_tools=auth_tools, public_tools=public_tools,
                                 confirm_writes=confirm_writes)
        self.write_tools = None if write_tools is None else set(write_tools)

    def decide(self, record: Trajectory) -> Decision:
        rules = self.check.rules(record.details.get("task"), DOMAINS["retail"])
        assert rules is not None
        found = violations_of(record, rules, self.write_tools)
        return drop(record, describe(found)) if found else keep(record)

