"""The interlingua's JSON Schema, generated from the models, for non-Python consumers.

The committed copy lives beside this module (`trajectory.schema.json`); a test fails when
it drifts from the models. Regenerate with `trajforge schema --write`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from schemas.models import SCHEMA_VERSION, Filtered, Pair, Quarantined, Trajectory

SCHEMA_PATH = Path(__file__).with_name("trajectory.schema.json")


def interlingua_json_schema() -> dict[str, Any]:
    """One document: the Trajectory at the root, Pair / Quarantined / Filtered in `$defs`."""
    _, defs = models_json_schema(
        [(m, "validation") for m in (Trajectory, Pair, Quarantined, Filtered)],
        ref_template="#/$defs/{model}",
    )
    all_defs = defs["$defs"]
    root = dict(all_defs["Trajectory"])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://trajforge.dev/schema/{SCHEMA_VERSION}/trajectory.schema.json",
        "title": "trajforge interlingua trajectory",
        "x-trajforge-schema-version": SCHEMA_VERSION,
        **{k: v for k, v in root.items() if k != "title"},
        "$defs": all_defs,
    }


def render() -> str:
    return json.dumps(interlingua_json_schema(), indent=2, sort_keys=True) + "\n"


def committed() -> str:
    return SCHEMA_PATH.read_text()
