"""The export's README.md: a Hugging Face dataset card with statistics and plots.

YAML front matter declares one `default` config whose `train` split is `data/train-*`, so
`datasets.load_dataset(OUT)` finds the shards. Record counts, the source mix, steps per
trajectory and provenance come from the streaming export itself; token and message statistics
are DuckDB aggregates over the exported shards (approximate tokens: the regex in `tokens`);
step, reward and label distributions are DuckDB aggregates over the source trajectories that
were exported, and filter reasons come from the source dataset's manifest.

Everything the card shows is first gathered into `card.json` (aggregates only, small at any
size); README.md and `plots/*.png` are renderings of it, so `regenerate_card(OUT)`
(`trajforge card OUT`) rebuilds both without the source dataset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import yaml

from converters.export import plots
from converters.export.tokens import PATTERN

if TYPE_CHECKING:
    from converters.export.formats import Format
    from converters.export.run import ExportConfig, ExportReport

CARD_DATA = "card.json"
PLOTS_DIR = "plots"
TOKEN_BINS = 20
ACTION_KINDS = ("api", "code", "message")

# Conversation-valued columns to measure, per format (Parquet exports).
_COLUMNS = {
    "trl-sft": {"messages": ["messages"], "prompt-completion": ["prompt", "completion"]},
    "trl-dpo": ["prompt", "chosen", "rejected"],
    "trl-kto": ["prompt", "completion"],
    "sharegpt": ["conversations"],
    "openai": ["messages"],
}


class CardError(Exception):
    """An export directory whose card cannot be rebuilt; the message is one line."""


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _paths(files: list[Path]) -> str:
    return "[" + ", ".join(_sql_str(str(p)) for p in files) + "]"


def _text_expr(fmt: str, column: str) -> str:
    """SQL: the text of one conversation column (contents + tool-call names and arguments)."""
    if fmt == "openai":
        return (f"concat_ws(' ', array_to_string(json_extract_string({column}, '$[*].content'), ' '), "
                f"array_to_string(json_extract_string({column}, '$[*].tool_calls[*].function.name'), ' '), "
                f"array_to_string(json_extract_string({column}, '$[*].tool_calls[*].function.arguments'), ' '))")
    if fmt == "sharegpt":
        return f"array_to_string(list_transform({column}, lambda m: m.value), ' ')"
    return (f"array_to_string(list_transform({column}, lambda m: concat_ws(' ', m.content, "
            f"array_to_string(list_transform(m.tool_calls, lambda c: c.function.name || ' ' || c.function.arguments), ' '))), ' ')")


def _tokens_expr(fmt: str, column: str) -> str:
    return f"len(regexp_extract_all(coalesce({_text_expr(fmt, column)}, ''), {_sql_str(PATTERN)}))"


def _length_expr(fmt: str, column: str) -> str:
    return f"json_array_length({column})" if fmt == "openai" else f"len({column})"


def _relation(fmt: "Format", files: list[Path]) -> str:
    if fmt.file_type == "jsonl":
        return f"read_json({_paths(files)}, format='newline_delimited', columns={{'messages': 'JSON'}})"
    return f"read_parquet({_paths(files)})"


def token_stats(fmt: "Format", files: list[Path], columns: list[str]) -> list[dict[str, Any]]:
    """Per column: rows, messages per row (mean), approx tokens per row (mean, p50, p95, max, total)."""
    rel = _relation(fmt, files)
    out = []
    con = duckdb.connect()
    try:
        for column in columns:
            query = (f"SELECT count(*), avg({_length_expr(fmt.name, column)}), avg(t), quantile_disc(t, 0.5), "
                     f"quantile_disc(t, 0.95), max(t), sum(t) FROM (SELECT {column}, {_tokens_expr(fmt.name, column)} "
                     f"AS t FROM {rel})")
            n, msgs, mean, p50, p95, mx, total = con.execute(query).fetchone()
            out.append({"column": column, "rows": n, "messages_mean": msgs, "tokens_mean": mean,
                        "tokens_p50": p50, "tokens_p95": p95, "tokens_max": mx, "tokens_total": total})
    finally:
        con.close()
    return out


def token_histogram(fmt: "Format", files: list[Path], columns: list[str], bins: int = TOKEN_BINS) -> dict[str, list]:
    """Approximate tokens per row (all conversation columns together), as equal-width bins."""
    total = " + ".join(_tokens_expr(fmt.name, c) for c in columns)
    con = duckdb.connect()
    try:
        con.execute(f"CREATE TEMP TABLE t AS SELECT {total} AS t FROM {_relation(fmt, files)}")
        lo, hi = con.execute("SELECT min(t), max(t) FROM t").fetchone()
        if lo is None:
            return {"edges": [], "counts": []}
        width = max(1.0, (hi - lo + 1) / bins)
        rows = con.execute(f"SELECT least(floor((t - {lo}) / {width})::INT, {bins - 1}) AS b, count(*) FROM t "
                           "GROUP BY b").fetchall()
    finally:
        con.close()
    counts = [0] * bins
    for b, n in rows:
        counts[b] += n
    last = max(b for b, n in enumerate(counts) if n) + 1  # drop empty bins at the top
    return {"edges": [lo + i * width for i in range(last + 1)], "counts": counts[:last]}


def _exported_ids(fmt: "Format", files: list[Path]) -> str | None:
    """SQL: the ids of the source trajectories behind the exported rows (None: not recorded)."""
    if fmt.file_type != "parquet" or not files:
        return None
    rel = f"read_parquet({_paths(files)})"
    if fmt.table == "pairs":
        return f"SELECT chosen_id AS id FROM {rel} UNION SELECT rejected_id FROM {rel}"
    return f"SELECT DISTINCT id FROM {rel}"


def source_distributions(fmt: "Format", files: list[Path], source: Path) -> dict[str, dict[str, int]]:
    """Steps per trajectory, rewards and step labels of the exported source trajectories."""
    from schemas.store import Dataset

    trajectories = Dataset.open(source).shard_files("trajectories")
    if not trajectories:
        return {}
    ids = _exported_ids(fmt, files)
    where = f"WHERE id IN ({ids})" if ids else ""
    con = duckdb.connect()
    try:
        con.execute(f"CREATE TEMP VIEW t AS SELECT * FROM read_parquet({_paths(trajectories)}) {where}")
        steps = con.execute("SELECT len(steps) n, count(*) FROM t GROUP BY n ORDER BY n").fetchall()
        rewards = con.execute("SELECT round(reward, 2) r, count(*) FROM t WHERE reward IS NOT NULL "
                              "GROUP BY r ORDER BY r").fetchall()
        kinds = ", ".join(_sql_str(k) for k in ACTION_KINDS)
        labels = con.execute(f"SELECT coalesce(s.label, 'unknown') l, count(*) FROM (SELECT unnest(steps) s FROM t) "
                             f"WHERE s.kind IN ({kinds}) GROUP BY l ORDER BY l").fetchall()
    finally:
        con.close()
    return {"steps": {str(n): c for n, c in steps}, "rewards": {f"{r:g}": c for r, c in rewards},
            "step_labels": {str(label): c for label, c in labels}}


def kto_labels(files: list[Path]) -> dict[str, int]:
    con = duckdb.connect()
    try:
        rows = con.execute(f"SELECT label, count(*) FROM read_parquet({_paths(files)}) GROUP BY label "
                           "ORDER BY label DESC").fetchall()
    finally:
        con.close()
    return {("desirable" if label else "undesirable"): n for label, n in rows}


def filter_reasons(source: Path) -> dict[str, int]:
    """Records dropped upstream, by filter and reason, from the source manifest (empty if none)."""
    from schemas.store import Dataset

    counts = Dataset.open(source).manifest().get("counts") or {}
    reasons = {": ".join(k.split(":", 2)[1:]): v for k, v in counts.items() if k.startswith("reason:") and v}
    if not reasons:  # dedup records its drops per filter only
        reasons = {k[len("filtered:"):]: v for k, v in counts.items() if k.startswith("filtered:") and v}
    reasons |= {f"quarantined: {k[len('quarantined:'):]}": v for k, v in counts.items()
                if k.startswith("quarantined:") and v}
    return dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))


def front_matter(fmt_name: str) -> dict[str, Any]:
    return {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}],
        "tags": ["trajforge", "agent-trajectories", fmt_name],
    }


def columns_for(fmt: "Format", report: "ExportReport") -> list[str]:
    cols = _COLUMNS[fmt.name]
    return cols[report.sft_layout or "messages"] if isinstance(cols, dict) else cols


def card_data(fmt: "Format", cfg: "ExportConfig", report: "ExportReport", files: list[Path],
              source: Path | None = None) -> dict[str, Any]:
    """Everything the card shows, as JSON-ready aggregates."""
    columns = columns_for(fmt, report)
    dists: dict[str, Any] = {}
    if report.rows:
        dists["tokens"] = token_histogram(fmt, files, columns)
        if fmt.name == "trl-kto":
            dists["kto_labels"] = kto_labels(files)
    if source is not None:
        if report.rows:
            dists.update(source_distributions(fmt, files, source))
        dists["filter_reasons"] = filter_reasons(source)
    return {
        "format": fmt.name,
        "description": fmt.description,
        "sft_layout": report.sft_layout,
        "source": str(source) if source is not None else None,
        "counts": {"records_in": report.records_in, "records_exported": report.records_exported,
                   "rows": report.rows, "shards": len(files), "skipped": dict(sorted(report.skipped.items()))},
        "sources": {src: {"records": report.records_by_source[src], "rows": rows}
                    for src, rows in sorted(report.rows_by_source.items())},
        "steps_by_source": {src: {"count": s.count, "mean": s.mean, "min": s.min, "max": s.max}
                            for src, s in sorted(report.steps_by_source.items())},
        "token_stats": token_stats(fmt, files, columns) if report.rows else [],
        "provenance": [[*key, n] for key, n in report.provenance.most_common(20)],
        "settings": {
            "format": cfg.format, "seed": cfg.seed,
            "mix": ", ".join(f"{k}={v:g}" for k, v in cfg.mix.items()) if cfg.mix else "(all sources, weight 1)",
            "reasoning": "kept (reasoning_content)" if report.reasoning else "dropped",
            "web_max_chars": cfg.web_max_chars, "shard_rows": cfg.shard_rows,
            "kto_mode": cfg.kto_mode if fmt.name == "trl-kto" else "-",
        },
        "distributions": dists,
    }


# ---- rendering ---------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def draw_plots(out: Path, data: dict[str, Any]) -> list[tuple[str, str]]:
    """Write the card's PNGs under `out/plots`; returns (title, relative path) of those drawn."""
    d = data["distributions"]
    folder = out / PLOTS_DIR
    for old in folder.glob("*.png"):  # a plot with nothing to show this time must not linger
        old.unlink()
    specs = [
        ("Steps per exported trajectory", "steps.png",
         lambda p: plots.bar_chart(d.get("steps", {}), p, "Steps per exported trajectory", "steps", "trajectories")),
        ("Approximate tokens per row", "tokens.png",
         lambda p: plots.histogram(d.get("tokens", {}).get("edges", []), d.get("tokens", {}).get("counts", []), p,
                                   "Approximate tokens per row", "tokens (regex word pieces)")),
        ("Source mix (rows)", "sources.png",
         lambda p: plots.bar_chart({s: v["rows"] for s, v in data["sources"].items()}, p, "Source mix", "source",
                                   "rows", horizontal=len(data["sources"]) > 6)),
        ("Reward distribution", "rewards.png",
         lambda p: plots.bar_chart(d.get("rewards", {}), p, "Reward of exported trajectories", "reward",
                                   "trajectories")),
        ("Step labels", "step_labels.png",
         lambda p: plots.bar_chart(d.get("step_labels", {}), p, "Labels of agent steps", "label", "steps")),
        ("KTO labels", "kto_labels.png",
         lambda p: plots.bar_chart(d.get("kto_labels", {}), p, "KTO example labels", "label", "rows")),
        ("Filter reasons (upstream)", "filter_reasons.png",
         lambda p: plots.bar_chart(d.get("filter_reasons", {}), p, "Records dropped upstream", "filter: reason",
                                   "records", horizontal=True)),
    ]
    return [(title, f"{PLOTS_DIR}/{name}") for title, name, draw in specs if draw(folder / name)]


def render_card(data: dict[str, Any], drawn: list[tuple[str, str]]) -> str:
    c = data["counts"]
    yaml_text = yaml.safe_dump(front_matter(data["format"]), sort_keys=False)
    parts = [f"---\n{yaml_text}---", f"# trajforge export: `{data['format']}`", "", data["description"], ""]
    if data["format"] == "trl-sft":
        parts.append(f"Layout: **{data['sft_layout']}**.\n")
    rows_total = c["rows"]
    reasons = data["distributions"].get("filter_reasons", {})
    parts += [
        "Made by `trajforge export`. Rendering rules (roles, tool calls, masks, pairs, labels): "
        "see `docs/export.md` in the trajforge repository.", "",
        "## Counts", "",
        _table(["", "count"], [
            ["input records", c["records_in"]],
            ["exported records", c["records_exported"]],
            ["rows written", rows_total],
            ["shards", c["shards"]],
            *[[f"skipped: {reason}", n] for reason, n in c["skipped"].items()],
        ]), "",
        "## Source mix", "",
        _table(["source", "records", "rows", "share of rows"], [
            [src, v["records"], v["rows"], f"{v['rows'] / rows_total:.1%}" if rows_total else "-"]
            for src, v in data["sources"].items()
        ]), "",
        "## Steps per exported trajectory", "",
        _table(["source", "trajectories", "mean", "min", "max"], [
            [src, s["count"], s["mean"], s["min"], s["max"]] for src, s in data["steps_by_source"].items()
        ]), "",
        "## Length (approximate tokens)", "",
        "Token counts are **approximate**: regex word pieces (`\\w+|[^\\w\\s]`), computed with DuckDB over "
        "the exported shards; real tokenizers differ.", "",
        _table(["column", "rows", "messages/row", "tokens mean", "p50", "p95", "max", "total"], [
            [s["column"], s["rows"], s["messages_mean"], s["tokens_mean"], s["tokens_p50"], s["tokens_p95"],
             s["tokens_max"], s["tokens_total"]] for s in data["token_stats"]
        ]), "",
    ]
    if reasons:
        parts += ["## Filtered upstream", "", "Records the source dataset's filter or dedup stage dropped "
                  "(from its manifest).", "", _table(["filter: reason", "records"], [[k, n] for k, n in reasons.items()]), ""]
    if drawn:
        parts += ["## Plots", ""]
        parts += [f"![{title}]({path})\n" for title, path in drawn]
    parts += [
        "## Provenance", "",
        _table(["method", "source dataset", "model", "records"], data["provenance"]), "",
        "## Export settings", "",
        _table(["setting", "value"], [[k, v] for k, v in data["settings"].items()]), "",
    ]
    return "\n".join(parts)


def render_all(out: Path, data: dict[str, Any]) -> Path:
    path = out / "README.md"
    path.write_text(render_card(data, draw_plots(out, data)))
    return path


def write_card(out: Path, fmt: "Format", cfg: "ExportConfig", report: "ExportReport", files: list[Path],
               source: Path | None = None) -> Path:
    """card.json, plots/*.png and README.md for a finished export; `source` is the exported dataset."""
    data = card_data(fmt, cfg, report, files, source)
    (out / CARD_DATA).write_text(json.dumps(data, indent=1, default=str) + "\n")
    return render_all(out, data)


def regenerate_card(out: str | Path) -> Path:
    """Rebuild README.md and plots/*.png of an export directory from its card.json."""
    out = Path(out)
    try:
        data = json.loads((out / CARD_DATA).read_text())
    except FileNotFoundError:
        raise CardError(f"{out}: no {CARD_DATA}; is this a trajforge export directory?") from None
    except ValueError as exc:
        raise CardError(f"{out / CARD_DATA}: not valid JSON ({exc})") from None
    return render_all(out, data)
