"""The model-free row path equals the models' path.

For the converters that build rows without models (`ConverterInfo.to_row`), over every shipped
sample (all of ADP's standardized samples through the `adp` converter) and a fuzz corpus of
mutated records: every record the fast path accepts validates with the pydantic models and gives
an equal row; every record the models reject is declined by the fast path and, in the convert
step, quarantined with the models' reason.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _compare import ADP_DIR, load
from _fuzz import mutated
from converters.registry import all_converters
from pipelines.columns import BatchBuilder
from pipelines.convert_work import _convert

FAST = sorted(name for name, info in all_converters().items() if info.to_row is not None)
SAMPLES = [r for f in sorted(ADP_DIR.glob("*/sample_std.json")) for r in load(f)]


def _model_row(fn: Any, raw: Any) -> tuple[Any, ...] | Exception:
    try:
        traj = fn(raw)
        builder = BatchBuilder()
        builder.add(traj)
        return builder.rows[0]
    except Exception as exc:  # what the convert step would quarantine
        return exc


def _corpus() -> list[Any]:
    small = sorted(SAMPLES, key=lambda r: len(str(r)))[:12]  # cheap seeds: mutations copy paths only
    return SAMPLES + list(mutated(small, 3000, "fast-rows"))


def test_every_fast_converter_is_covered() -> None:
    assert FAST == ["adp"]


@pytest.mark.parametrize("name", FAST)
def test_fast_rows_equal_model_rows_and_decline_what_models_reject(name: str) -> None:
    info = all_converters()[name]
    accepted = rejected = 0
    for raw in _corpus():
        fast = info.to_row(raw)
        model = _model_row(info.fn, raw)
        if isinstance(model, Exception):
            assert fast is None, f"fast path accepted what the models reject ({model}): {str(raw)[:200]}"
            rejected += 1
        elif fast is not None:
            assert repr(fast) == repr(model), str(raw)[:200]  # repr: NaN floats compare by text
            accepted += 1
    assert rejected > 1000 and accepted > 300
    # Every shipped sample takes the fast path (it is not only the models deciding).
    assert all(info.to_row(raw) is not None for raw in SAMPLES)


@pytest.mark.parametrize("name", FAST)
def test_convert_step_quarantines_the_same_records_with_the_same_reasons(name: str) -> None:
    info = all_converters()[name]
    records = [(f"corpus#{i}", raw) for i, raw in enumerate(_corpus())]
    slow_rows: list[Any] = []
    slow = _convert(records, info, lambda t: (b := BatchBuilder(), b.add(t), slow_rows.append(b.rows[0])))
    fast_builder = BatchBuilder()
    fast = _convert(records, info, fast_builder.add, fast_builder.add_row)
    assert fast[0] == slow[0]  # the same ids, in order
    assert [(q["location"], q["error"]) for q in fast[1]] == [(q["location"], q["error"]) for q in slow[1]]
    assert fast[2] == slow[2]
    assert repr(fast_builder.rows) == repr(slow_rows)
