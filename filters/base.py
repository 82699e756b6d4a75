"""The filter contract: a named unit that decides keep/drop for one trajectory, and its registry.

A filter has a `name` and a `decide(record) -> Decision`. Rule filters decide synchronously;
LLM judges are `async def decide`. A decision may carry a modified record (scrubbed,
annotated), which the next filter in the chain receives.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Protocol, runtime_checkable

from schemas.models import Trajectory


@dataclass(slots=True)
class Decision:
    """What a filter says about one record: keep it or not, why, and the record to pass on."""

    keep: bool
    record: Trajectory
    reason: str | None = None
    score: float | None = None


def keep(record: Trajectory, score: float | None = None) -> Decision:
    return Decision(True, record, None, score)


def drop(record: Trajectory, reason: str, score: float | None = None) -> Decision:
    return Decision(False, record, reason, score)


class FilterConfigError(ValueError):
    """A filter config that names an unknown filter or gives it bad options."""


class JudgeFailed(Exception):
    """An LLM judge got no valid answer; the chain quarantines the record (stage "judge")."""


@runtime_checkable
class Filter(Protocol):
    name: str

    def decide(self, record: Trajectory) -> Decision | Awaitable[Decision]: ...


class BaseFilter:
    """Convenience base: keeps the configured name and closes nothing."""

    name: str
    kind: ClassVar[str] = "rule"

    async def aclose(self) -> None:
        """Release resources (LLM clients); rule filters have none."""


FilterFactory = Callable[..., Filter]
_REGISTRY: dict[str, FilterFactory] = {}


def register(name: str) -> Callable[[FilterFactory], FilterFactory]:
    """Register a filter factory under `name` (its config keys become keyword arguments)."""

    def wrap(factory: FilterFactory) -> FilterFactory:
        if name in _REGISTRY:
            raise ValueError(f"filter {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def registry() -> dict[str, FilterFactory]:
    _load_builtins()
    return dict(_REGISTRY)


def is_async(f: Filter) -> bool:
    return inspect.iscoroutinefunction(f.decide)


def factories_for(specs: list[dict[str, Any]]) -> dict[str, FilterFactory]:
    """The registered factory of every filter the specs name (to ship them to other processes)."""
    _load_builtins()
    return {s["name"]: _REGISTRY[s["name"]] for s in specs if isinstance(s, dict) and s.get("name") in _REGISTRY}


def build_filter(spec: dict[str, Any], factories: dict[str, FilterFactory] | None = None) -> Filter:
    """One filter from one config entry `{name: ..., **options}`; `as:` renames it in reports.

    `factories` take precedence over the registry (a worker process gets the driver's).
    """
    _load_builtins()
    if not isinstance(spec, dict) or "name" not in spec:
        raise FilterConfigError(f"a filter entry needs a 'name': {spec!r}")
    options = dict(spec)
    name = options.pop("name")
    alias = options.pop("as", None)
    factory = (factories or {}).get(name) or _REGISTRY.get(name)
    if factory is None:
        raise FilterConfigError(f"unknown filter {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    try:
        f = factory(**options)
    except TypeError as exc:
        raise FilterConfigError(f"bad options for filter {name!r}: {exc}") from None
    f.name = alias or name
    return f


def _load_builtins() -> None:
    # Importing the modules runs their @register decorators; done lazily to avoid import cycles.
    from filters import grounding, judges, pii, policy_rules, rules, user_fidelity  # noqa: F401
