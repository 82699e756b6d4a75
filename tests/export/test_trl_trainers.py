"""Real TRL trainers on the default exports: loss falls only on trainable assistant tokens.

TRL 1.16's own training templates (`qwen2_5_training`, `qwen3_training`, and
`qwen3_5_nothink_training`, which iterates `tool_call.arguments|items` and so needs arguments as
mappings), a byte-level BPE tokenizer trained on the export and loaded from its directory, a
one-layer Qwen2. Each check reads the trainer's own batch tensors (SFT labels, DPO/KTO completion
masks) and attributes every loss token to the message text it lies on. CPU only.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from converters.export import ExportConfig, export, preview
from flows.cli import app
from tests.export import _data, _tiny

pytestmark = [
    pytest.mark.trl,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install -e .[train])"),
]


def _load(out: Path):
    import datasets

    files = sorted(str(p) for p in (out / "data").glob("train-*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(out / ".hf-cache"))


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("trl")
    pair, chosen, rejected = _data.branch_pair()
    pair2, chosen2, rejected2 = _data.branch_pair("p2")
    trajectories = [_data.tool_traj(), _data.masked_traj(), _data.interleaved_traj(), _data.labeled_traj(),
                    _data.masked_observation_traj(), _data.failed_traj(), chosen, rejected, chosen2, rejected2]
    src = _data.store(root / "src", trajectories, [pair, pair2])
    out: dict[str, Any] = {"src": src, "root": root, "trajectories": trajectories}
    for fmt in ("trl-sft", "trl-dpo", "trl-kto"):
        out[f"report:{fmt}"] = export(src, root / fmt, ExportConfig(format=fmt))
        out[fmt] = _load(root / fmt)
    corpus = [t for fmt in ("trl-sft", "trl-dpo", "trl-kto") for row in out[fmt] for t in _tiny.texts(row)]
    out["tokenizers"] = {name: _tiny.tokenizer_dir(root / f"tok-{name}", name, corpus) for name in _tiny.TEMPLATES}
    return out


def test_rows_keep_arguments_as_mappings_a_mapping_template_needs(hand):
    row = next(r for r in hand["trl-sft"] if r["id"] == "t-maskobs")
    call = row["completion"][0]["tool_calls"][0]["function"]
    assert call["arguments"] == {"city": "Oslo", "units": {"temp": "C"}}
    tok = _tiny.load_tokenizer(hand["tokenizers"][_tiny.MAPPING_TEMPLATE])
    rendered = tok.apply_chat_template(row["prompt"] + row["completion"], tools=_tiny.tools_of(row), tokenize=False)
    assert "<parameter=units>\n{\"temp\": \"C\"}\n</parameter>" in rendered
    as_text = json.loads(json.dumps(row["completion"]))
    as_text[0]["tool_calls"][0]["function"]["arguments"] = json.dumps(call["arguments"])
    with pytest.raises(Exception, match="mapping"):  # what JSON-string arguments did to this template
        tok.apply_chat_template(row["prompt"] + as_text, tools=_tiny.tools_of(row), tokenize=False)


@pytest.mark.parametrize("template", ["qwen2_5_training", _tiny.MAPPING_TEMPLATE])
def test_sft_trainer_trains_only_trainable_assistant_tokens(hand, tmp_path, template):
    from trl import SFTConfig, SFTTrainer

    data = hand["trl-sft"]
    assert {"prompt", "completion"} <= set(data.column_names)  # the default layout
    assert "t-failed" not in data["id"]  # success = false is left out
    tok = _tiny.load_tokenizer(hand["tokenizers"][template])
    # The settings the card gives.
    trainer = SFTTrainer(model=_tiny.model(tok), args=SFTConfig(**_tiny.train_args(tmp_path, "sft"),
                                                                  assistant_only_loss=True),
                         train_dataset=data, processing_class=tok)
    total = _tiny.LossCount()
    for row_id, count in _tiny.sft_counts(trainer, tok, data):
        assert count.environment == 0 and count.context == 0 and count.trainable > 0, (row_id, count)
        total += count
    assert total.loss > total.trainable > 0  # the rest: the template's end-of-turn tokens
    result = trainer.train()
    assert trainer.state.global_step == 2 and result.training_loss > 0


@pytest.mark.parametrize("template", ["qwen3_training", _tiny.MAPPING_TEMPLATE])
def test_dpo_trainer_prefers_on_the_next_assistant_message_only(hand, tmp_path, template):
    data = hand["trl-dpo"]
    assert len(data) == 2 and all(len(r["chosen"]) == len(r["rejected"]) == 1 for r in data)  # step level
    tok = _tiny.load_tokenizer(hand["tokenizers"][template])
    trainer = _tiny.preference_trainer("trl-dpo", tok, data, tmp_path)
    for row_id, side, count in _tiny.preference_counts(trainer, tok, data):
        assert count.environment == 0 and count.context == 0 and count.trainable > 0, (row_id, side, count)
    trainer.train()
    assert trainer.state.global_step == 2


@pytest.mark.parametrize("template", ["qwen2_5_training", _tiny.MAPPING_TEMPLATE])
def test_kto_trainer_labels_one_assistant_message_per_row(hand, tmp_path, template):
    data = hand["trl-kto"]
    assert set(data["label"]) == {True, False} and all(len(r["completion"]) == 1 for r in data)
    tok = _tiny.load_tokenizer(hand["tokenizers"][template])
    trainer = _tiny.preference_trainer("trl-kto", tok, data, tmp_path)
    for row_id, side, count in _tiny.preference_counts(trainer, tok, data):
        assert count.environment == 0 and count.context == 0 and count.trainable > 0, (row_id, count)
    trainer.train()
    assert trainer.state.global_step == 2


def test_tokenized_export_is_ready_for_sft_trainer(hand, tmp_path):
    from trl import SFTConfig, SFTTrainer

    tok_dir = hand["tokenizers"]["qwen3_training"]
    out = tmp_path / "tok"
    result = CliRunner().invoke(app, ["export", str(hand["src"]), "--format", "tokenized", "--output", str(out),
                                      "--tokenizer", str(tok_dir)])
    assert result.exit_code == 0, result.output
    data = _load(out)
    tok = _tiny.load_tokenizer(tok_dir)
    by_id = {t.id: t for t in hand["trajectories"]}
    for row in data:
        # The conversation each row is, with its per-message train flags.
        (messages_row,) = preview(by_id[row["id"]], "trl-sft", sft_layout="messages").rows
        messages = messages_row["messages"]
        count = _tiny.loss_tokens(tok, messages, _tiny.tools_of(messages_row), row["input_ids"],
                                  [bool(m) for m in row["assistant_masks"]])
        assert count.environment == 0 and count.context == 0 and count.trainable > 0, (row["id"], count)
        # Exactly transformers' assistant mask, with the masked messages' spans zeroed.
        full = tok.apply_chat_template(messages, tools=_tiny.tools_of(messages_row), tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True)
        assert full["input_ids"] == row["input_ids"]
        assert all(m <= f for m, f in zip(row["assistant_masks"], full["assistant_masks"]))
        if all(m.get("train", True) for m in messages):
            assert row["assistant_masks"] == full["assistant_masks"]
    assert "t-masked" in data["id"] and "t-maskobs" in data["id"] and "t-failed" not in data["id"]
    # Ready as it is: the default SFTConfig (no loss flags) turns assistant_masks into labels.
    trainer = SFTTrainer(model=_tiny.model(tok), args=SFTConfig(**_tiny.train_args(tmp_path, "sft-tok")),
                         train_dataset=data, processing_class=tok)
    examples = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in trainer.train_dataset]
    batch = trainer.data_collator(examples)
    for k, row in enumerate(data):
        n = len(row["input_ids"])
        expected = [i if m else -100 for i, m in zip(row["input_ids"], row["assistant_masks"])]
        assert batch["labels"][k][:n].tolist() == expected
    trainer.train()
    assert trainer.state.global_step == 2
    assert "SFTConfig(max_length=None)" in (out / "README.md").read_text()


def test_tokenized_max_length_cuts_by_turns(hand, tmp_path):
    tok_dir = hand["tokenizers"]["qwen2_5_training"]
    full = export(hand["src"], tmp_path / "full", ExportConfig(format="tokenized", tokenizer=str(tok_dir)))
    lengths = {r["id"]: len(r["input_ids"]) for r in _load(tmp_path / "full")}
    limit = sorted(lengths.values())[len(lengths) // 2]
    report = export(hand["src"], tmp_path / "cut", ExportConfig(format="tokenized", tokenizer=str(tok_dir),
                                                                 max_length=limit))
    rows = {r["id"]: r for r in _load(tmp_path / "cut")}
    tok = _tiny.load_tokenizer(tok_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for rid, row in rows.items():
        assert len(row["input_ids"]) <= limit
        if lengths[rid] > limit:
            assert row["dropped_turns"] > 0
            assert end in row["input_ids"][-2:] and row["assistant_masks"][-2] == 1  # ends on a whole assistant turn
    cut = sum(1 for n in lengths.values() if n > limit)
    assert report.notes["rows truncated by --max-length"] + report.skipped.get(
        "first trainable assistant turn does not fit in --max-length", 0) == cut > 0
    assert report.records_exported + report.skipped_total == report.records_in
    assert full.records_exported >= report.records_exported
