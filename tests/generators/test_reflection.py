"""reflection: a failed mcts path -> masked error step + reflection + a successful continuation."""

from __future__ import annotations

import asyncio

from generators.reflection import Reflection, ReflectionConfig
from schemas.store import Dataset
from generators.scripted import ScriptedRetailLLM, cancel_tasks
from tests.generators.test_step_verify import make_search_output


def test_reflection_masks_the_error_and_recovers(tmp_path):
    llm = ScriptedRetailLLM(cancel_tasks(1))
    src = make_search_output(tmp_path / "search", llm, search={"iterations": 1})
    method = Reflection(ReflectionConfig(input=str(src), locator="rules"), llm)
    failed = list(method.tasks())
    assert len(failed) >= 1
    out = Dataset.create(tmp_path / "out")
    asyncio.run(method.run(failed, out))
    fixed = {t.provenance.parent_ids[0]: t for t in out.iter_records()}
    t = fixed["mcts_splice/retail-w0-s0-0000/n2"]  # the wrong cancel right after the task
    assert [i for i, s in enumerate(t.steps) if not s.train] == [1, 2]
    assert t.steps[1].function == "cancel_pending_order" and t.steps[3].extra == {"kind": "revision"}
    assert t.success and t.reward == 1.0 and t.details["reflection"]["reflection_index"] == 3
    # The continuation ran from the state before the error: the correct cancel succeeded.
    assert any(s.kind == "api" and s.function == "cancel_pending_order" and s.train for s in t.steps[4:])
