"""Output directories: a command writes into a new or empty directory, or into one it wrote itself.

Each writing command leaves a mark file in its output (a dataset its `_manifest.json`, `trajforge
train` its `train.json`, `trajforge eval compare` its `compare.json`). A non-empty directory without
that mark is someone else's (a user's folder, an export, another command's output): writing into it
could replace their files, so it is refused, whatever the options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


class ForeignDirError(ValueError):
    """The output is a file, or a non-empty directory the command did not write; the message is one line."""


def foreign_entries(path: Path, ours: Callable[[Path], bool] = lambda entry: False) -> list[str]:
    """The names in directory `path` that are not the command's own leftovers (`ours`), sorted."""
    return [entry.name for entry in sorted(path.iterdir()) if not ours(entry)]


def check_output_dir(path: Path, mark: str, what: str, *, ours: Callable[[Path], bool] = lambda entry: False) -> None:
    """Refuse `path` as an output unless it is missing, empty (but for `ours`) or holds `mark`.

    `what` names what the command writes ("a trajforge dataset"), for the message.
    """
    if not (path.is_symlink() or path.exists()):
        return
    if not path.is_dir():
        raise ForeignDirError(f"{path}: exists and is not a directory; choose a directory for the output")
    if (path / mark).is_file():
        return
    try:
        foreign = foreign_entries(path, ours)
    except OSError as exc:
        raise ForeignDirError(f"{path}: cannot read the output directory ({exc.strerror or exc})") from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ForeignDirError(f"{path}: not empty ({shown}) and not {what} (no {mark}); refusing to write into it: "
                              "choose a new or empty directory")
