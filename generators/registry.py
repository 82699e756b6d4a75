"""Generation methods registered by name."""

from __future__ import annotations

import importlib
import pkgutil
from generators.base import GenerationMethod

_METHODS: dict[str, type[GenerationMethod]] = {}
_INFRA = {"base", "registry", "runner"}


def register_method(cls: type[GenerationMethod]) -> type[GenerationMethod]:
    _METHODS[cls.name] = cls
    return cls


def _load_all() -> None:
    import generators

    for mod in pkgutil.iter_modules(generators.__path__):
        if not mod.name.startswith("_") and mod.name not in _INFRA:
            importlib.import_module(f"generators.{mod.name}")


def all_methods() -> dict[str, type[GenerationMethod]]:
    _load_all()
    return dict(sorted(_METHODS.items()))


def get_method(name: str) -> type[GenerationMethod]:
    methods = all_methods()
    if name not in methods:
        raise KeyError(f"no generation method named {name!r}; known: {', '.join(methods) or 'none'}")
    return methods[name]


