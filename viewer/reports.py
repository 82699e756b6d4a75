"""Eval and improve reports `trajforge view` shows next to the datasets: found at or below each DIR.

An eval output (`trajforge eval --output DIR`) is a dataset directory with `eval.json`; an improve
output (`trajforge improve`) is a folder with `report.json` (before, after, their comparison, and
`rounds` when it ran several). The page reads these files as the commands wrote them and adds
what they leave out: each task's episodes (links), the criteria each failed episode failed, and
pass@k per task. Paths a report names (eval directories) are matched to the sources shown, also
when the output was moved since (a path under the report's old `output` is rebased onto its folder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from evals.metrics import pass_at_k
from evals.report import REPORT as EVAL_REPORT
from evals.report import failed_criteria, headline
from schemas.store import MANIFEST
from viewer.sources import SEARCH_DEPTH, Source, ViewError, first_line

IMPROVE_REPORT = "report.json"
# An eval's episodes listed with their task and failed criteria; beyond this many, the page says so.
MAX_EPISODES = 20_000


@dataclass(frozen=True)
class Report:
    """One eval or improve output the page shows."""

    name: str
    path: Path
    kind: Literal["eval", "improve"]


def _kind(path: Path) -> Literal["eval", "improve"] | None:
    if (path / EVAL_REPORT).is_file() and (path / MANIFEST).is_file():
        return "eval"
    if (path / IMPROVE_REPORT).is_file():
        return "improve"
    return None


def find_reports(paths: list[Path]) -> list[Report]:
    """The eval and improve outputs at or below each path (as deep as datasets are searched)."""
    found: list[Report] = []
    seen: set[Path] = set()

    def visit(path: Path, name: str, depth: int) -> None:
        kind = _kind(path)
        if kind and path.resolve() not in seen:
            seen.add(path.resolve())
            found.append(Report(name, path, kind))
        if depth == 0 or (path / MANIFEST).is_file():  # a dataset holds no other output
            return
        try:
            children = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
        except OSError:
            return
        for child in children:
            visit(child, f"{name}/{child.name}", depth - 1)

    for path in paths:
        if path.is_dir():
            visit(path, str(path).rstrip("/") or "/", SEARCH_DEPTH)
    return found


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ViewError(f"{path}: cannot read it ({first_line(exc)})") from None
    if not isinstance(value, dict):
        raise ViewError(f"{path}: not a JSON object")
    return value


def plots(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in (path / "plots").glob("*.png")) if (path / "plots").is_dir() else []


# ---- an eval -------------------------------------------------------------------------------------


# Per episode what the report counted: its task (as `evals.report.build_report` names it), outcome,
# the evaluation (failed criteria) and whether the simulated user spoiled it.
EPISODES_SQL = """SELECT id, coalesce(provenance.source_id, json_extract_string(details, '$.task.id'), id) AS task,
    success, reward, json_extract(details, '$.evaluation') AS evaluation,
    coalesce(json_extract_string(details, '$.user_fidelity.ok') = 'false', false) AS spoiled
    FROM {relation} ORDER BY id LIMIT {limit}"""


def eval_view(report: dict[str, Any], episodes: list[dict[str, Any]], source: int | None) -> dict[str, Any]:
    """The eval page: the report's headline, pass@k, failures, and per task pass@1, pass@k, pass^k,
    failures by criterion and the task's episodes (each with the criteria it failed)."""
    k = int(report.get("samples") or 1)
    by_task: dict[str, list[dict[str, Any]]] = {}
    for e in episodes[:MAX_EPISODES]:
        evaluation = json.loads(e["evaluation"]) if isinstance(e["evaluation"], str) else e["evaluation"]
        criteria = [] if e["spoiled"] else failed_criteria(evaluation if isinstance(evaluation, dict) else None)
        by_task.setdefault(str(e["task"]), []).append(
            {"id": e["id"], "success": e["success"], "reward": e["reward"], "failed": criteria, "spoiled": e["spoiled"]})
    tasks = []
    for row in report.get("per_task") or []:
        n, c = int(row.get("samples") or 0), int(row.get("successes") or 0)
        tasks.append({**row, "pass@k": pass_at_k(n, c, k) if n >= k else None,
                      "pass^k": row.get(f"pass^{k}"), "episodes": by_task.get(str(row.get("task")), [])})
    try:
        summary = headline(report)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ViewError(f"{report.get('output', 'eval.json')}: not an eval report as `trajforge eval` writes it "
                        f"(missing {exc})") from None
    return {"kind": "eval", "source": source, "k": k, "summary": summary, "model": report.get("model"),
            "pass": report.get("pass") or {}, "failures": report.get("failures") or {},
            "groups": report.get("groups") or [], "tasks": tasks,
            "episodes_listed": min(len(episodes), MAX_EPISODES), "episodes_cut": len(episodes) > MAX_EPISODES}


# ---- an improve run ------------------------------------------------------------------------------


def rebase(named: str | None, old_root: str | None, root: Path) -> Path | None:
    """Where a path a report names is now: as written, or under `root` when the output moved from `old_root`."""
    if not named:
        return None
    path = Path(named)
    if not path.is_absolute():
        path = root / path
    if path.exists() or not old_root:
        return path
    try:
        return root / Path(named).relative_to(old_root)
    except ValueError:
        return path


def improve_view(path: Path, report: dict[str, Any], where: dict[Path, dict[str, int]]) -> dict[str, Any]:
    """The improve page: the report as written, plus `links`: for each eval directory it names, the
    eval report and the source the page shows it as (`where`: resolved path -> {"report", "source"})."""
    if not isinstance(report.get("comparison"), dict) or not isinstance(report.get("before"), dict):
        raise ViewError(f"{path / IMPROVE_REPORT}: not an improve report (no before / comparison)")
    named = [report["before"].get("output"), (report.get("after") or {}).get("output"), report.get("baseline_eval")]
    named += [r.get("eval") for r in report.get("rounds") or [] if isinstance(r, dict)]
    links: dict[str, dict[str, int]] = {}
    for name in filter(None, named):
        found = rebase(name, report.get("output"), path)
        if found is not None and found.resolve() in where:
            links[name] = where[found.resolve()]
    return {"kind": "improve", "report": report, "links": links}


def locations(reports: list[Report], sources: list[Source]) -> dict[Path, dict[str, int]]:
    """resolved path -> {"report": index, "source": index} of every eval output and dataset shown."""
    where: dict[Path, dict[str, int]] = {}
    for i, s in enumerate(sources):
        where.setdefault(s.path.resolve(), {})["source"] = i
    for r, rep in enumerate(reports):
        if rep.kind == "eval":
            where.setdefault(rep.path.resolve(), {})["report"] = r
    return where
