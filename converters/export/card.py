"""The export's README.md: a Hugging Face dataset card with statistics.

YAML front matter declares one `default` config whose `train` split is `data/train-*`, so
`datasets.load_dataset(OUT)` finds the shards. Token and message statistics are computed with
DuckDB over the exported shards (approximate tokens: the regex in `tokens`); record counts,
the source mix, steps per trajectory and provenance come from the streaming export itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import yaml

from converters.export.tokens import PATTERN

if TYPE_CHECKING:
    from converters.export.formats import Format
    from converters.export.run import ExportConfig, ExportReport

# Conversation-valued columns to measure, per format (Parquet exports).
_COLUMNS = {
    "trl-sft": {"messages": ["messages"], "prompt-completion": ["prompt", "completion"]},
    "trl-dpo": ["prompt", "chosen", "rejected"],
    "trl-kto": ["prompt", "completion"],
    "sharegpt": ["conversations"],
    "openai": ["messages"],
}


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


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


def _length_expr(fmt: str, column: str) -> str:
    return f"json_array_length({column})" if fmt == "openai" else f"len({column})"


def _relation(fmt: "Format", files: list[Path]) -> str:
    paths = "[" + ", ".join(_sql_str(str(p)) for p in files) + "]"
    if fmt.file_type == "jsonl":
        return f"read_json({paths}, format='newline_delimited', columns={{'messages': 'JSON'}})"
    return f"read_parquet({paths})"


def token_stats(fmt: "Format", files: list[Path], columns: list[str]) -> list[dict[str, Any]]:
    """Per column: rows, messages per row (mean), approx tokens per row (mean, p50, p95, max, total)."""
    rel = _relation(fmt, files)
    out = []
    con = duckdb.connect()
    try:
        for column in columns:
            tokens = f"len(regexp_extract_all(coalesce({_text_expr(fmt.name, column)}, ''), {_sql_str(PATTERN)}))"
            query = (f"SELECT count(*), avg({_length_expr(fmt.name, column)}), avg(t), quantile_disc(t, 0.5), "
                     f"quantile_disc(t, 0.95), max(t), sum(t) FROM (SELECT {column}, {tokens} AS t FROM {rel})")
            n, msgs, mean, p50, p95, mx, total = con.execute(query).fetchone()
            out.append({"column": column, "rows": n, "messages_mean": msgs, "tokens_mean": mean,
                        "tokens_p50": p50, "tokens_p95": p95, "tokens_max": mx, "tokens_total": total})
    finally:
        con.close()
    return out


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


def front_matter(fmt: "Format") -> dict[str, Any]:
    return {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}],
        "tags": ["trajforge", "agent-trajectories", fmt.name],
    }


def columns_for(fmt: "Format", report: "ExportReport") -> list[str]:
    cols = _COLUMNS[fmt.name]
    return cols[report.sft_layout or "messages"] if isinstance(cols, dict) else cols


def render_card(fmt: "Format", cfg: "ExportConfig", report: "ExportReport", files: list[Path]) -> str:
    stats = token_stats(fmt, files, columns_for(fmt, report)) if report.rows else []
    yaml_text = yaml.safe_dump(front_matter(fmt), sort_keys=False)
    parts = [f"---\n{yaml_text}---", f"# trajforge export: `{fmt.name}`", "", fmt.description, ""]
    if fmt.name == "trl-sft":
        parts.append(f"Layout: **{report.sft_layout}**.\n")
    parts += [
        "Made by `trajforge export`. Rendering rules (roles, tool calls, masks, pairs, labels): "
        "see `docs/export.md` in the trajforge repository.", "",
        "## Counts", "",
        _table(["", "count"], [
            ["input records", report.records_in],
            ["exported records", report.records_exported],
            ["rows written", report.rows],
            ["shards", len(files)],
            *[[f"skipped: {reason}", n] for reason, n in sorted(report.skipped.items())],
        ]), "",
        "## Source mix", "",
        _table(["source", "records", "rows", "share of rows"], [
            [src, report.records_by_source[src], rows, f"{rows / report.rows:.1%}" if report.rows else "-"]
            for src, rows in sorted(report.rows_by_source.items())
        ]), "",
        "## Steps per exported trajectory", "",
        _table(["source", "trajectories", "mean", "min", "max"], [
            [src, s.count, s.mean, s.min, s.max] for src, s in sorted(report.steps_by_source.items())
        ]), "",
        "## Length (approximate tokens)", "",
        "Token counts are **approximate**: regex word pieces (`\\w+|[^\\w\\s]`), computed with DuckDB over "
        "the exported shards; real tokenizers differ.", "",
        _table(["column", "rows", "messages/row", "tokens mean", "p50", "p95", "max", "total"], [
            [s["column"], s["rows"], s["messages_mean"], s["tokens_mean"], s["tokens_p50"], s["tokens_p95"],
             s["tokens_max"], s["tokens_total"]] for s in stats
        ]), "",
        "## Provenance", "",
        _table(["method", "source dataset", "model", "records"], [
            [*key, n] for key, n in report.provenance.most_common(20)
        ]), "",
        "## Export settings", "",
        _table(["setting", "value"], [
            ["format", cfg.format], ["seed", cfg.seed],
            ["mix", ", ".join(f"{k}={v:g}" for k, v in cfg.mix.items()) if cfg.mix else "(all sources, weight 1)"],
            ["reasoning", "kept (reasoning_content)" if report.reasoning else "dropped"],
            ["web_max_chars", cfg.web_max_chars], ["shard_rows", cfg.shard_rows],
            ["kto_mode", cfg.kto_mode if fmt.name == "trl-kto" else "-"],
        ]), "",
    ]
    return "\n".join(parts)


def write_card(out: Path, fmt: "Format", cfg: "ExportConfig", report: "ExportReport", files: list[Path]) -> Path:
    path = out / "README.md"
    path.write_text(render_card(fmt, cfg, report, files))
    return path
