"""The end-of-run summary of the pipeline flow: counts per stage and reason, LLM use, where outputs are."""

from __future__ import annotations

import shlex
from typing import Any

from rich.table import Table

from backends.stats import COST_LOCAL, COST_PRICED, COST_UNKNOWN, format_cost
from flows.console import console
from schemas.usage import from_counts

# Which count is a stage's input and which its output (stages name them differently).
_IN = ("in", "tasks_total", "tasks")
_OUT = ("out", "kept", "written", "exported", "trajectories")
_NOT_REASONS = ("source:", "available:", "llm_endpoint:")
_ENDPOINT = "llm_endpoint:"
_ENDPOINT_COUNTS = ("calls", "ok", "failed", "failed_over", "taken_out")
_LLM = (("llm_calls", "LLM calls"), ("llm_cache_hits", "cache hits"), ("llm_prompt_tokens", "prompt tokens"),
        ("llm_completion_tokens", "completion tokens"))


def _first(counts: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((counts[k] for k in keys if k in counts), "-")


def reasons(counts: dict[str, Any]) -> dict[str, Any]:
    """The per-reason counts of a stage (`filtered:x`, `reason:f:r`, `quarantined:s`, `skipped:r`)."""
    return {k: v for k, v in counts.items() if ":" in k and not k.startswith(_NOT_REASONS)}


def endpoint_counts(llm: dict[str, Any]) -> dict[str, int]:
    """A generation's per-endpoint LLM counts as stage counts: `llm_endpoint:<url>|<count>`."""
    return {f"{_ENDPOINT}{url}|{k}": c.get(k, 0) for url, c in (llm.get("endpoints") or {}).items()
            for k in _ENDPOINT_COUNTS}


def _endpoint_lines(stage: dict[str, Any]) -> list[str]:
    per: dict[str, dict[str, Any]] = {}
    for key, n in stage["counts"].items():
        if key.startswith(_ENDPOINT):
            url, _, what = key[len(_ENDPOINT):].rpartition("|")
            per.setdefault(url, {})[what] = n
    return [f"  {stage['stage']} {stage['name']}: {url} " + ", ".join(f"{k.replace('_', ' ')} {c.get(k, 0):,}"
                                                                     for k in _ENDPOINT_COUNTS)
            for url, c in per.items()]


def llm_totals(stages: list[dict[str, Any]]) -> dict[str, int]:
    return {label: sum(int(s["counts"].get(key, 0)) for s in stages) for key, label in _LLM}


def unusable_answers(stages: list[dict[str, Any]]) -> str:
    """Answers still unusable after the retries, each counted once; for cut ones, how many the agent
    recorded as failed steps and how many other roles of the model (user persona, simulator, judge) got."""
    truncated = sum(int(s["counts"].get("llm_truncated", 0)) for s in stages)
    agent = sum(int(s["counts"].get("failed_step:truncated", 0)) for s in stages if "llm_truncated" in s["counts"])
    other = sum(int(s["counts"].get("llm_unusable", 0)) for s in stages)
    split = f" ({agent:,} agent turns kept as failed steps, {truncated - agent:,} of other roles: user, simulator, " \
            "judge)" if truncated != agent else ""
    return f"truncated answers {truncated:,}{split}, other unusable answers {other:,}"


def llm_cost(stages: list[dict[str, Any]]) -> str:
    """The stages' model cost and how it is known: local models cost 0 (said so), an unpriced remote model
    makes it unknown, never 0."""
    costs = [(s["counts"].get("llm_cost_usd"), s["counts"].get("llm_cost")) for s in stages
             if "llm_cost" in s["counts"]]
    if not costs:
        return "no model calls"
    if any(cost is None for cost, _ in costs):
        return COST_UNKNOWN
    bases = {basis for _, basis in costs}
    basis = COST_LOCAL if bases == {COST_LOCAL} else COST_PRICED if bases == {COST_PRICED} else \
        f"{COST_PRICED}; local models 0"
    return format_cost(sum(cost for cost, _ in costs), basis)


def success_line(stage: dict[str, Any]) -> str | None:
    """How the agent did in a generate stage: successes / episodes, per method and environment."""
    c = stage["counts"]
    if stage["stage"] != "generate" or not c.get("episodes"):
        return None
    where = f" ({c['method']}{' on ' + c['env'] if c.get('env') else ''})" if c.get("method") else ""
    return (f"  generate {stage['name']}{where}: successes = {c.get('successes', 0)} of {c['episodes']} episodes "
            f"({c.get('successes', 0) / c['episodes']:.1%})")


def usage_line(stage: dict[str, Any]) -> str | None:
    """The model calls behind a generate stage's records (all of them, resumed runs included)."""
    totals = from_counts(stage["counts"])
    if stage["stage"] != "generate" or not totals or not totals["calls"]:
        return None
    cost = "unknown (no llm.price)" if totals["cost_usd"] is None else f"${totals['cost_usd']:,.4f}"
    return (f"  generate {stage['name']}: steps made by the model {totals['calls']:,} ({totals['cached']:,} from cache), "
            f"tokens {totals['prompt_tokens']:,} prompt / {totals['completion_tokens']:,} completion, cost {cost}")


def role_lines(stage: dict[str, Any]) -> list[str]:
    """Who played each role beside the acting model in a generate stage (its dataset's last run)."""
    if stage["stage"] != "generate":
        return []
    from generators.base import describe_role
    from schemas.store import Dataset

    try:
        roles = (Dataset.open(stage["output"]).manifest().get("last_run") or {}).get("roles") or {}
    except Exception:  # noqa: BLE001 - a summary line is not worth failing the summary for
        return []
    return [f"  generate {stage['name']}: {name} = {describe_role(info)}" for name, info in roles.items()]


def print_run_summary(result: dict[str, Any]) -> None:
    stages = result["stages"]
    table = Table(title="pipeline summary", title_justify="left")
    for col in ("stage", "name", "status", "in", "out", "filtered", "quarantined"):
        table.add_column(col, justify="right" if col in ("in", "out", "filtered", "quarantined") else "left",
                         no_wrap=True)
    for s in stages:
        c = s["counts"]
        status = "ran" if s["reason"] == "ran" else "skipped"
        dropped = (sum(v for k, v in c.items() if k.startswith("skipped:")) if s["stage"] == "export"
                   else c.get("filtered", "-"))
        table.add_row(s["stage"], s["name"], status, str(_first(c, _IN)), str(_first(c, _OUT)), str(dropped),
                      str(c.get("quarantined", "-")))
    console.print(table)
    console.print("[bold]by reason[/]")
    for s in stages:
        if (line := success_line(s)) is not None:  # how the agent did, failures included
            console.print(line, highlight=False)
        for line in role_lines(s):
            console.print(line, highlight=False, markup=False)
        for key, n in reasons(s["counts"]).items():
            console.print(f"  {s['stage']} {s['name']}: {key} = {n}", highlight=False)
        report = s.get("report") if s["stage"] == "decontaminate" else None
        if report:
            refs = ", ".join(f"{source} ({n})" for source, n in report["references"].items())
            console.print(f"  decontaminate {s['name']}: {report['dropped']} of {report['records_in']} records overlap "
                          f"test data [{refs}]", highlight=False, markup=False)
            for e in report["examples"][:3]:
                console.print(f"    e.g. {e['id']} ~ {e['reference_source']} {e['reference']} ({e['kind']}): "
                              f"{e['evidence']!r}", highlight=False, markup=False, soft_wrap=True)
    console.print("LLM: " + ", ".join(f"{label} {n:,}" for label, n in llm_totals(stages).items())
                  + f", {unusable_answers(stages)}, cost {llm_cost(stages)}", highlight=False)
    for line in filter(None, map(usage_line, stages)):
        console.print(line, highlight=False)
    for line in (line for s in stages for line in _endpoint_lines(s)):
        console.print(line, highlight=False)
    console.print("[bold]outputs[/]")
    for s in stages:
        if s["stage"] != "export":
            console.print(f"  {s['stage']:13} {s['name']:24} {s['output']}", highlight=False)
    for s in stages:
        if s["stage"] == "export":
            console.print(f"  {'export':13} {s['name']:24} {s['output']}  (README.md, plots/, data/*.parquet)",
                          highlight=False)
    console.print(f"done in {result['seconds']:.1f}s; runs logged in {result['output']}/_runs.jsonl; "
                  "load an export with datasets.load_dataset('parquet', data_files='EXPORT/data/*.parquet'); "
                  "inspect a dataset with trajforge stats DIR", highlight=False)
    console.print(f"look at the data in a browser: trajforge view {shlex.quote(str(result['output']))}",
                  highlight=False, soft_wrap=True)
