"""Stable, unique record ids: the source id plus a short hash of the raw record.

Upstream ids are not unique (whole datasets reuse "0"), so the id carries a content hash
too; the same raw record always gets the same id, and the upstream id stays readable and
is kept in `provenance.source_id`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from schemas import jsonutil

HASH_CHARS = 12


def content_hash(raw: Any) -> str:
    """sha256 of the canonical JSON of `raw` (sorted keys), as hex."""
    try:
        import orjson

        data = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        # Big ints or lone surrogates (broken upstream text): hash them as they are.
        data = jsonutil.dumps(raw).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def stable_id(source: str, source_id: str | None, raw: Any) -> str:
    """`<source>/<source_id>~<hash>`, or `<source>/sha256:<hash>` when the source has no id."""
    digest = content_hash(raw)[:HASH_CHARS]
    if source_id is None or source_id == "":
        return f"{source}/sha256:{digest}"
    return f"{source}/{source_id}~{digest}"
