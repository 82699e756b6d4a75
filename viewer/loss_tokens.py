"""The tokens a trainer sees for one trajectory in one export format, each flagged when it carries loss.

Built on the tokenizer's chat template (`apply_chat_template(..., return_assistant_tokens_mask=True)`)
and the exporters' own rows, tokenized the way TRL 1.16 tokenizes each row layout:

- `messages` rows (trl-sft's messages layout, openai): loss on assistant tokens (TRL's
  `assistant_only_loss`). The template must mark them with `{% generation %}`; when the
  tokenizer's own has no markers, TRL's training template for its model family is used. Assistant
  messages of masked steps (openai `weight` 0) carry no loss.
- `prompt` / `completion` rows (trl-sft's prompt-completion layout, trl-kto): loss on every
  completion token (TRL's `completion_only_loss`); the completion starts where the tokenized
  prompt (with the generation prompt) and prompt + completion diverge, as in TRL.
- sharegpt rows are not chat messages; pairs (trl-dpo) are not trajectories: no token view.

`loss_tokens` is the one entry point the page uses.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from converters.export.formats import FORMATS
from converters.export.options import FormatOptions
from converters.export.sft import has_masked_steps
from schemas.models import Trajectory

TOKEN_FORMATS = ("trl-sft", "trl-kto", "openai")


class LossTokenError(Exception):
    """No token view for this tokenizer or format; the message is one line."""


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str) -> tuple[Any, str | None]:
    """(tokenizer, chat template with generation markers or None)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise LossTokenError("token view needs transformers (pip install trajforge[train])") from None
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise LossTokenError(f"{path}: cannot load a tokenizer ({str(exc).splitlines()[0]})") from None
    if not getattr(tok, "chat_template", None):
        raise LossTokenError(f"{path}: the tokenizer has no chat template")
    return tok, _training_template(tok)


_GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _training_template(tok: Any) -> str | None:
    if _GENERATION_MARKER.search(tok.chat_template):
        return tok.chat_template
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:
        return None
    try:
        return get_training_chat_template(tok)
    except (ValueError, TypeError):
        return None


def _tools(row: dict[str, Any]) -> Any:
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def _ids(tok: Any, messages: list[dict[str, Any]], tools: Any, template: str | None, **kwargs: Any) -> dict[str, Any]:
    return tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=True, return_dict=True,
                                   **kwargs)


def _messages_row(tok: Any, template: str | None, row: dict[str, Any]) -> tuple[list[int], list[bool]]:
    if template is None:
        raise LossTokenError("the tokenizer's chat template marks no assistant tokens ({% generation %}) and TRL "
                             "has no training template for it")
    messages, tools = row["messages"], _tools(row)
    out = _ids(tok, messages, tools, template, return_assistant_tokens_mask=True)
    ids, loss = list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
    for k, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("weight") == 0:
            start = len(_ids(tok, messages[:k], tools, template)["input_ids"]) if k else 0
            end = len(_ids(tok, messages[: k + 1], tools, template)["input_ids"])
            loss[start:end] = [False] * (end - start)
    return ids, loss


def _prompt_completion_row(tok: Any, template: str | None, row: dict[str, Any]) -> tuple[list[int], list[bool]]:
    tools = _tools(row)
    template = template or tok.chat_template
    prompt = list(_ids(tok, row["prompt"], tools, template, add_generation_prompt=True)["input_ids"])
    ids = list(_ids(tok, row["prompt"] + row["completion"], tools, template)["input_ids"])
    start = next((k for k, (a, b) in enumerate(zip(prompt, ids)) if a != b), min(len(prompt), len(ids)))
    return ids, [k >= start for k in range(len(ids))]


def loss_tokens(trajectory: Trajectory, format: str, tokenizer_path: str | Path,
                options: FormatOptions | None = None) -> list[list[tuple[str, bool]]]:
    """For each row `format` makes of `trajectory`: its tokens (text, carries loss).

    `options` are the export's (default: trl-sft's prompt-completion layout when the trajectory
    has masked steps). Raises Unrenderable when the format skips the trajectory, LossTokenError
    when there is no token view.
    """
    if format not in TOKEN_FORMATS:
        raise LossTokenError(f"no token view for {format}; token views: {', '.join(TOKEN_FORMATS)}")
    if options is None:
        options = FormatOptions(sft_layout="prompt-completion" if has_masked_steps(trajectory) else "messages")
    tok, template = _tokenizer(str(tokenizer_path))
    out = []
    for row in FORMATS[format].rows(trajectory, options):
        if "messages" in row:
            ids, loss = _messages_row(tok, template, row)
        else:
            ids, loss = _prompt_completion_row(tok, template, row)
        out.append([(tok.decode([i]), flag) for i, flag in zip(ids, loss)])
    return out
