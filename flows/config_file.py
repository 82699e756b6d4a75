"""Reading a user's YAML config within bounds: size, nesting, and alias expansion.

YAML aliases share one object per anchor, so a few hundred bytes can stand for billions of nodes
that blow up whatever walks the data next (validation, hashing, JSON). A config is therefore
checked as it will be used, expanded: at most MAX_NODES values and MAX_DEPTH levels, no alias
that contains itself. Every problem is one line naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 1_000_000
# A tasks file is read whole; bigger than this is not a tasks file someone meant.
MAX_TASKS_FILE_BYTES = 1 << 30


class ConfigFileError(ValueError):
    """A config (or a file it names) that cannot be used; the message is one line naming the file."""


def regular_file(path: str | os.PathLike[str], what: str, limit: int) -> Path:
    """`path` if it is a readable regular file of at most `limit` bytes, else ConfigFileError."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigFileError(f"{path}: is a directory, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigFileError(f"{path}: is not a regular file (a device, pipe or socket); give a {what}")
    if info.st_size > limit:
        raise ConfigFileError(f"{path}: the {what} is {info.st_size:,} bytes, more than the {limit:,} allowed")
    return path


def read_config(path: str | os.PathLike[str], what: str = "config") -> Any:
    """The YAML data of the config file at `path`, checked against the bounds (see module doc)."""
    path = regular_file(path, f"{what} file", MAX_CONFIG_BYTES)
    try:
        with path.open("rb") as fh:
            text = fh.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot read the {what} ({exc})") from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ConfigFileError(f"{path}: the {what} is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: the {what} is not valid YAML ({' '.join(str(exc).split())})") from None
    problem = bounds_problem(data)
    if problem:
        raise ConfigFileError(f"{path}: the {what} {problem}")
    return data



def read_mapping(path: str | os.PathLike[str], what: str, output: str | None = None) -> dict[str, Any]:
    """A job's config: a YAML mapping (`read_config`); `output`, when given, replaces its output root."""
    data = read_config(path, what)
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: a {what} is a YAML mapping")
    if output is not None:
        data["output"] = output
    return data

def bounds_problem(data: Any) -> str | None:
    """Why `data`, expanded (aliases copied out), is too big, too deep or endless; None if it is not.

    Linear in the number of distinct objects: each container's expanded size is computed once.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id -> (expanded nodes, depth)
    open_: set[int] = set()  # containers whose subtree is being walked (a path from the root)
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, finished = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        key = id(node)
        kids = list(node.values()) if isinstance(node, dict) else node
        if finished:
            open_.discard(key)
            nodes, depth = 1 + (len(node) if isinstance(node, dict) else 0), 0
            for kid in kids:
                kid_nodes, kid_depth = sizes.get(id(kid), (1, 0)) if isinstance(kid, (dict, list)) else (1, 0)
                nodes, depth = nodes + kid_nodes, max(depth, kid_depth)
            sizes[key] = (nodes, depth + 1)
            if nodes > MAX_NODES:
                return f"expands to more than {MAX_NODES:,} values (YAML aliases copied out); write it out plainly"
            if depth + 1 > MAX_DEPTH:
                return f"is nested too deeply (more than {MAX_DEPTH} levels)"
            continue
        if key in sizes:
            continue
        if key in open_:
            return "has an alias that contains itself (an endless value)"
        open_.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in kids if isinstance(kid, (dict, list)) and id(kid) not in sizes)
    return None
