"""Helpers for chat-shaped raw records (`conversations` / `messages` lists of role + content)."""

from __future__ import annotations

from typing import Any

from converters._util import Ctx

# Generous cap so pathological inputs fail fast instead of running regexes for minutes.
MAX_TURNS = 5000


def turns(ctx: Ctx, key: str = "conversations", role_key: str = "role", content_key: str = "content",
          roles: tuple[str, ...] | None = None, allow_empty: bool = False) -> list[tuple[str, str]]:
    """The record's turns as (role, content) string pairs, checked."""
    items = ctx.dicts(ctx.raw, key)
    if not items and not allow_empty:
        ctx.fail(f"`{key}` is empty")
    if len(items) > MAX_TURNS:
        ctx.fail(f"`{key}` has {len(items)} turns (limit {MAX_TURNS})")
    out = []
    for i, item in enumerate(items):
        role = ctx.str_(item, role_key, f"{key}[{i}]")
        content = ctx.str_(item, content_key, f"{key}[{i}]")
        if roles is not None and role not in roles:
            ctx.fail(f"`{key}[{i}].{role_key}` is {role[:40]!r}, expected one of {', '.join(roles)}")
        out.append((role, content))
    return out


def thought_map(ctx: Ctx, thoughts: Any) -> dict[str, str]:
    """The optional LLM-generated thoughts for this record: {turn index (str): thought}."""
    if thoughts is None:
        return {}
    if not isinstance(thoughts, dict):
        ctx.fail(f"thoughts mapping is {type(thoughts).__name__}, expected an object")
    if thoughts and all(isinstance(k, (str, int)) and str(k).isdigit() for k in thoughts):
        entry = thoughts  # already the per-record mapping
    else:
        entry = thoughts.get(ctx.rid)  # the whole generated_thoughts.json: {record id: {...}}
    if not isinstance(entry, dict):
        return {}
    return {str(k): v for k, v in entry.items() if isinstance(v, str)}
