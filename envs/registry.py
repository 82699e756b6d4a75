"""Name -> environment factory registry: `make_env("retail", seed=0)`."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from envs.base import Environment

EnvFactory = Callable[..., Environment]

# Built-ins are imported on first use so `import envs` stays cheap.
_BUILTIN: dict[str, str] = {
    "retail": "envs.retail.env:RetailEnv",
    "web": "envs.web.env:WebShopEnv",
    "simulated": "envs.simulated.env:SimulatedEnv",
    "mcp": "envs.mcp.env:MCPEnv",
    "browser": "envs.browser.env:BrowserEnv",
}
_REGISTRY: dict[str, EnvFactory] = {}


def register_env(name: str, factory: EnvFactory | None = None, *, replace: bool = False) -> Any:
    """Register `factory` under `name`; usable as a decorator (`@register_env("x")`)."""

    def _register(f: EnvFactory) -> EnvFactory:
        if not replace and name in _REGISTRY and _REGISTRY[name] is not f:
            raise ValueError(f"environment {name!r} is already registered")
        _REGISTRY[name] = f
        return f

    return _register(factory) if factory is not None else _register


def _load_builtin(name: str) -> EnvFactory:
    module, _, attr = _BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def available_envs() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILTIN))


def env_class(name: str) -> EnvFactory:
    """The factory (usually the class) registered as `name`."""
    factory = _REGISTRY.get(name)
    if factory is None and name in _BUILTIN:
        factory = _REGISTRY.setdefault(name, _load_builtin(name))
    if factory is None:
        raise KeyError(f"unknown environment {name!r}; available: {', '.join(available_envs())}")
    return factory


def make_env(name: str, **config: Any) -> Environment:
    """A new (unstarted) environment of kind `name`, configured with `config` (e.g. seed=0)."""
    return env_class(name)(**config)
