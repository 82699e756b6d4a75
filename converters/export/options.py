"""Options every format function takes (frozen, so row functions stay pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from converters.export.render import RenderOptions

SftLayout = Literal["messages", "prompt-completion"]
KtoMode = Literal["auto", "steps", "trajectory"]


@dataclass(frozen=True)
class FormatOptions:
    render: RenderOptions = field(default_factory=RenderOptions)
    # Resolved by the driver: "auto" becomes one of these before rows are made (one schema per export).
    sft_layout: SftLayout = "messages"
    kto_mode: KtoMode = "auto"
