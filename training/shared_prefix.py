"""SFT's loss computed once per shared prefix and only where it counts: the same loss and gradients, less work.

Rows made by one agent start with the same system prompt and tool list (in the improve loop about 250
of ~450 tokens), and assistant-only loss counts a few dozen tokens per row. TRL's SFT step runs every
row's whole sequence through the model and, off CUDA, projects every position through the LM head
(49k-wide for SmolLM2). `prefix_sharing_sft_trainer` changes how the step is computed, not what it
computes:

- the tokens every row of the batch shares, up to the first position whose next token is trained,
  go through the model once; their keys and values are repeated for each row (autograd sums the rows'
  gradients back into the one prefix pass, which is what the separate passes would have added up to);
- each row's remaining tokens attend to that cache at their own positions;
- the LM head projects only the positions whose next token has a label, in chunks recomputed in the
  backward pass, so no `(tokens, vocabulary)` logits are kept.

The loss is TRL's: summed negative log-likelihood over label tokens, divided by `num_items_in_batch`
(the label tokens of the whole accumulated step). Entropy, token accuracy and token counts are logged
as TRL logs them. Where the arithmetic is not provably the same, the step falls back to TRL's own: a
padding-free or packed batch, gradient checkpointing (no cache then), dropout (one mask would be shared
by all rows), scaled or soft-capped logits, label smoothing, a custom loss, MoE auxiliary losses.
tests/training/test_train.py holds loss, gradients and metrics equal to TRL's on a real batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

IGNORE = -100
# Label tokens projected through the LM head at once: bounds the logits held to CHUNK x vocabulary.
CHUNK = 1024
_SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                  "logits_scaling")
_DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout")


@dataclass
class PrefixStats:
    """What the sharing saved over a run: tokens in the batches vs tokens the model computed."""

    batches: int = 0
    shared_batches: int = 0
    tokens: int = 0
    computed: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        saved = 1 - self.computed / self.tokens if self.tokens else 0.0
        return {"batches": self.batches, "batches_with_shared_prefix": self.shared_batches,
                "tokens": self.tokens, "tokens_computed": self.computed, "saved": round(saved, 4),
                "fallbacks": dict(self.fallbacks)}


def shared_length(input_ids: Any, attention_mask: Any, labels: Any) -> int:
    """How many leading tokens every row shares and none trains on (their last position predicts no label)."""
    import torch

    lengths = attention_mask.sum(dim=1)
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)
    lcp = int(same.long().cumprod(dim=0).sum())
    labelled = (labels != IGNORE).any(dim=0).nonzero()
    first_label = int(labelled[0]) if len(labelled) else input_ids.shape[1]
    # the suffix's first hidden state predicts the token after it, so the label at `shared` must be ignored,
    # and every row keeps at least one token of its own to run
    return max(0, min(lcp, first_label - 1, int(torch.min(lengths)) - 1))


def label_loss(hidden: Any, labels: Any, head: Any) -> tuple[Any, Any, Any]:
    """(summed NLL, summed entropy, top-1 hits) of `labels` under `head(hidden)`; both are (n, ...) with n label
    positions. The logits live one chunk at a time, in the forward and again in the backward pass."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def chunk_nll(h: Any, y: Any) -> Any:
        return torch.nn.functional.cross_entropy(head(h).float(), y, reduction="sum")

    nll = hidden.new_zeros((), dtype=torch.float32)
    entropy = hidden.new_zeros((), dtype=torch.float32)
    hits = hidden.new_zeros((), dtype=torch.long)
    for start in range(0, hidden.shape[0], CHUNK):
        h, y = hidden[start:start + CHUNK], labels[start:start + CHUNK]
        nll = nll + checkpoint(chunk_nll, h, y, use_reentrant=False)
        with torch.no_grad():
            logits = head(h.detach()).float()
            logp = torch.log_softmax(logits, dim=-1)
            entropy += -(logp.exp() * logp).sum()
            hits += (logits.argmax(dim=-1) == y).sum()
    return nll, entropy, hits


def fallback_reason(trainer: Any, model: Any, inputs: dict[str, Any], return_outputs: bool) -> str | None:
    """Why this step must be TRL's own, or None."""
    core = _core(model)
    text = core.config.get_text_config()
    if return_outputs or not model.training:
        return "evaluation"
    if "labels" not in inputs or "attention_mask" not in inputs or "position_ids" in inputs:
        return "padding-free or packed batch"
    if trainer.compute_loss_func is not None or trainer.label_smoother is not None or trainer.args.loss_type != "nll":
        return "another loss"
    if trainer.aux_loss_enabled:
        return "MoE auxiliary loss"
    if any(getattr(text, name, None) not in (None, 1.0) for name in _SCALED_LOGITS):
        return "scaled logits"
    if core.get_output_embeddings() is None or getattr(core.get_output_embeddings(), "bias", None) is not None:
        return "LM head with bias"
    if not bool(inputs["attention_mask"][:, :1].all()) or not _right_padded(inputs["attention_mask"]):
        return "left padding"
    return None


def _right_padded(mask: Any) -> bool:
    import torch

    return bool(torch.all(mask[:, 1:] <= mask[:, :-1]))


def _core(model: Any) -> Any:
    """The causal LM under a PEFT wrapper (its LoRA layers are injected in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _no_dropout(core: Any) -> bool:
    text = core.config.get_text_config()
    return all(not getattr(text, name, 0) for name in _DROPOUTS)


def shared_prefix_loss(trainer: Any, model: Any, inputs: dict[str, Any], num_items_in_batch: Any,
                       stats: PrefixStats) -> tuple[Any, Any, Any, Any]:
    """(loss, label tokens, summed entropy, top-1 hits) of one step, computed as the module says."""
    import torch

    ids, mask, labels = inputs["input_ids"], inputs["attention_mask"], inputs["labels"]
    core = _core(model)
    backbone, head = core.base_model, core.get_output_embeddings()
    rows, width = ids.shape
    shared = 0
    if not getattr(core, "is_activation_checkpointing", False) and _no_dropout(core) and rows > 1:
        shared = shared_length(ids, mask, labels)
    if shared > 0:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=core.config)
        if any(type(layer) is not DynamicLayer for layer in cache.layers):  # sliding windows crop what rows see
            shared = 0
    if shared > 0:
        backbone(input_ids=ids[:1, :shared], use_cache=True, cache=cache)
        cache.batch_repeat_interleave(rows)
        positions = torch.arange(shared, width, device=ids.device).unsqueeze(0).expand(rows, -1)
        hidden = backbone(input_ids=ids[:, shared:], attention_mask=mask, position_ids=positions,
                          cache=cache, use_cache=True).last_hidden_state
        stats.shared_batches += 1
    else:
        hidden = backbone(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    # hidden state i of the suffix (position shared + i) predicts the token at shared + i + 1
    targets = labels[:, shared + 1:]
    keep = targets != IGNORE
    nll, entropy, hits = label_loss(hidden[:, :-1][keep], targets[keep], head)
    label_tokens = keep.sum()
    denominator = label_tokens if num_items_in_batch is None else num_items_in_batch
    loss = nll / torch.as_tensor(denominator, device=nll.device).clamp(min=1)
    real = int(mask.sum())
    stats.batches += 1
    stats.tokens += real
    stats.computed += real - (rows - 1) * shared
    return loss, label_tokens, entropy, hits


@lru_cache(maxsize=None)
def prefix_sharing_sft_trainer(base: type) -> type:
    """`base` (TRL's SFTTrainer) with its training step computed by `shared_prefix_loss` where that is exact."""

    class PrefixSharingSFTTrainer(base):  # type: ignore[misc, valid-type]
        prefix_stats: PrefixStats

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            if not hasattr(self, "prefix_stats"):
                self.prefix_stats = PrefixStats()
            reason = fallback_reason(self, model, inputs, return_outputs)
            if reason is not None:
                if reason != "evaluation":
                    self.prefix_stats.fallbacks[reason] = self.prefix_stats.fallbacks.get(reason, 0) + 1
                return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                            num_items_in_batch=num_items_in_batch)
            loss, label_tokens, entropy, hits = shared_prefix_loss(self, model, inputs, num_items_in_batch,
                                                                   self.prefix_stats)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            self._log_metrics(inputs, label_tokens, entropy, hits)
            return loss

        def _log_metrics(self, inputs: dict[str, Any], label_tokens: Any, entropy: Any, hits: Any) -> None:
            """The metrics TRL's own step logs (entropy and token accuracy over label tokens, tokens seen)."""
            gather = self.accelerator.gather_for_metrics
            valid = gather(label_tokens).sum()
            metrics = self._metrics["train"]
            metrics["entropy"].append((gather(entropy).sum() / valid).item() if valid > 0 else 0.0)
            metrics["mean_token_accuracy"].append((gather(hits).sum() / valid).item() if valid > 0 else 0.0)
            tokens = gather(inputs["attention_mask"].sum()).sum().item()
            self._total_train_tokens += tokens // getattr(self, "_tp_size", 1)
            metrics["num_tokens"] = [self._total_train_tokens]

    return PrefixSharingSFTTrainer
