"""Converters registered by source name: each is a pure function raw record -> Trajectory."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from schemas.models import Trajectory

Converter = Callable[[Any], Trajectory]


@dataclass(frozen=True)
class ConverterInfo:
    name: str
    fn: Converter
    sources: list[str] = field(default_factory=list)
    doc: str = ""


_REGISTRY: dict[str, ConverterInfo] = {}


def register(name: str, sources: list[str] | None = None) -> Callable[[Converter], Converter]:
    """Register `fn` as the converter for source `name` (ADP's dataset folder name)."""

    def wrap(fn: Converter) -> Converter:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"converter {name!r} registered twice")
        module = importlib.import_module(fn.__module__)
        _REGISTRY[name] = ConverterInfo(name, fn, list(sources or []), (module.__doc__ or "").strip())
        return fn

    return wrap


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
