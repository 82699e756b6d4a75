"""Shared helpers for the dataset converters: typed key access, ids, a step builder.

Everything here raises `ConversionError` (naming the record) for bad input, never
KeyError / TypeError / IndexError. Imports only `schemas` and `converters.*`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any, Callable, Iterable, NoReturn, TypeVar

import xxhash
from pydantic import ValidationError

from converters.errors import ConversionError, summarize_validation
from converters.ids import stable_id
from schemas.models import Trajectory

_MISSING: Any = object()
T = TypeVar("T")

# Closing turns that several ADP scripts append (picked at random upstream; we pick
# deterministically from the record id so a re-run gives the same record).
END_USER_MESSAGES = (
    "Congratulations! You have successfully solved the task.",
    "Your solution has been verified as correct. ",
    "Well done on successfully completing the task!",
    "Your implementation satisfies the task requirements.",
    "Task completed successfully.",
)
END_AGENT_PHRASES = (
    "I have successfully completed the task.",
    "I did it! The task is now complete.",
    "The objective has been achieved with no outstanding issues.",
    "I have fulfilled all the requirements of the task.",
    "I've wrapped up the task successfully.",
)

_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "object"}


def _tname(t: Any) -> str:
    if isinstance(t, tuple):
        return " or ".join(_tname(x) for x in t)
    return _TYPE_NAMES.get(t, getattr(t, "__name__", str(t)))


def record_id(source: str, source_id: str | None, raw: Any) -> str:
    """The trajectory id: `converters.ids.stable_id` (`<source>/<source id>~<hash>`), robust to odd text."""
    try:
        return stable_id(source, source_id, raw)
    except (TypeError, ValueError, UnicodeError, RecursionError):
        digest = content_hash(raw).removeprefix("xxh3:")
        return f"{source}/{source_id}~{digest[:12]}" if source_id else f"{source}/xxh3:{digest}"


def content_hash(raw: Any) -> str:
    """A stable name for records that carry no id (used in error messages): `xxh3:<32 hex>`."""
    try:
        text = json.dumps(raw, sort_keys=True, ensure_ascii=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(raw)
    data = text.encode("utf-8", "surrogatepass")
    return "xxh3:" + xxhash.xxh3_128_hexdigest(data)


def _readable_id(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip() and len(value) <= 1000:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return value
    return None


class Ctx:
    """One record being converted: its id (for messages) and typed accessors."""

    def __init__(self, raw: Any, id_keys: Iterable[str] = ("id",), *, require_id: bool = False, what: str = "object"):
        self.raw = raw
        self.rid: str | None = None
        if isinstance(raw, dict):
            for key in id_keys:
                rid = _readable_id(raw.get(key))
                if rid is not None:
                    self.rid = rid
                    self.id_key = key
                    break
        self.hashed = self.rid is None
        if self.rid is None:
            self.rid = content_hash(raw)
        if not isinstance(raw, dict) and what == "object":
            self.fail(f"record is {type(raw).__name__}, expected an object")
        if require_id and self.hashed:
            keys = " / ".join(f"`{k}`" for k in id_keys)
            self.fail(f"missing or unreadable id ({keys})")

    def fail(self, msg: str) -> NoReturn:
        raise ConversionError(f"record {self.rid!r}: {msg}")

    def get(self, obj: Any, key: str, typ: Any = object, where: str = "", default: Any = _MISSING) -> Any:
        """`obj[key]` checked to be of `typ`; `default` when absent or None (if given)."""
        loc = f"{where}.{key}" if where else key
        if not isinstance(obj, dict):
            self.fail(f"`{where or 'record'}` is {type(obj).__name__}, expected an object")
        if key not in obj or obj[key] is None:
            if default is not _MISSING:
                return default
            self.fail(f"missing key `{loc}`")
        value = obj[key]
        if typ is not object and not _isinstance(value, typ):
            self.fail(f"`{loc}` is {type(value).__name__}, expected {_tname(typ)}")
        return value

    def items(self, obj: Any, key: str, where: str = "", default: Any = _MISSING) -> list[Any]:
        return self.get(obj, key, list, where, default)

    def dicts(self, obj: Any, key: str, where: str = "", default: Any = _MISSING) -> list[dict[str, Any]]:
        """A list under `key` whose elements must all be objects."""
        value = self.get(obj, key, list, where, default)
        loc = f"{where}.{key}" if where else key
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                self.fail(f"`{loc}[{i}]` is {type(item).__name__}, expected an object")
        return value

    def str_(self, obj: Any, key: str, where: str = "", default: Any = _MISSING) -> str:
        return self.get(obj, key, str, where, default)

    def json_loads(self, text: Any, where: str) -> Any:
        if not isinstance(text, str):
            self.fail(f"`{where}` is {type(text).__name__}, expected a JSON string")
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            self.fail(f"`{where}` is not valid JSON ({str(exc)[:80]})")


def _isinstance(value: Any, typ: Any) -> bool:
    types = typ if isinstance(typ, tuple) else (typ,)
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def pick(seq: tuple[str, ...], rid: str) -> int:
    """A deterministic index into `seq` from the record id."""
    return int(hashlib.sha256(rid.encode("utf-8", "surrogatepass")).hexdigest()[:8], 16) % len(seq)


class Builder:
    """Collects interlingua steps (as dicts) for one record and validates the result."""

    def __init__(self, ctx: Ctx, source: str, dataset: str):
        self.ctx = ctx
        self.source = source
        self.dataset = dataset
        self.steps: list[dict[str, Any]] = []
        self.synthetic: list[int] = []

    # actions
    def api(self, function: str, arguments: dict[str, Any] | None = None, thought: str | None = None, **kw: Any) -> dict:
        return self._add({"kind": "api", "function": function, "arguments": arguments or {}, "thought": thought, **kw})

    def code(self, language: str, content: str, thought: str | None = None, **kw: Any) -> dict:
        return self._add({"kind": "code", "language": language, "content": content, "thought": thought, **kw})

    def message(self, content: str, thought: str | None = None, **kw: Any) -> dict:
        return self._add({"kind": "message", "content": content, "thought": thought, **kw})

    # observations
    def text(self, content: str, source: str, name: str | None = None, **kw: Any) -> dict:
        return self._add({"kind": "text", "content": content, "source": source, "name": name, **kw})

    def image(self, path: str, annotations: list[dict] | None = None, source: str = "environment") -> dict:
        return self._add({"kind": "image", "image": {"path": path, "source": source, "annotations": annotations}})

    def web(self, url: str | None = None, html: str | None = None, axtree: str | None = None,
            screenshot: dict | None = None, viewport: Any = None) -> dict:
        return self._add({"kind": "web", "url": url, "html": html, "axtree": axtree, "screenshot": screenshot,
                          "viewport": viewport})

    def _add(self, step: dict[str, Any]) -> dict[str, Any]:
        step = {k: v for k, v in step.items() if v is not None or k in ("thought",)}
        self.steps.append(step)
        return step

    @property
    def last(self) -> dict[str, Any] | None:
        return self.steps[-1] if self.steps else None

    def closing(self, style: str) -> None:
        """Append ADP's synthetic closing turns: a user 'success' note and a `<finish>` message.

        style "desc": `<finish> </finish>` with the phrase as thought (alfworld / webshop);
        style "content": the phrase inside `<finish> ... </finish>`, empty thought.
        """
        rid = self.ctx.rid or ""
        self.synthetic.append(len(self.steps))
        self.text(END_USER_MESSAGES[pick(END_USER_MESSAGES, rid)], "user")
        phrase = END_AGENT_PHRASES[pick(END_AGENT_PHRASES, rid + "/agent")]
        self.synthetic.append(len(self.steps))
        if style == "desc":
            self.message("<finish> </finish>", thought=phrase)
        else:
            self.message(f"<finish> {phrase} </finish>", thought="")

    def build(self, *, tools: list[dict] | None = None, success: bool | None = None, reward: float | None = None,
              details: dict[str, Any] | None = None, task_id: str | None = None, model: str | None = None,
              source_id: str | None = None) -> Trajectory:
        details = dict(details or {})
        if self.synthetic:
            details["synthetic_steps"] = list(self.synthetic)
        source_id = source_id if source_id is not None else (None if self.ctx.hashed else self.ctx.rid)
        obj = {
            "id": record_id(self.source, source_id, self.ctx.raw),
            "source": self.source,
            "steps": self.steps,
            "tools": tools or [],
            "reward": reward,
            "success": success,
            "provenance": {"source_dataset": self.dataset, "source_id": source_id, "source_format": "raw",
                           "task_id": task_id, "model": model},
            "details": details,
        }
        try:
            traj = Trajectory.model_validate(obj)
        except ValidationError as exc:
            self.ctx.fail(_summarize(exc))
        except (RecursionError, ValueError, TypeError) as exc:
            self.ctx.fail(f"invalid record ({type(exc).__name__})")
        check_encodable(traj, self.ctx)
        return traj


def check_encodable(traj: Trajectory, ctx: Ctx) -> None:
    """Parquet / JSON writers need valid UTF-8: reject lone surrogates and non-JSON values."""
    try:
        json.dumps(traj.model_dump(mode="json"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        ctx.fail("text contains invalid unicode (lone surrogate / undecodable bytes)")
    except (TypeError, ValueError, RecursionError) as exc:
        ctx.fail(f"value not JSON-serializable ({str(exc)[:80]})")


def _summarize(exc: ValidationError) -> str:
    return "invalid " + summarize_validation(exc)


def guarded(id_keys: Iterable[str] = ("id",)) -> Callable[[Callable[..., Trajectory]], Callable[..., Trajectory]]:
    """Safety net: any stray exception from parsing odd input becomes a ConversionError naming the record."""
    keys = tuple(id_keys)

    def wrap(fn: Callable[..., Trajectory]) -> Callable[..., Trajectory]:
        @functools.wraps(fn)
        def inner(record: Any, *args: Any, **kwargs: Any) -> Trajectory:
            try:
                return fn(record, *args, **kwargs)
            except ConversionError:
                raise
            except (KeyError, TypeError, AttributeError, IndexError, ValueError, RecursionError, UnicodeError) as exc:
                rid = None
                if isinstance(record, dict):
                    rid = next((r for r in (_readable_id(record.get(k)) for k in keys) if r), None)
                elif isinstance(record, list) and record and isinstance(record[0], dict):
                    rid = next((r for r in (_readable_id(record[0].get(k)) for k in keys) if r), None)
                rid = rid or content_hash(record)
                raise ConversionError(f"record {rid!r}: cannot convert ({type(exc).__name__}: {str(exc)[:120]})") from None

        return inner

    return wrap


def py_tool(name: str, description: str, params: dict[str, Any] | None = None, required: Iterable[str] | None = None) -> dict:
    """A tool spec from a compact parameter map {name: json-type or schema}."""
    props: dict[str, Any] = {}
    for pname, ptype in (params or {}).items():
        props[pname] = {"type": ptype} if isinstance(ptype, str) else ptype
    req = list(required) if required is not None else list(props)
    return {"name": name, "description": description, "parameters": {"type": "object", "properties": props, "required": req}}


def openai_tool(spec: Any, ctx: Ctx, where: str) -> dict:
    """An OpenAI-style tool spec ({"type": "function", "function": {...}} or the bare function) -> Tool dict."""
    if not isinstance(spec, dict):
        ctx.fail(f"`{where}` is {type(spec).__name__}, expected an object")
    fn = spec.get("function") if isinstance(spec.get("function"), dict) else spec
    name = ctx.get(fn, "name", str, where)
    desc = fn.get("description")
    params = fn.get("parameters")
    if desc is not None and not isinstance(desc, str):
        ctx.fail(f"`{where}.description` is {type(desc).__name__}, expected string")
    if params is not None and not isinstance(params, dict):
        ctx.fail(f"`{where}.parameters` is {type(params).__name__}, expected an object")
    return {"name": name, "description": desc, "parameters": params}


def valid_identifier(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name))
