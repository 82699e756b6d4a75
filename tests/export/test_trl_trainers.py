"""Real TRL trainers load the exports and take 2 optimizer steps; masked steps get zero loss weight.

A tiny random Llama and a word-level tokenizer trained on the export's own text (no hub
access); the chat template is set explicitly and supports system/user/assistant/tool roles,
tool calls and tools. CPU only.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from converters.export import ExportConfig, export
from tests.export import _data

pytestmark = [
    pytest.mark.trl,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install -e .[train])"),
]

CHAT_TEMPLATE = (
    "{%- if tools %}<|tools|>{% for t in tools %}{{ t.function.name }} {{ t.function.parameters | tojson }} "
    "{% endfor %}<|end|>{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>{% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<|call|>{{ c.function.name }} {{ c.function.arguments }}"
    "{% endfor %}{% endif %}<|end|>{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<pad>", "<eos>", "<|tools|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
           "<|call|>", "<|end|>"]
MASKED_MARKERS = ("MASKEDALPHA", "MASKEDTWO")
TRAINED_MARKERS = ("TRAINEDBETA", "TRAINEDGAMMA", "TRAINEDONE", "TRAINEDTHREE", "TRAINEDFOUR")


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


def _tokenizer(datasets_: list[Any]):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [t for ds in datasets_ for row in ds for t in _texts(row)]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=SPECIAL))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=4096,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def _common(tmp_path: Path, name: str, batch: int) -> dict[str, Any]:
    return dict(output_dir=str(tmp_path / f"run-{name}"), max_steps=2, per_device_train_batch_size=batch,
                learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
                dataloader_num_workers=0, seed=0)


def _load(out: Path):
    import datasets

    files = sorted(str(p) for p in (out / "data").glob("train-*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(out / ".hf-cache"))


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("trl")
    pair, chosen, rejected = _data.branch_pair()
    pair2, chosen2, rejected2 = _data.branch_pair("p2")
    trajectories = [_data.tool_traj(), _data.masked_traj(), _data.interleaved_traj(), _data.labeled_traj(),
                    chosen, rejected, chosen2, rejected2]
    src = _data.store(root / "src", trajectories, [pair, pair2])
    loaded = {}
    for fmt in ("trl-sft", "trl-dpo", "trl-kto"):
        export(src, root / fmt, ExportConfig(format=fmt))
        loaded[fmt] = _load(root / fmt)
    loaded["tokenizer"] = _tokenizer([loaded["trl-sft"], loaded["trl-dpo"], loaded["trl-kto"]])
    return loaded


def test_sft_trainer_masks_exactly_the_prompt_and_masked_steps(exports, tmp_path):
    from trl import SFTConfig, SFTTrainer

    tok, data = exports["tokenizer"], exports["trl-sft"]
    assert "prompt" in data.column_names  # masked steps in the input -> prompt-completion layout
    trainer = SFTTrainer(model=_model(tok), args=SFTConfig(**_common(tmp_path, "sft", 2)), train_dataset=data,
                         processing_class=tok)
    processed = trainer.train_dataset  # TRL 1.16 turns completion_mask into a `labels` column here
    assert len(processed) == len(data)  # nothing dropped, same order
    examples = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in processed]
    batch = trainer.data_collator(examples)
    labels, input_ids = batch["labels"].tolist(), batch["input_ids"].tolist()
    masked_ids = {tok.convert_tokens_to_ids(m) for m in MASKED_MARKERS}
    trained_ids = {tok.convert_tokens_to_ids(m) for m in TRAINED_MARKERS}
    seen_masked = seen_trained = 0
    for k, row in enumerate(data):
        tools = json.loads(row["tools"]) if row["tools"] else None
        n_prompt = len(tok.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"])
        n = len(examples[k]["input_ids"])
        assert processed[k]["input_ids"][:n_prompt] == tok.apply_chat_template(
            row["prompt"], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        assert labels[k][:n_prompt] == [-100] * n_prompt
        assert labels[k][n_prompt:n] == input_ids[k][n_prompt:n]  # every completion token is trained
        for pos, token in enumerate(input_ids[k][:n]):
            if token in masked_ids:
                assert labels[k][pos] == -100, f"masked step token trained in row {k}"
                seen_masked += 1
            if token in trained_ids and pos >= n_prompt:
                assert labels[k][pos] == token
                seen_trained += 1
    assert seen_masked >= 2 and seen_trained >= 4
    result = trainer.train()
    assert trainer.state.global_step == 2 and result.training_loss > 0


def test_dpo_trainer_takes_two_steps(exports, tmp_path):
    from trl import DPOConfig, DPOTrainer

    tok, data = exports["tokenizer"], exports["trl-dpo"]
    assert len(data) == 2
    # An explicit reference model: TRL would otherwise reload it by name, and ours has none (no hub).
    trainer = DPOTrainer(model=_model(tok), ref_model=_model(tok), args=DPOConfig(**_common(tmp_path, "dpo", 2)), train_dataset=data,
                         processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2


def test_kto_trainer_takes_two_steps(exports, tmp_path):
    from trl import KTOConfig, KTOTrainer

    tok, data = exports["tokenizer"], exports["trl-kto"]
    assert set(data["label"]) == {True, False}
    trainer = KTOTrainer(model=_model(tok), ref_model=_model(tok), args=KTOConfig(**_common(tmp_path, "kto", 2)), train_dataset=data,
                         processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2
