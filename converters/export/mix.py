"""`--mix source=weight,...`: deterministic, streaming source mixing.

Semantics: a weight is the expected number of copies of each of that source's records in the
export. 1 keeps every record, 0.25 keeps about a quarter, 2 writes every record twice,
2.5 writes every record twice and half of them a third time. The fractional part is decided by
a hash of (seed, record id), uniform in [0, 1): no state, no pre-pass, the same decision in any
order or shard layout, the same output for the same seed, a different subset for another seed.
Records of sources the mix does not list are excluded (counted as "source not in --mix").
Without --mix every record is kept once.
"""

from __future__ import annotations

import hashlib
import math


class MixError(ValueError):
    """A malformed --mix spec; the message says what is wrong."""


def parse_mix(spec: str | None) -> dict[str, float] | None:
    """"a=0.5,b=2" -> {"a": 0.5, "b": 2.0}; None or "" -> None (no mixing)."""
    if not spec:
        return None
    weights: dict[str, float] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.rpartition("=")
        if not sep or not name.strip():
            raise MixError(f"--mix entry {part!r} is not source=weight")
        try:
            weight = float(value)
        except ValueError:
            raise MixError(f"--mix weight {value!r} for {name.strip()!r} is not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise MixError(f"--mix weight for {name.strip()!r} must be a finite number >= 0, got {value}")
        weights[name.strip()] = weight
    if not weights:
        raise MixError("--mix lists no source")
    return weights


def unit_hash(seed: int, record_id: str) -> float:
    """A uniform number in [0, 1) from (seed, id), stable across runs, processes and platforms."""
    digest = hashlib.blake2b(f"{seed}\x00{record_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def copies(weight: float, seed: int, record_id: str) -> int:
    whole = math.floor(weight)
    return whole + (1 if unit_hash(seed, record_id) < weight - whole else 0)
