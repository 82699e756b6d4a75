"""An MCP tool result as the observation the agent gets, keeping what the server sent.

Text blocks are text. Images (and audio) are decoded and stored as files through
`EpisodeFiles` (records hold paths, never pixels); resource links keep their URI, name and MIME
type; embedded resources keep their text, or their blob stored as a file. A result that is one
image is an `image` observation; any other mix is one text observation with the blocks in order,
each non-text block as a bracketed line (`[image: <path>]`, as the renderer shows image
observations), and the blocks themselves in `extra["content"]`.
"""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from typing import Any

from mcp_types import CallToolResult

from envs.episode_files import EpisodeFiles
from schemas.models import ImageObservation, ImageRef, Observation, TextObservation

STORED = ("image", "audio")  # blocks whose bytes become files


def _suffix(mime: str | None) -> str:
    return (mimetypes.guess_extension(mime) if mime else None) or ".bin"


def _store(files: EpisodeFiles | None, data: str | None, mime: str | None, kind: str) -> tuple[str | None, str]:
    """(the stored file's path, else None; why it was not stored)."""
    if files is None:
        return None, "not stored: the environment has no output directory"
    try:
        raw = base64.b64decode("".join((data or "").split()), validate=True)  # line-wrapped base64 is base64
    except (binascii.Error, ValueError):
        return None, f"not stored: the server's {kind} data is not base64"
    return files.write(raw, _suffix(mime)), ""


def content_part(block: Any, files: EpisodeFiles | None) -> tuple[str, dict[str, Any]]:
    """One content block: (its text for the agent, what a record keeps of it)."""
    kind = getattr(block, "type", "unknown")
    mime = getattr(block, "mime_type", None)
    if kind == "text":
        return block.text, {"type": "text"}
    if kind in STORED:
        path, why = _store(files, getattr(block, "data", None), mime, kind)
        part = {"type": kind, "mime_type": mime, "path": path}
        return (f"[{kind}: {path}]" if path else f"[{kind} ({mime}), {why}]"), part
    if kind == "resource_link":
        part = {"type": kind, "uri": str(block.uri), "name": block.name, "mime_type": mime,
                "description": getattr(block, "description", None)}
        about = ", ".join(x for x in (mime, part["description"]) if x)
        return f"[resource link: {block.name} <{block.uri}>{f' ({about})' if about else ''}]", part
    if kind == "resource":
        resource = block.resource
        uri, mime = str(resource.uri), getattr(resource, "mime_type", None)
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource: <{uri}>{f' ({mime})' if mime else ''}]\n{text}", {"type": kind, "uri": uri,
                                                                                  "mime_type": mime}
        path, why = _store(files, getattr(resource, "blob", None), mime, "resource")
        part = {"type": kind, "uri": uri, "mime_type": mime, "path": path}
        return f"[resource: <{uri}>{f' ({mime})' if mime else ''}: {path or why}]", part
    return f"[{kind} content]", {"type": kind}


def result_text(result: CallToolResult) -> str:
    """The result as text alone (error messages, control tools): nothing is stored."""
    parts = [content_part(block, None)[0] for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def tool_observation(result: CallToolResult, files: EpisodeFiles | None, name: str,
                     tool_call_id: str | None) -> Observation:
    """The observation of a successful call; see the module doc."""
    if not result.content and result.structured_content is not None:
        return TextObservation(content=json.dumps(result.structured_content, ensure_ascii=False),
                               source="environment", name=name, tool_call_id=tool_call_id)
    texts, parts = zip(*(content_part(block, files) for block in result.content)) if result.content else ((), ())
    if len(parts) == 1 and parts[0]["type"] == "image" and parts[0]["path"]:
        return ImageObservation(image=ImageRef(path=parts[0]["path"]), tool_call_id=tool_call_id,
                                extra={"name": name, "mime_type": parts[0]["mime_type"]})
    extra = {"content": list(parts)} if any(p["type"] != "text" for p in parts) else {}
    return TextObservation(content="\n".join(texts), source="environment", name=name, tool_call_id=tool_call_id,
                           extra=extra)
