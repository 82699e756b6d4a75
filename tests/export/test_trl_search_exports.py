"""mcts_splice + step_verify outputs -> trl-dpo / trl-kto exports -> real TRL trainers, 2 steps on CPU."""

from __future__ import annotations

import importlib.util

import pytest

from converters.export import ExportConfig, export
from generators.scripted import ScriptedRetailLLM, cancel_tasks
from tests.export import _tiny
from tests.export.test_trl_trainers import _load
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
    reports = {"dpo": export(search, root / "dpo", ExportConfig(format="trl-dpo")),
               "kto": export(verified, root / "kto", ExportConfig(format="trl-kto"))}
    loaded = {"dpo": _load(root / "dpo"), "kto": _load(root / "kto"), "reports": reports}
    corpus = [t for name in ("dpo", "kto") for row in loaded[name] for t in _tiny.texts(row)]
    loaded["tokenizer"] = _tiny.load_tokenizer(_tiny.tokenizer_dir(root / "tok", "qwen2_5_training", corpus))
    return loaded


def test_dpo_trainer_accepts_search_pairs(exports, tmp_path):
    from trl import DPOConfig, DPOTrainer

    tok, data, report = exports["tokenizer"], exports["dpo"], exports["reports"]["dpo"]
    # The search stores a trajectory-level pair and a step-level pair for each fork: at step level
    # they are the same row, written once.
    assert set(data["level"]) <= {"trajectory", "step"} and report.skipped.get("duplicate of an earlier row", 0) >= 1
    assert all(len(r["chosen"]) == len(r["rejected"]) == 1 for r in data)
    trainer = DPOTrainer(model=_tiny.model(tok), ref_model=_tiny.model(tok),
                         args=DPOConfig(**_tiny.train_args(tmp_path, "dpo")), train_dataset=data, processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2


def test_kto_trainer_accepts_step_labels(exports, tmp_path):
    from trl import KTOConfig, KTOTrainer

    tok, data = exports["tokenizer"], exports["kto"]
    assert set(data["label"]) == {True, False} and min(data["step"]) >= 1  # step-level rows
    trainer = KTOTrainer(model=_tiny.model(tok), ref_model=_tiny.model(tok),
                         args=KTOConfig(**_tiny.train_args(tmp_path, "kto")), train_dataset=data, processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2
