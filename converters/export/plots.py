"""PNG plots for the dataset card, drawn with matplotlib's Agg backend (no display needed).

Each function takes aggregated data (counts per value or per bin, never one value per record, so
the card's data stays small at any dataset size) and writes one PNG. A plot with nothing to show
is not drawn and the function returns False.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless machines and worker processes have no display

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

_SIZE = (6.4, 3.6)
_DPI = 100
_COLOR = "#4c72b0"


def _save(fig: plt.Figure, path: Path) -> None:
    for ax in fig.axes:  # counts are whole numbers
        (ax.xaxis if ax.get_xlabel() in ("count", "records", "rows") else ax.yaxis).set_major_locator(
            MaxNLocator(integer=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=_DPI)
    plt.close(fig)


def bar_chart(counts: Mapping[str, int | float], path: Path, title: str, xlabel: str, ylabel: str = "count",
              horizontal: bool = False) -> bool:
    """One bar per key, in the given order; long label lists are drawn horizontally."""
    if not counts or not any(counts.values()):
        return False
    labels, values = [str(k) for k in counts], list(counts.values())
    fig, ax = plt.subplots(figsize=(_SIZE[0], max(_SIZE[1], 0.35 * len(labels) + 1)) if horizontal else _SIZE)
    if horizontal:
        ax.barh(range(len(labels)), values, color=_COLOR)
        ax.set_yticks(range(len(labels)), [_short(label) for label in labels], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(ylabel)
        ax.set_ylabel(xlabel)
    else:
        ax.bar(range(len(labels)), values, color=_COLOR)
        ax.set_xticks(range(len(labels)), [_short(label) for label in labels], rotation=30 if len(labels) > 4 else 0,
                      ha="right" if len(labels) > 4 else "center", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)
    return True


def value_chart(counts: Mapping[str, int | float], path: Path, title: str, xlabel: str, ylabel: str = "count") -> bool:
    """Counts per numeric value (steps, rewards): bars at their values on a numeric axis, with the
    axis' own ticks (one label per bar is unreadable, and slow to lay out, past a few dozen values)."""
    if not counts or not any(counts.values()):
        return False
    xs, ys = [float(k) for k in counts], list(counts.values())
    ordered = sorted(xs)
    gaps = [b - a for a, b in zip(ordered, ordered[1:]) if b > a]
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.bar(xs, ys, width=0.8 * min(gaps) if gaps else 0.8, color=_COLOR)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _save(fig, path)
    return True


def histogram(edges: Sequence[float], counts: Sequence[int], path: Path, title: str, xlabel: str) -> bool:
    """Pre-binned counts: `counts[i]` values fell in [edges[i], edges[i+1])."""
    if not counts or not any(counts) or len(edges) != len(counts) + 1:
        return False
    fig, ax = plt.subplots(figsize=_SIZE)
    widths = [b - a for a, b in zip(edges, edges[1:])]
    ax.bar(list(edges[:-1]), list(counts), width=widths, align="edge", color=_COLOR, edgecolor="white")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    _save(fig, path)
    return True


def _short(label: str, limit: int = 48) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"
