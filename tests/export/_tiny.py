"""A tiny tokenizer and model built offline, with TRL's bundled chat templates, and a loss checker.

The tokenizer is a byte-level BPE (any text encodes, as with real models) trained on the export's
own text, saved as a tokenizer directory and loaded back with `AutoTokenizer.from_pretrained` (a
tokenizer from local files, like a user's). The model is a randomly initialised Qwen2 with one
layer (`model_dir` saves both as a model directory). No hub access.

`loss_tokens` is the check the trainer tests share: given the tokens a trainer computes loss on
and the conversation they came from, it finds every message's text in the rendered chat and says
how many loss tokens fall on environment text (system, user and tool messages), on masked
assistant messages, and on trainable assistant messages.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

# A template that needs tool-call arguments as mappings (`tool_call.arguments|items`): TRL 1.16's
# patched Qwen3.5 template (chat_templates/qwen3_5_nothink_training.jinja, from Qwen3.5's tokenizer files).
MAPPING_TEMPLATE = "qwen3_5_nothink_training"
TEMPLATES = ("qwen2_5_training", "qwen3_training", MAPPING_TEMPLATE)
_SPECIAL = re.compile(r"<\|[a-z_]+\|>|</?(?:think|tool_call|tool_response|tools|function|parameter)>")


def template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from texts(v)


def tokenizer_dir(path: Path, template_name: str, corpus: list[str], chat: str | None = None) -> Path:
    """Train a byte-level BPE on `corpus`, give it TRL's `template_name` (or the template text
    `chat`), save it as a tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    chat = chat or template(template_name)
    special = sorted(set(_SPECIAL.findall(chat)) | {"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([*corpus, chat], trainers.BpeTrainer(
        vocab_size=1500, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = chat
    fast.save_pretrained(path)
    return path


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def model(tokenizer: Any) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=8192,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return Qwen2ForCausalLM(config)


def model_dir(path: Path, corpus: list[str], template_name: str = "qwen2_5_training") -> Path:
    """A tiny model directory as `from_pretrained` reads it: the tokenizer (with TRL's `template_name`) and a
    randomly initialised one-layer Qwen2 (for the transformers backend, `trajforge train`, improve)."""
    tokenizer_dir(path, template_name, corpus)
    model(load_tokenizer(path)).save_pretrained(path)
    return path


AGENT_CORPUS = ["Click the OK button.", "RootWebArea 'Click Button Task', focused", "[3] button 'OK'", "URL: http://",
                '<tool_call>\n{"name": "click", "arguments": {"bid": "3"}}\n</tool_call>', "You are an agent"] * 4
_SHARED: dict[str, Path] = {}


def shared_model_dir(tmp_path_factory: Any) -> Path:
    """One tiny agent model directory per test process (building it costs seconds), for read-only use."""
    if "model" not in _SHARED:
        _SHARED["model"] = model_dir(tmp_path_factory.mktemp("tiny-agent") / "model", AGENT_CORPUS)
    return _SHARED["model"]


def train_args(tmp_path: Path, name: str, batch: int = 2) -> dict[str, Any]:
    return dict(output_dir=str(tmp_path / f"run-{name}"), max_steps=2, per_device_train_batch_size=batch,
                learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
                dataloader_num_workers=0, seed=0, max_length=None)


@dataclass
class LossCount:
    loss: int = 0  # tokens that carry loss
    environment: int = 0  # ... that lie on system / user / tool text
    context: int = 0  # ... on assistant messages that must not be trained (masked, or in the prompt)
    trainable: int = 0  # ... on assistant messages that may be trained

    def __iadd__(self, other: "LossCount") -> "LossCount":
        for k in ("loss", "environment", "context", "trainable"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        return self

    @property
    def environment_share(self) -> float:
        return self.environment / self.loss if self.loss else 0.0


def _spans(text: str, messages: list[dict[str, Any]], trained_from: int) -> list[tuple[int, int, str]]:
    """(start, end, kind) per message in the rendered chat, found in order: a system, user or tool
    message is exactly its content; an assistant message runs from its content (or its first
    call's name) to the next message (so its tool calls and end-of-turn tokens are its own)."""
    anchors: list[tuple[int, int, str]] = []
    pos = 0
    for k, m in enumerate(messages):
        content = (m.get("content") or "").strip()
        calls = m.get("tool_calls") or []
        anchor = content or (calls[0]["function"]["name"] if calls else "")
        if not anchor:
            continue
        at = text.find(anchor, pos)
        assert at >= 0, f"message text not found in the rendered chat: {anchor[:60]!r}"
        if m["role"] != "assistant":
            kind = "environment"
        else:
            kind = "context" if k < trained_from or m.get("train") is False else "trainable"
        anchors.append((at, at + len(content) if kind == "environment" else -1, kind))
        pos = at + len(anchor)
    spans = []
    for j, (at, end, kind) in enumerate(anchors):
        spans.append((at, end if end >= 0 else (anchors[j + 1][0] if j + 1 < len(anchors) else len(text)), kind))
    return spans


def loss_tokens(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                input_ids: list[int], loss: list[bool], trained_from: int = 0,
                chat_template: str | None = None) -> LossCount:
    """Attribute the loss-carrying tokens of one example (`input_ids` as the trainer batched them).

    Assistant messages before `trained_from` (the prompt) and those with `train: false` must
    carry no loss; so must every system, user and tool message."""
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=chat_template)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == input_ids, "the trainer's tokens are not the chat rendered with this template"
    spans = _spans(text, messages, trained_from)
    count = LossCount()
    for (start, end), carries in zip(enc["offset_mapping"], loss):
        if not carries:
            continue
        count.loss += 1
        kinds = {kind for a, b, kind in spans if start < b and end > a}
        count.environment += "environment" in kinds
        count.context += "context" in kinds
        count.trainable += "trainable" in kinds
    return count


def tools_of(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    return json.loads(row["tools"]) if row["tools"] else None


def sft_counts(trainer: Any, tok: Any, data: Any) -> list[tuple[str, LossCount]]:
    """(row id, loss attribution) per row, from an SFTTrainer's prepared dataset and collator."""
    processed = trainer.train_dataset
    assert len(processed) == len(data)
    batch = trainer.data_collator([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in processed])
    out = []
    for k, row in enumerate(data):
        n = len(processed[k]["input_ids"])
        labels = batch["labels"][k][:n].tolist()
        out.append((row["id"], loss_tokens(tok, row["prompt"] + row["completion"], tools_of(row),
                                           batch["input_ids"][k][:n].tolist(), [label != -100 for label in labels],
                                           trained_from=len(row["prompt"]))))
    return out


def preference_trainer(fmt: str, tok: Any, data: Any, tmp_path: Path) -> Any:
    """A DPOTrainer (trl-dpo) or KTOTrainer (trl-kto) with the card's settings; an explicit reference
    model, since TRL would otherwise reload one by name and ours has none (no hub)."""
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    trainer, config = (DPOTrainer, DPOConfig) if fmt == "trl-dpo" else (KTOTrainer, KTOConfig)
    return trainer(model=model(tok), ref_model=model(tok), args=config(**train_args(tmp_path, fmt)),
                   train_dataset=data, processing_class=tok)


def preference_counts(trainer: Any, tok: Any, data: Any) -> list[tuple[str, str, LossCount]]:
    """(row id, side, loss attribution) per row and side, from a DPO/KTO trainer's collator:
    DPO batches every chosen sequence, then every rejected one; KTO one completion per row."""
    sides = ("chosen", "rejected") if "chosen" in data.column_names else ("completion",)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(data))])
    out = []
    for j, side in enumerate(sides):
        for k, row in enumerate(data):
            b = k + j * len(data)
            n = int(batch["attention_mask"][b].sum())
            out.append((row["id"], side, loss_tokens(tok, row["prompt"] + row[side], tools_of(row),
                                                     batch["input_ids"][b][:n].tolist(),
                                                     batch["completion_mask"][b][:n].bool().tolist(),
                                                     trained_from=len(row["prompt"]))))
    return out
