"""The tokens a trainer sees for one trajectory in one export format, each flagged when it carries loss.

A thin view over the exporter's own `converters.export.preview`, which tokenizes each row with the
tokenizer's chat template and marks the tokens that carry loss under the trainer settings the
export's card gives (trl-sft: the assistant tokens of the completion, or of every assistant
message in the messages layout; trl-kto: the completion; openai: weight-1 assistant messages;
tokenized: its `assistant_masks`). sharegpt rows are not chat messages and pairs (trl-dpo) are not
trajectories: no token view.

`loss_tokens` is the one entry point the page uses.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from converters.export import preview
from converters.export.options import FormatOptions
from converters.export.render import Unrenderable
from converters.export.tokenized import ChatTokenizer, TokenizerError
from schemas.models import Trajectory

TOKEN_FORMATS = ("trl-sft", "trl-kto", "openai", "tokenized")


class LossTokenError(Exception):
    """No token view for this tokenizer or format; the message is one line."""


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str) -> ChatTokenizer:
    try:
        return ChatTokenizer.load(path)
    except TokenizerError as exc:
        raise LossTokenError(f"{path}: cannot load a tokenizer ({exc})") from None


def loss_tokens(trajectory: Trajectory, format: str, tokenizer_path: str | Path,
                options: FormatOptions | None = None) -> list[list[tuple[str, bool]]]:
    """For each row `format` makes of `trajectory`: its tokens (text, carries loss).

    `options` are the export's (default: its defaults). Raises Unrenderable when the format skips
    the trajectory, LossTokenError when there is no token view.
    """
    if format not in TOKEN_FORMATS:
        raise LossTokenError(f"no token view for {format}; token views: {', '.join(TOKEN_FORMATS)}")
    kw: dict[str, Any] = {}
    if options is not None:
        kw = {"sft_layout": options.sft_layout, "kto_mode": options.kto_mode, "reasoning": options.render.reasoning,
              "web_max_chars": options.render.web_max_chars, "history": options.history}
    try:
        p = preview(trajectory, format, tokenizer=_tokenizer(str(tokenizer_path)), **kw)
    except TokenizerError as exc:
        raise LossTokenError(str(exc)) from None
    if p.skipped is not None:
        raise Unrenderable(p.skipped)
    return [[(text, bool(flag)) for text, flag in zip(view.tokens, view.mask)] for views in p.tokens or [] for view in views]
