"""mcts_splice + step_verify outputs -> trl-dpo / trl-kto exports -> real TRL trainers, 2 steps on CPU."""

from __future__ import annotations

import importlib.util

import pytest

from converters.export import ExportConfig, export
from tests.export.test_trl_trainers import _common, _load, _model, _tokenizer
from generators.scripted import ScriptedRetailLLM, cancel_tasks
from tests.generators.test_step_verify import make_verified_output

pytestmark = [
    pytest.mark.trl,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install -e .[train])"),
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("search-trl")
    llm = ScriptedRetailLLM(cancel_tasks(1))
    search, verified, _ = make_verified_output(root, llm, search={"iterations": 2}, max_pairs_per_task=2)
    export(search, root / "dpo", ExportConfig(format="trl-dpo"))
    export(verified, root / "kto", ExportConfig(format="trl-kto"))
    loaded = {"dpo": _load(root / "dpo"), "kto": _load(root / "kto")}
    loaded["tokenizer"] = _tokenizer([loaded["dpo"], loaded["kto"]])
    return loaded


def test_dpo_trainer_accepts_search_pairs(exports, tmp_path):
    from trl import DPOConfig, DPOTrainer

    tok, data = exports["tokenizer"], exports["dpo"]
    assert len(data) == 4 and set(data["level"]) == {"trajectory", "step"}
    # The retail tool specs make long prompts: no truncation (TRL would drop them as fully truncated).
    trainer = DPOTrainer(model=_model(tok), ref_model=_model(tok), args=DPOConfig(**_common(tmp_path, "dpo", 2), max_length=None),
                         train_dataset=data, processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2


def test_kto_trainer_accepts_step_labels(exports, tmp_path):
    from trl import KTOConfig, KTOTrainer

    tok, data = exports["tokenizer"], exports["kto"]
    assert set(data["label"]) == {True, False} and min(data["step"]) >= 1  # step-level examples
    trainer = KTOTrainer(model=_model(tok), ref_model=_model(tok), args=KTOConfig(**_common(tmp_path, "kto", 2), max_length=None),
                         train_dataset=data, processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2
