"""PNG plots of evals (matplotlib's Agg backend): pass@1 per task group, and before / after per group."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless machines have no display

import matplotlib.pyplot as plt  # noqa: E402

_DPI = 100
_BEFORE, _AFTER = "#8c8c8c", "#4c72b0"


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=_DPI)
    plt.close(fig)


def _short(label: str, limit: int = 40) -> str:
    return label if len(label) <= limit else "…" + label[-(limit - 1):]


def pass_by_group(groups: Sequence[dict[str, Any]], path: Path, title: str) -> bool:
    """Horizontal bars of pass@1 per task group; False (nothing drawn) without a scored group."""
    rows = [g for g in groups if g.get("pass@1") is not None]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(6.4, max(2.0, 0.35 * len(rows) + 1.2)))
    labels = [_short(g["group"]) for g in rows]
    ax.barh(range(len(rows)), [100 * g["pass@1"] for g in rows], color=_AFTER)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("pass@1 (%)")
    ax.set_title(_short(title, 70), fontsize=10)
    _save(fig, path)
    return True


def before_after(rows: Sequence[dict[str, Any]], path: Path, title: str, labels: tuple[str, str] = ("before", "after")
                 ) -> bool:
    """Paired bars per group: `rows` hold `group`, `a` and `b` (pass@1 in [0, 1] or None)."""
    rows = [r for r in rows if r.get("a") is not None or r.get("b") is not None]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(6.4, max(2.4, 0.5 * len(rows) + 1.2)))
    y = range(len(rows))
    ax.barh([i - 0.2 for i in y], [100 * (r["a"] or 0) for r in rows], height=0.4, color=_BEFORE, label=labels[0])
    ax.barh([i + 0.2 for i in y], [100 * (r["b"] or 0) for r in rows], height=0.4, color=_AFTER, label=labels[1])
    ax.set_yticks(list(y), [_short(r["group"]) for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("pass@1 (%)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_short(title, 80), fontsize=10)
    _save(fig, path)
    return True


def across_rounds(baseline: float | None, rounds: list[dict[str, Any]], path: Path) -> bool:
    """pass@1 on the test split across rounds (`rounds` as `trajforge improve`'s report.json has them) after the
    baseline's, and the generation's pass@K on the train tasks where a model generated."""
    if not rounds:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = [r["round"] for r in rounds]
    first = min(xs) - 1
    ax.plot([first, *xs], [100 * (baseline or 0), *[100 * (r["pass@1"] or 0) for r in rounds]], marker="o",
            label="pass@1, test split (left: baseline)")
    gen = [(r["round"], r["train_pass_at_k"]) for r in rounds if r["train_pass_at_k"]["value"] is not None]
    if gen:
        ax.plot([x for x, _ in gen], [100 * g["value"] for _, g in gen], marker="s", linestyle="--",
                label=f"generation pass@{gen[-1][1]['k']}, train tasks")
    ax.set_xticks([first, *xs], ["base", *[str(x) for x in xs]])
    ax.set_xlabel("round")
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("pass@1 across rounds", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, path)
    return True
