"""What listing commands show, read from the source files without importing them.

`trajforge --help`, `trajforge envs` and `trajforge methods` name things whose modules pull in
heavy libraries (the MCP SDK, Playwright, Beam, Arrow): importing them all took seconds just to
print a table. The names and one-line descriptions are plain literals in the source (a function's
docstring, a class's `name` / `evaluation` / `can_snapshot` / `default_user` attributes), so they
are read with `ast` instead. Tests check the result against the imported classes, so the two
cannot drift apart.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Modules of generators/ that hold no method (as generators.registry skips them).
_NOT_METHODS = {"base", "registry", "runner"}


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


def function_summary(module_file: Path, function: str) -> str:
    """The first line of a top-level function's docstring."""
    for node in _tree(module_file).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return _first_line(ast.get_docstring(node))
    raise LookupError(f"{module_file}: no function {function}")


def class_attributes(module_file: Path, cls: str) -> dict[str, Any]:
    """A class's literal attributes (`name = "x"`), with its docstring as `__doc__`."""
    for node in _tree(module_file).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out: dict[str, Any] = {"__doc__": ast.get_docstring(node)}
            for item in node.body:
                target, value = None, None
                if isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
                    target, value = item.targets[0].id, item.value
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    target, value = item.target.id, item.value
                if target is not None:
                    try:
                        out[target] = ast.literal_eval(value)
                    except ValueError:
                        pass
            return out
    raise LookupError(f"{module_file}: no class {cls}")


def method_rows() -> list[tuple[str, str]]:
    """(name, first docstring line) of every generation method, sorted by name."""
    rows = []
    for path in sorted((ROOT / "generators").glob("*.py")):
        if path.stem.startswith("_") or path.stem in _NOT_METHODS:
            continue
        for node in _tree(path).body:
            registered = isinstance(node, ast.ClassDef) and any(
                isinstance(d, ast.Name) and d.id == "register_method" for d in node.decorator_list)
            if registered:
                attrs = class_attributes(path, node.name)
                if isinstance(attrs.get("name"), str):
                    rows.append((attrs["name"], _first_line(attrs["__doc__"])))
    return sorted(rows)


def env_rows() -> list[tuple[str, str, str, str]]:
    """(name, restore, user, evaluation) of every environment: built-ins from their source, others imported."""
    from envs.registry import _BUILTIN, available_envs

    rows = []
    for name in available_envs():
        if name in _BUILTIN:
            module, _, cls = _BUILTIN[name].partition(":")
            attrs = class_attributes(ROOT.joinpath(*module.split(".")).with_suffix(".py"), cls)
            restore = "snapshot" if attrs.get("can_snapshot") else "replay"
            rows.append((name, restore, str(attrs.get("default_user", "none")), str(attrs.get("evaluation", ""))))
        else:
            caps = imported_capabilities(name)
            rows.append((name, caps.restore, caps.user, caps.evaluation))
    return rows


def imported_capabilities(name: str) -> Any:
    """An environment's capabilities from its class (those that need settings to exist: from class attributes)."""
    from envs.base import Capabilities
    from envs.registry import env_class

    cls: Any = env_class(name)
    try:
        return cls().capabilities()
    except (TypeError, ValueError):
        user = getattr(cls, "default_user", "per config")
        return Capabilities("snapshot" if cls.can_snapshot else "replay", user, cls.evaluation)
