"""Converters registered by source name: each is a pure function raw record -> Trajectory.

Most datasets have one raw row per record. Two other shapes are declared at registration, so
every caller (the Python API, the CLI, the Prefect flow, Beam on any runner) builds records
from rows the same way:
- `episode_key`: rows are steps; a record is a run of consecutive rows with the same key
  (`group_consecutive`), possibly spanning chunks and input files.
- `split_row`: a row holds several records (e.g. one JSON list per session).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, TypeVar

from schemas.models import Trajectory

Converter = Callable[[Any], Trajectory]
# A row -> its episode key, or KEYLESS for a row that carries none (not an object, unreadable).
EpisodeKey = Callable[[Any], Any]
SplitRow = Callable[[Any], list[Any]]
T = TypeVar("T")


class _Keyless:
    def __repr__(self) -> str:
        return "KEYLESS"


KEYLESS: Any = _Keyless()


def group_consecutive(items: Iterable[T], key_of: Callable[[T], Any]) -> Iterator[list[T]]:
    """Runs of consecutive items with the same key, in order.

    An item without a key (KEYLESS) joins the run before it, so a broken step row stays in its
    episode (which then fails as a whole, naming the episode) instead of splitting it in two.
    """
    run: list[T] = []
    key: Any = KEYLESS
    for item in items:
        k = key_of(item)
        if k is not KEYLESS:
            if run and k != key:
                yield run
                run = []
            key = k
        run.append(item)
    if run:
        yield run


@dataclass(frozen=True)
class ConverterInfo:
    name: str
    fn: Converter
    sources: list[str] = field(default_factory=list)
    doc: str = ""
    episode_key: EpisodeKey | None = None
    split_row: SplitRow | None = None
    # The trajectory row of `fn(raw)` (`pipelines.columns` layout), built without models (see
    # `schemas.rows`), or None where `fn` must decide. Lets the pipeline skip model validation.
    to_row: Callable[[Any], tuple[Any, ...] | None] | None = None

    def records(self, rows: Iterable[Any]) -> Iterator[Any]:
        """Raw rows, in order -> the records `fn` takes (the pipeline does the same, with locations)."""
        if self.split_row is not None:
            split = self.split_row
            rows = (record for row in rows for record in split(row))
        if self.episode_key is not None:
            return group_consecutive(rows, self.episode_key)
        return iter(rows)


_REGISTRY: dict[str, ConverterInfo] = {}


def register(
    name: str,
    sources: list[str] | None = None,
    *,
    episode_key: EpisodeKey | None = None,
    split_row: SplitRow | None = None,
    to_row: Callable[[Any], tuple[Any, ...] | None] | None = None,
) -> Callable[[Converter], Converter]:
    """Register `fn` as the converter for source `name` (ADP's dataset folder name)."""

    def wrap(fn: Converter) -> Converter:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"converter {name!r} registered twice")
        module = importlib.import_module(fn.__module__)
        _REGISTRY[name] = ConverterInfo(name, fn, list(sources or []), (module.__doc__ or "").strip(),
                                        episode_key, split_row, to_row)
        return fn

    return wrap


class KeyField:
    """The episode key of rows that name their episode in field `name` (picklable)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, row: Any) -> Any:
        return row.get(self.name) if isinstance(row, dict) else KEYLESS


def _load_all() -> None:
    import converters

    for mod in pkgutil.iter_modules(converters.__path__):
        # `export` is the other direction (interlingua -> training formats), not a source.
        if not mod.name.startswith("_") and mod.name not in ("registry", "errors", "ids", "export"):
            importlib.import_module(f"converters.{mod.name}")


def all_converters() -> dict[str, ConverterInfo]:
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def get_converter(name: str) -> ConverterInfo:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"no converter named {name!r}; known: {known}") from None
