"""The fuzz corpus: seeded mutations of real records (shared by the fuzz and differential tests)."""

from __future__ import annotations

import random
from typing import Any, Iterator

HUGE = "x" * 1_000_000


def value_paths(obj: Any, prefix: tuple = (), depth: int = 0, out: list | None = None) -> list[tuple]:
    out = [] if out is None else out
    out.append(prefix)
    if depth > 6:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            value_paths(v, prefix + (k,), depth + 1, out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            value_paths(v, prefix + (i,), depth + 1, out)
    return out


def replaced(obj: Any, path: tuple, fn) -> Any:
    """A copy of `obj` with the value at `path` replaced by fn(old) (a DROP result deletes it)."""
    if not path:
        return fn(obj)
    head, rest = path[0], path[1:]
    copy = dict(obj) if isinstance(obj, dict) else list(obj)
    new = replaced(copy[head], rest, fn)
    if new is DROP:
        del copy[head]
    else:
        copy[head] = new
    return copy


DROP = object()
_GARBAGE = [None, 0, -1, 1.5, True, "", "garbage", [], {}, [None], {"a": {"b": [1, "x", None]}}, [[[]]],
            "\ud800", b"\xff\xfe", "{\"name\": \"trunc", float("nan"), 10**30]


def mutate(value: Any, rng: random.Random) -> Any:
    op = rng.randrange(9)
    if op == 0:
        return DROP
    if op == 1:
        return rng.choice(_GARBAGE)
    if op == 2 and isinstance(value, str):
        return value[: rng.randrange(len(value) + 1)]
    if op == 3:
        return HUGE if not isinstance(value, str) else value + HUGE[: rng.choice([10, 1_000_000])]
    if op == 4 and isinstance(value, str):
        cut = rng.randrange(len(value) + 1)
        return value[:cut] + rng.choice(["\ud800", "\udfff", "\x00", "\ufffe"]) + value[cut:]
    if op == 5:
        return None
    if op == 6:
        return {"nested": [value, {"x": None}], "k": rng.choice(_GARBAGE)}
    if op == 7 and isinstance(value, (list, dict)) and value:
        return [] if isinstance(value, list) else {}
    if op == 8 and isinstance(value, str) and value[:1] in "[{":
        return value[: max(1, len(value) // 2)]  # truncated JSON string
    return rng.choice(_GARBAGE)


def mutated(base: list[Any], n: int, seed: str) -> Iterator[Any]:
    """`n` seeded mutations of the records in `base`: 1 to 3 values each dropped, replaced by
    garbage, cut, grown to ~1 MB, given lone surrogates, nested or emptied."""
    rng = random.Random(seed)
    paths = [value_paths(r) for r in base]
    for _ in range(n):
        k = rng.randrange(len(base))
        record = base[k]
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            path = rng.choice(paths[k])
            try:
                record = replaced(record, path, lambda v: mutate(v, rng))
            except (KeyError, IndexError, TypeError):
                continue  # path no longer exists after an earlier mutation
            if record is DROP:
                record = None
        yield record
