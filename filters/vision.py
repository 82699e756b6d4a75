"""Page screenshots for judges: shown as images to a model that takes them, else named by their path.

Records hold screenshot paths relative to their dataset directory, never pixels. A judge of web
steps or of a finished page always gets the path and the page's text (URL, accessibility tree);
the PNG itself is attached (an OpenAI-style `image_url` part with a base64 data URL) only when the
config says the judge model accepts images (`judge.vision: true`: there is no reliable way to ask
an OpenAI-compatible server whether its model is multimodal) and the backend can carry them (the
embedded llama.cpp backend cannot).

Every fallback is counted and warned about once per run, never silent:
`judge_screenshots_text_only` (screenshots not shown: vision off or unsupported),
`judge_screenshots_missing` (the file is gone), `judge_images_refused` (a request with images got
no valid answer, e.g. a server that rejects image parts, and was asked again as text);
`judge_screenshots_shown` counts the images that were seen.
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from pathlib import Path
from typing import Any, Sequence, TypeVar

from pydantic import BaseModel

from backends.base import LLM
from schemas.models import ImageRef

log = logging.getLogger("trajforge.filters")
M = TypeVar("M", bound=BaseModel)
MAX_IMAGE_BYTES = 8 * 1024 * 1024  # a larger file is not sent (counted as missing)


def image_support(llm: LLM, vision: bool) -> tuple[bool, str]:
    """Whether screenshots go to `llm` as images, and why not when they do not."""
    if not vision:
        return False, ("judge.vision is off: the judge reads the screenshots' paths and the pages' text only "
                       "(set judge.vision: true when the judge model accepts images)")
    if llm.config.backend == "llamacpp":
        return False, "the embedded llama.cpp backend takes no images: the judge reads the pages' text only"
    return True, ""


class PageImages:
    """Attaches screenshots (paths relative to `root`) to judge requests where the judge takes images (`vision`)."""

    def __init__(self, root: Path | None, vision: bool) -> None:
        self.root = root
        self.vision = vision
        self._warned: set[str] = set()

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    def _data_url(self, ref: ImageRef, counts: Counter[str]) -> str | None:
        path = Path(ref.path)
        if not path.is_absolute() and self.root is not None:
            path = self.root / path
        try:
            data = path.read_bytes() if path.stat().st_size <= MAX_IMAGE_BYTES else None
        except OSError:
            data = None
        if data is None:
            counts["judge_screenshots_missing"] += 1
            self._warn(f"screenshot {ref.path} cannot be read under {self.root}: the judge reads that page's text only")
            return None
        kind = "png" if data.startswith(b"\x89PNG") else "jpeg"
        return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"

    async def ask(self, llm: LLM, system: str, text: str, shots: Sequence[ImageRef | None], schema: type[M],
                  counts: Counter[str], **params: Any) -> M | None:
        """`llm.structured` over `text`, with the screenshots attached as images where `llm` takes them."""
        refs = [s for s in shots if s is not None]
        images: list[dict[str, Any]] = []
        enabled, why_not = image_support(llm, self.vision)
        if refs and not enabled:
            counts["judge_screenshots_text_only"] += len(refs)
            self._warn(why_not)
        elif refs:
            for ref in refs:
                url = self._data_url(ref, counts)
                if url is not None:
                    images.append({"type": "image_url", "image_url": {"url": url}})
        sys_msg = {"role": "system", "content": system}
        if images:
            content = [{"type": "text", "text": text}, *images]
            answer = await llm.structured([sys_msg, {"role": "user", "content": content}], schema, **params)
            if answer is not None:
                counts["judge_screenshots_shown"] += len(images)
                return answer
            counts["judge_images_refused"] += 1
            self._warn("a judge request with screenshots got no valid answer (does the judge model take images?); "
                       "asked again with the pages' text only")
        return await llm.structured([sys_msg, {"role": "user", "content": text}], schema, **params)
