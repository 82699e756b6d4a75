"""The export's README.md: a Hugging Face dataset card with statistics and plots.

YAML front matter declares one `default` config whose `train` split is `data/train-*`, so
`datasets.load_dataset(OUT)` finds the shards. The card's load line (`load_line`) names the shards
instead: datasets 5.2 caches a folder with such front matter by its name alone, so a second export
in a folder of the same name would load the first one's rows. It is a Hub-style folder (what
`push_to_hub` uploads), not `save_to_disk`'s Arrow: `load_from_disk` cannot read it. Record counts, the source mix, steps per
trajectory, rewards, step labels and provenance are counted by the streaming export itself over
the trajectories behind the exported rows (both sides of a pair), and token and message
statistics over the rows as they are written (`lengths`: approximate tokens, characters / 4;
exact for `tokenized`); filter reasons come from the source dataset's manifest. The training section
(`guide`) gives the trainer settings the export is correct under.

Everything the card shows is first gathered into `card.json` (aggregates only, small at any
size); README.md and `plots/*.png` are renderings of it, so `regenerate_card(OUT)`
(`trajforge card OUT`) rebuilds both without the source dataset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from converters.export import plots
from converters.export.guide import training_section
from converters.export.lengths import CHARS_PER_TOKEN
from converters.export.roles import roles_section

if TYPE_CHECKING:
    from converters.export.formats import Format
    from converters.export.run import ExportConfig, ExportReport

CARD_DATA = "card.json"
README = "README.md"
PLOTS_DIR = "plots"
TOKEN_BINS = 20


class CardError(Exception):
    """An export directory whose card cannot be rebuilt; the message is one line."""


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


def source_decontamination(source: Path) -> dict[str, Any] | None:
    """The decontamination report of the exported dataset, when the decontaminate stage wrote it."""
    from schemas.store import Dataset

    report = Dataset.open(source).manifest().get("decontamination")
    return report if isinstance(report, dict) else None


def front_matter(fmt_name: str) -> dict[str, Any]:
    return {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}],
        "tags": ["trajforge", "agent-trajectories", fmt_name],
    }


def load_line(out: Path, file_type: str) -> str:
    """The Python line that loads the export in `out` (its shards by absolute path) with `datasets`."""
    shards = str(out.resolve() / "data" / f"train-*.{file_type}")
    builder = "json" if file_type == "jsonl" else file_type
    return f"from datasets import load_dataset; ds = load_dataset({builder!r}, data_files={shards!r}, split='train')"


def loading_section(line: str) -> list[str]:
    return ["## Loading", "", "```python", line, "```", "",
            "A folder of shards as `push_to_hub` uploads it, not `save_to_disk`'s Arrow files: `load_from_disk` "
            "cannot read it. The line names the shards: `load_dataset(folder)` reads them too, but datasets caches "
            "such a folder by its name, so another export in a folder of the same name would load these rows.", ""]


def card_data(fmt: "Format", cfg: "ExportConfig", report: "ExportReport", files: list[Path],
              source: Path | None = None) -> dict[str, Any]:
    """Everything the card shows, as JSON-ready aggregates."""
    dists: dict[str, Any] = {}
    if report.rows:
        dists["tokens"] = report.row_lengths.equal_width(TOKEN_BINS)
        if fmt.name == "trl-kto":
            dists["kto_labels"] = {("desirable" if label else "undesirable"): n
                                   for label, n in sorted(report.kto_labels.items(), reverse=True)}
    if report.rows:
        dists["steps"] = {str(n): c for n, c in sorted(report.steps.items())}
        dists["rewards"] = {f"{r:g}": c for r, c in sorted(report.rewards.items())}
        dists["step_labels"] = dict(sorted(report.step_labels.items()))
    if source is not None:
        dists["filter_reasons"] = filter_reasons(source)
    return {
        "format": fmt.name,
        "description": fmt.description,
        "sft_layout": report.sft_layout,
        "tokenizer": report.tokenizer,
        "token_truth": _token_truth(report.token_truth),
        "source": str(source) if source is not None else None,
        "counts": {"records_in": report.records_in, "records_exported": report.records_exported,
                   "rows": report.rows, "shards": len(files), "skipped": dict(sorted(report.skipped.items()))},
        "notes": dict(sorted(report.notes.items())),
        "sources": {src: {"records": report.records_by_source[src], "rows": rows}
                    for src, rows in sorted(report.rows_by_source.items())},
        "steps_by_source": {src: {"count": s.count, "mean": s.mean, "min": s.min, "max": s.max}
                            for src, s in sorted(report.steps_by_source.items())},
        "token_stats": [stats.summary(column) for column, stats in report.lengths.items()] if report.rows else [],
        "provenance": [[*key, n] for key, n in report.provenance.most_common(20)],
        "settings": {
            "format": cfg.format, "seed": cfg.seed,
            "mix": ", ".join(f"{k}={v:g}" for k, v in cfg.mix.items()) if cfg.mix else "(all sources, weight 1)",
            "reasoning": "kept (reasoning_content)" if report.reasoning else "dropped",
            "web_max_chars": cfg.web_max_chars, "shard_rows": cfg.shard_rows,
            "kto_mode": report.kto_mode or "-", "dpo_level": report.dpo_level or "-",
            "history": "each generated record's requests as sent" if cfg.history == "request" else "the whole history",
            "failed trajectories": ("included" if report.include_failed else "left out") if fmt.supervised else "-",
        },
        "distributions": dists,
        "decontamination": cfg.decontamination or (source_decontamination(source) if source is not None else None),
        "usage": report.usage.as_card(),
        "roles": report.roles.as_card(),
        "templates": report.templates.as_card(),
    }


def _token_truth(truth: dict[str, Any] | None) -> dict[str, Any] | None:
    if truth is None:
        return None
    firsts = sorted(truth["first_difference"])
    return {"choice": truth["choice"], "rows": dict(truth["rows"]), "compared": truth["compared"],
            "foreign": truth["foreign"],
            "recorded_by": dict(truth["recorded_by"].most_common()),
            "differ": truth["differ"],
            "first_difference": {"min": firsts[0], "median": firsts[len(firsts) // 2], "max": firsts[-1]}
            if firsts else None, "examples": truth["examples"]}


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
    specs = [
        ("Steps per exported trajectory", "steps.png",
         lambda p: plots.value_chart(d.get("steps", {}), p, "Steps per exported trajectory", "steps", "trajectories")),
        ("Tokens per row", "tokens.png",
         lambda p: plots.histogram(d.get("tokens", {}).get("edges", []), d.get("tokens", {}).get("counts", []), p,
                                   "Tokens per row", "tokens" if data["format"] == "tokenized"
                                   else f"approximate tokens (characters / {CHARS_PER_TOKEN})")),
        ("Source mix (rows)", "sources.png",
         lambda p: plots.bar_chart({s: v["rows"] for s, v in data["sources"].items()}, p, "Source mix", "source",
                                   "rows", horizontal=len(data["sources"]) > 6)),
        ("Reward distribution", "rewards.png",
         lambda p: plots.value_chart(d.get("rewards", {}), p, "Reward of exported trajectories", "reward",
                                     "trajectories")),
        ("Step labels", "step_labels.png",
         lambda p: plots.bar_chart(d.get("step_labels", {}), p, "Labels of agent steps", "label", "steps")),
        ("KTO labels", "kto_labels.png",
         lambda p: plots.bar_chart(d.get("kto_labels", {}), p, "KTO example labels", "label", "rows")),
        ("Filter reasons (upstream)", "filter_reasons.png",
         lambda p: plots.bar_chart(d.get("filter_reasons", {}), p, "Records dropped upstream", "filter: reason",
                                   "records", horizontal=True)),
    ]
    for _, name, _ in specs:  # a plot with nothing to show this time must not linger (only ours: no glob)
        (folder / name).unlink(missing_ok=True)
    return [(title, f"{PLOTS_DIR}/{name}") for title, name, draw in specs if draw(folder / name)]


def render_card(data: dict[str, Any], drawn: list[tuple[str, str]]) -> str:
    c = data["counts"]
    yaml_text = yaml.safe_dump(front_matter(data["format"]), sort_keys=False)
    parts = [f"---\n{yaml_text}---", f"# trajforge export: `{data['format']}`", "", data["description"], ""]
    if data["format"] == "trl-sft":
        parts.append(f"Layout: **{data['sft_layout']}**.\n")
    rows_total = c["rows"]
    reasons = data["distributions"].get("filter_reasons", {})
    parts += ["Made by `trajforge export`. Rendering rules (roles, tool calls, masks, pairs, labels): "
              "see `docs/export.md` in the trajforge repository.", ""]
    if data.get("load"):
        parts += loading_section(data["load"])
    parts += [
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
        *_length_heading(data["format"]),
        _table(["column", "rows", "trained tokens/row" if data["format"] in ("tokenized", "rl") else "messages/row",
                "tokens mean", "p50", "p95", "max", "total"], [
            [s["column"], s["rows"], s["messages_mean"], s["tokens_mean"], s["tokens_p50"], s["tokens_p95"],
             s["tokens_max"], s["tokens_total"]] for s in data["token_stats"]
        ]), "",
    ]
    parts += token_truth_section(data.get("token_truth"))
    parts += usage_section(data.get("usage") or {})
    parts += roles_section(data.get("roles") or [])
    parts += training_section(data)
    parts += templates_section(data.get("templates") or [])
    if reasons:
        parts += ["## Filtered upstream", "", "Records the source dataset's filter or dedup stage dropped "
                  "(from its manifest).", "", _table(["filter: reason", "records"], [[k, n] for k, n in reasons.items()]), ""]
    parts += _decontamination_section(data.get("decontamination"))
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


def _decontamination_section(report: dict[str, Any] | None) -> list[str]:
    """What the decontaminate stage checked the data against and what it dropped."""
    if not report:
        return []
    settings = report.get("settings") or {}
    refs = ", ".join(f"{source} ({n:,})" for source, n in (report.get("references") or {}).items()) or "-"
    out = ["## Decontamination", "",
           f"Checked against benchmark test data: {refs}. A record was dropped when its task instruction equals or "
           f"(MinHash Jaccard >= {settings.get('threshold', '-')}) resembles a test item's, or when its instruction "
           f"or trajectory shares a {settings.get('ngram', '-')}-word n-gram with one.", "",
           _table(["", "records"], [["checked", report.get("records_in", 0)], ["dropped", report.get("dropped", 0)],
                                    *[[f"dropped: {k}", v] for k, v in (report.get("dropped_by_source") or {}).items()],
                                    *[[f"dropped by: {k}", v] for k, v in (report.get("dropped_by_kind") or {}).items()]]),
           ""]
    examples = report.get("examples") or []
    if examples:
        out += ["Examples:", "", _table(["record", "test item", "match", "overlapping words"],
                                        [[e["id"], f"{e['reference_source']} {e['reference']}", e["kind"],
                                          e["evidence"].replace("|", "/")] for e in examples[:5]]), ""]
    return out
def token_truth_section(truth: dict[str, Any] | None) -> list[str]:
    """Markdown: where the `tokenized` rows' ids come from, and the rows whose fresh render departs from the ids
    the model was fed and produced."""
    if not truth:
        return []
    rows, first = truth["rows"], truth.get("first_difference")
    out = ["## Token truth", "",
           f"Rows holding the token ids their model call recorded: {rows.get('recorded', 0):,}; rows rendered with "
           f"the chat template: {rows.get('rendered', 0):,} (`--tokens {truth['choice']}`)."
           + (f" The {truth['compared']:,} rows of model calls that recorded this tokenizer's ids were compared with a "
              "fresh render of their request and answer with the chosen template." if truth["compared"] else "")
           + (" Recorded by: " + ", ".join(f"`{name}` ({n:,} rows)" for name, n in truth["recorded_by"].items()) + "."
              if truth.get("recorded_by") else ""), ""]
    if truth.get("foreign"):
        out += [f"**{truth['foreign']:,} rows** recorded ids of another tokenizer (decoded with this one, their prompt "
                "does not hold the request's text): those rows are rendered with this tokenizer instead.", ""]
    if not truth["differ"]:
        return out + (["No row's render departs from the recorded ids.", ""] if truth["compared"] else [])
    out += [f"**{truth['differ']:,} of {truth['compared']:,} rows** render to other tokens than the model was fed "
            "and produced; the first "
            f"difference is at token {first['min']:,} to {first['max']:,} (median {first['median']:,}). Training "
            "on the render trains tokens the model did not see or write there"
            + (" (these rows hold the recorded ids)." if truth["choice"] == "recorded" else "."), "",
            _table(["record", "step", "first difference at token", "recorded", "rendered"],
                   [[e["id"], e["step"], e["position"], repr(e["recorded"]).replace("|", "\\|"),
                     repr(e["rendered"]).replace("|", "\\|")] for e in truth["examples"]]), ""]
    return out


def _cost(value: float | None) -> str:
    return "unknown (calls without llm.price)" if value is None else f"${value:,.4f}"


def usage_section(usage: dict[str, Any]) -> list[str]:
    """Markdown: the model calls behind the exported records (tokens, cost) and the episodes' success rate."""
    parts: list[str] = []
    if usage.get("usage_total"):
        t = usage["usage_total"]
        parts += ["## Model usage", "",
                  f"The model calls that made the steps of the exported trajectories: {t['calls']:,} calls "
                  f"({t['cached']:,} served from the cache, at no cost), {t['prompt_tokens']:,} prompt and "
                  f"{t['completion_tokens']:,} completion tokens, {t['latency_s']:,.1f} s, cost {_cost(t['cost_usd'])} "
                  "(local models cost 0; retried attempts included).", "",
                  _table(["method", "environment", "calls", "cached", "prompt tokens", "completion tokens", "cost"],
                         [[r["method"], r["env"], r["calls"], r["cached"], r["prompt_tokens"], r["completion_tokens"],
                           _cost(r["cost_usd"])] for r in usage["usage"]]), ""]
    if usage.get("outcomes"):
        parts += ["## Success rate", "",
                  "Successes / episodes of the input trajectories with a known outcome (before failed ones are "
                  "left out).", "",
                  _table(["method", "environment", "successes", "episodes", "rate"],
                         [[o["method"], o["env"], o["successes"], o["episodes"], f"{o['rate']:.1%}"]
                          for o in usage["outcomes"]]), ""]
    return parts


def templates_section(templates: list[dict[str, Any]]) -> list[str]:
    """Markdown: which of TRL's bundled training templates render every row of the export whole."""
    if not templates:
        return []
    from converters.export.templates import CALLS_DROPPED, EMPTY_TURN, TOOLS_DROPPED

    rows = []
    for t in templates:
        if "error" in t:
            rows.append([f"`{t['template']}`", "-", "-", "-", "-", f"do not use: cannot render an agent conversation "
                         f"({t['error']})"])
            continue
        lost = t["rows"] - t["whole"]
        rows.append([f"`{t['template']}`", f"{t['whole']:,} of {t['rows']:,}", t[EMPTY_TURN], t[CALLS_DROPPED],
                     t[TOOLS_DROPPED], "renders every row" if not lost else f"do not use: {lost:,} rows train on less "
                                                                            "than they hold"])
    return ["## Chat templates", "",
            "How TRL's bundled training templates (SFTTrainer swaps one in for its model family with "
            "`assistant_only_loss=True`) render this export's rows: a trainable assistant turn must show its text and "
            "tool calls, and a row's tools must be in the prompt. Train with a template that renders every row, or "
            "export `--format tokenized` with your tokenizer, which checks each row against its template.", "",
            _table(["template", "rows rendered whole", "rows with a turn rendered empty", "rows with tool calls dropped",
                    "rows with tools dropped", "verdict"], rows), ""]


def _length_heading(fmt: str) -> list[str]:
    if fmt == "tokenized":
        return ["## Length (tokens)", "", "Exact token counts of the exported `input_ids`.", ""]
    if fmt == "rl":
        return ["## Length (tokens)", "", "Exact token counts of the exported `prompt_ids` and `completion_ids`.", ""]
    return ["## Length (approximate tokens)", "",
            f"Token counts are **approximate**: characters / {CHARS_PER_TOKEN} (contents, reasoning, tool-call names "
            "and arguments), measured on the rows as they are written; real tokenizers differ, code and "
            "non-English text give more. `--format tokenized` counts exactly.", ""]


def render_all(out: Path, data: dict[str, Any]) -> Path:
    path = out / README
    path.write_text(render_card(data, draw_plots(out, data)))
    return path


def write_card(out: Path, fmt: "Format", cfg: "ExportConfig", report: "ExportReport", files: list[Path],
               source: Path | None = None, extra_files: list[str] | None = None) -> Path:
    """card.json, plots/*.png and README.md for a finished export; `source` is the exported dataset.
    card.json lists every file the export wrote (shards, `extra_files`, the card): `--overwrite` removes
    those and nothing else."""
    data = card_data(fmt, cfg, report, files, source)
    data["load"] = load_line(out, fmt.file_type)
    drawn = draw_plots(out, data)
    data["files"] = sorted({*(f.relative_to(out).as_posix() for f in files), *(extra_files or []),
                            *(path for _, path in drawn), CARD_DATA, README})
    (out / CARD_DATA).write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / README).write_text(render_card(data, drawn))
    return out / README


def regenerate_card(out: str | Path) -> Path:
    """Rebuild README.md and plots/*.png of an export directory from its card.json."""
    out = Path(out)
    try:
        data = json.loads((out / CARD_DATA).read_text())
    except FileNotFoundError:
        raise CardError(f"{out}: no {CARD_DATA}; is this a trajforge export directory?") from None
    except ValueError as exc:
        raise CardError(f"{out / CARD_DATA}: not valid JSON ({exc})") from None
    if "load" not in data:  # a card written before the line was
        from converters.export.formats import FORMATS

        fmt = FORMATS.get(data.get("format"))
        if fmt is not None:
            data["load"] = load_line(out, fmt.file_type)
    return render_all(out, data)
