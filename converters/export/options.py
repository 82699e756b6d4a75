"""Options every format function takes (frozen, so row functions stay pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from converters.export.render import RenderOptions

if TYPE_CHECKING:
    from converters.export.tokenized import ChatTokenizer

SftLayout = Literal["messages", "prompt-completion"]
KtoMode = Literal["auto", "steps", "turns", "trajectory"]
DpoLevel = Literal["step", "trajectory"]
History = Literal["request", "full"]

SFT_LAYOUTS = ("prompt-completion", "messages")
KTO_MODES = ("auto", "steps", "turns", "trajectory")
DPO_LEVELS = ("step", "trajectory")
HISTORIES = ("request", "full")


@dataclass(frozen=True)
class FormatOptions:
    render: RenderOptions = field(default_factory=RenderOptions)
    sft_layout: SftLayout = "prompt-completion"
    kto_mode: KtoMode = "auto"
    dpo_level: DpoLevel = "step"
    # `tokenized` only: the user's tokenizer and chat template, and the length limit.
    tokenizer: "ChatTokenizer | None" = None
    # "request": a record with render settings trains each assistant message on the request that produced
    # it; "full": on the whole history before it (see docs/export.md).
    history: History = "request"
    # `tokenized`: the ids of model calls that recorded theirs ("recorded"), or the template's render ("rendered").
    tokens: Literal["recorded", "rendered"] = "recorded"
    # Rows the layout or chat template cannot train as recorded: skipped with the reason (else the export stops).
    skip_unfit: bool = False
