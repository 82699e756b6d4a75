"""The rounds of `trajforge improve`: where a round's artefacts live, the export a round trains on, and the
per-round figures of the report (pass@1 with paired intervals, the generation's own pass@K, rows, times, a plot).

No Prefect here: the flow (`flows/improve.py`) calls these between its stages.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.improve_config import ImproveConfig

ROUNDS_PLOT = "plots/rounds.png"


@dataclass(frozen=True)
class Round:
    """Round k's folders. One round without a warm start keeps the single-round layout (`data/`, `model/`,
    `eval-trained/` in the output root); rounds go to `round-k/` (`data/`, `export/`, `model/`, `eval/`)."""

    k: int
    dir: Path
    prefix: str  # of its stage state names and stage_seconds keys ("" or "round-k/")

    @classmethod
    def of(cls, cfg: ImproveConfig, k: int) -> Round:
        if not cfg.in_rounds:
            return cls(k, cfg.root, "")
        return cls(k, cfg.root / f"round-{k}", f"round-{k}/")

    @property
    def label(self) -> str:
        return f"round {self.k}: " if self.prefix else ""

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def model(self) -> Path:
        return self.dir / "model"

    @property
    def eval_name(self) -> str:
        return f"{self.prefix}eval" if self.prefix else "eval-trained"

    def state(self, stage: str) -> str:
        return f"{self.prefix}{stage}"


# ---- the export a round trains on -----------------------------------------------------------------


def export_rows(export: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted((export / "data").glob("train-*.parquet")))


def merge_exports(exports: list[str], out: Path) -> Path | None:
    """One export of the rows of `exports` (the same format): the export itself when there is one, else `out`
    with every shard linked in and a card listing them; None when there is no row to train on."""
    paths = [Path(e) for e in exports if export_rows(Path(e)) > 0]
    if not paths:
        return None
    if len(paths) == 1:
        return paths[0]
    cards = [json.loads((p / "card.json").read_text(encoding="utf-8")) for p in paths]
    sources = [str(p) for p in paths]
    try:
        if json.loads((out / "card.json").read_text(encoding="utf-8")).get("source") == {"merged": sources}:
            return out  # made before from the same exports (their shards do not change once written)
    except (OSError, ValueError):
        pass
    if out.exists():
        shutil.rmtree(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    shards = [f for p in paths for f in sorted((p / "data").glob("train-*.parquet"))]
    files = []
    for i, shard in enumerate(shards):
        name = f"data/train-{i:05d}-of-{len(shards):05d}.parquet"
        try:
            os.link(shard, tmp / name)
        except OSError:
            shutil.copy2(shard, tmp / name)
        files.append(name)
    counts: dict[str, Any] = {}
    for card in cards:
        for key, value in (card.get("counts") or {}).items():
            if isinstance(value, int):
                counts[key] = counts.get(key, 0) + value
    card = {**cards[-1], "source": {"merged": sources}, "counts": counts, "files": ["card.json", *files]}
    (tmp / "card.json").write_text(json.dumps(card, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(out)
    return out


# ---- per-round figures ----------------------------------------------------------------------------


def train_pass_at_k(cfg: ImproveConfig, data: dict[str, Any]) -> dict[str, Any]:
    """pass@K of what the model's own generation found on the train tasks: every episode of its entries
    (kept or filtered out by outcome), K the fewest samples any task got; None without a model's entry."""
    from generators.registry import get_method
    from schemas.store import Dataset

    own = {e["name"] for e in data["entries"]
           if not getattr(get_method(e["method"]), "uses_reference_solutions", False)}
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for stage in data["stages"]:
        if stage["stage"] != "generate" or stage["name"] not in own:
            continue
        ds = Dataset.open(stage["output"])
        records = list(ds.iter_records()) + [f.record for f in ds.iter_records("filtered")]
        for r in records:
            outcomes[r.provenance.task_id or r.id.split("#")[0]].append(r.success is True)
    return pass_at_k_of(outcomes)


def pass_at_k_of(outcomes: dict[str, list[bool]]) -> dict[str, Any]:
    """Mean over tasks of pass@K (unbiased estimator), K the fewest samples any task got."""
    from evals.metrics import pass_at_k

    if not outcomes:
        return {"k": None, "value": None}
    k = min(len(v) for v in outcomes.values())
    values = [pass_at_k(len(v), sum(v), k) for v in outcomes.values()]
    return {"k": k, "value": sum(values) / len(values)}


def rows_by_method(data: dict[str, Any]) -> dict[str, int]:
    """Rows each method's entry gave the export (after keep, filter, dedup, decontamination)."""
    from schemas.store import Dataset

    method = {e["name"]: e["method"] for e in data["entries"]}
    last: dict[str, str] = {}
    for stage in data["stages"]:
        if stage["stage"] != "export" and stage["name"] in method:
            last[stage["name"]] = stage["output"]
    rows: dict[str, int] = {}
    for name, output in last.items():
        rows[method[name]] = rows.get(method[name], 0) + Dataset.open(output).count()
    return rows


def _interval(delta: dict[str, Any] | None) -> dict[str, float] | None:
    return None if delta is None else {"mean": delta["mean"], "low": delta["low"], "high": delta["high"]}


def round_figures(cfg: ImproveConfig, baseline: dict[str, Any], rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """report.json's `rounds`: per round pass@1 on the test split, its paired intervals against the baseline and
    the previous round (None for the first), the generation's pass@K, rows per method, time per stage."""
    from evals.compare import compare

    out = []
    previous = None
    for r in rounds:
        report = r["after"]["report"]
        out.append({
            "round": r["round"].k, "pass@1": report["pass@1"],
            "vs_baseline": _interval(compare(baseline, report, seed=cfg.seed)["delta"]),
            "vs_previous": None if previous is None else _interval(compare(previous, report, seed=cfg.seed)["delta"]),
            "train_pass_at_k": train_pass_at_k(cfg, r["data"]), "rows": rows_by_method(r["data"]),
            "stage_seconds": r["stage_seconds"], "eval": report["output"], "model": r["trained"]["output"],
            "trains_from": r["trains_from"], "methods": [e["method"] for e in r["data"]["entries"]],
        })
        previous = report
    return out


# ---- the report's rounds section ------------------------------------------------------------------


def _pts(d: dict[str, float] | None) -> str:
    return "n/a" if d is None else f"{100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def write_rounds(cfg: ImproveConfig, report: dict[str, Any]) -> str:
    """The report.md section on rounds (and `plots/rounds.png`)."""
    rounds = report["rounds"]
    from evals.plots import across_rounds

    plot = across_rounds(report["before"]["pass@1"], rounds, cfg.root / ROUNDS_PLOT)
    warm = report["warm_start"]["tasks"]
    md = (f"\n## Rounds\n\nTrains from: **{cfg.train_from}** ("
          + ("each round's model on that round's data" if cfg.train_from == "last"
             else "the base, on every round's data so far") + f"); keeps: **{cfg.keeps}**. "
          + (f"Tasks with a reference solution (warm start or demonstrations): {len(warm)} "
             f"({', '.join(warm[:5])}{', ...' if len(warm) > 5 else ''}), "
             f"{report['warm_start']['measured_overlap'] or 'none'} of them in a measured task group.\n\n"
             if warm else "No task had a reference solution.\n\n"))
    if plot:
        md += f"![rounds]({ROUNDS_PLOT})\n\n"
    md += ("| round | methods | rows | generation pass@K (train) | pass@1 (test) | vs baseline, 95% | vs previous, 95% "
           "| seconds |\n|---|---|---|---|---|---|---|---|\n")
    md += f"| base | | | | {_pct(report['before']['pass@1'])} | | | |\n"
    for r in rounds:
        gen = r["train_pass_at_k"]
        found = "n/a" if gen["value"] is None else f"pass@{gen['k']} {_pct(gen['value'])}"
        made = ", ".join(f"{m} {n}" for m, n in r["rows"].items()) or "0"
        md += (f"| {r['round']} | {', '.join(r['methods'])} | {made} | {found} | {_pct(r['pass@1'])} | "
               f"{_pts(r['vs_baseline'])} | {_pts(r['vs_previous'])} | "
               f"{', '.join(f'{s} {v:.0f}' for s, v in r['stage_seconds'].items())} |\n")
    return md
