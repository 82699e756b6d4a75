"""An eval's report, computed from its episodes: overall and per task, as JSON, CSV, markdown and a plot.

    OUT/eval.json        everything below, for programs (`trajforge eval compare` reads it)
    OUT/tasks.csv        one row per task (tasks.json: the same rows as JSON)
    OUT/README.md        the report to read: headline rates, failures, cost, the per-group table
    OUT/plots/pass_by_group.png

Episodes a misbehaving simulated user spoiled (`details.user_fidelity.ok == false`, kept marked or
quarantined by the fidelity check) are unscorable: left out of every rate and counted on their own by
reason (`unscorable_by_user`), as are episodes quarantined because the world or the model server
broke: neither is the agent's failure. pass@1 is over the scored episodes, their count beside it.
Tasks scored without a criterion of their basis (NL assertions and no judge) are counted
(`scored_without`). Failures are counted per criterion: tau2's DB /
ACTION / COMMUNICATE / NL_ASSERTION, a page's own reward (MiniWoB), a site's url / text / js /
answer checks, an LLM judge.
"""

from __future__ import annotations

import csv
import json
import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from backends.config import LLMConfig
from evals.metrics import TaskScore, mean, pass_hat_k, pass_rates
from schemas.models import Trajectory
from schemas.store import Dataset
from schemas.usage import usage_totals

REPORT = "eval.json"
RUNS = "_eval_runs.jsonl"
_SEED_SUFFIX = re.compile(r"/\d+$")


# ---- one episode -------------------------------------------------------------------------------


def spoiled_by_user(trajectory: Trajectory) -> bool:
    """Whether the simulated user broke this episode (its fidelity check failed)."""
    fidelity = trajectory.details.get("user_fidelity")
    return isinstance(fidelity, dict) and fidelity.get("ok") is False


def user_break_reason(fidelity: Any) -> str:
    """The label of the first broken user turn (role_flip, leak, ...) of a fidelity verdict."""
    turns = fidelity.get("turns") if isinstance(fidelity, dict) else None
    broken = [t for t in turns or [] if isinstance(t, dict) and t.get("label") not in (None, "ok")]
    return str(broken[0]["label"]) if broken else "unknown"


def quarantined_user_break(stage: str, error: str, raw: str) -> str | None:
    """The reason a quarantined episode was left out because the simulated user broke it (None: another cause)."""
    if stage != "user" or not error.startswith("user_fidelity: user turn"):
        return None
    try:
        return user_break_reason((json.loads(raw).get("details") or {}).get("user_fidelity"))
    except (ValueError, AttributeError):
        return "unknown"


def unchecked_criteria(trajectory: Trajectory) -> list[str]:
    """The criteria of an episode's basis nothing checked (NL assertions without a judge)."""
    details = (trajectory.details.get("evaluation") or {}).get("details") or {}
    return [str(c) for c in details.get("unchecked") or []]


def failed_criteria(evaluation: dict[str, Any] | None) -> list[str]:
    """The criteria an unsuccessful episode failed, by the evaluation's own details."""
    if not evaluation or evaluation.get("success"):
        return []
    details = evaluation.get("details") or {}
    if "basis" in details:  # tau2 criteria (envs/criteria.py)
        return [str(c) for c in details.get("failed") or []] or ["reward"]
    if "db" in details and "outputs" in details:  # the built-in retail world: its goal state and outputs told
        return (["DB"] if details["db"] is False else []) + (
            ["COMMUNICATE"] if not all((details.get("outputs") or {}).values()) else []) or ["reward"]
    if isinstance(details.get("checks"), list):  # site checks (envs/browser/sites.py)
        return [("judge" if c.get("type") == "judge" else f"page {c.get('type')}")
                for c in details["checks"] if not c.get("passed")] or ["page checks"]
    if details.get("judge") == "llm":
        return ["judge"]
    if "raw_reward" in details:  # MiniWoB's own reward
        return ["page reward"]
    return ["outcome"]


def task_group(task_id: str) -> str:
    """Tasks that differ only by a trailing seed (`miniwob/click-button/3`) form one group."""
    return _SEED_SUFFIX.sub("", task_id)


# ---- tokens and cost ---------------------------------------------------------------------------


def usage_of(trajectories: list[Trajectory], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens, latency and cost of the eval's episodes: the usage their steps recorded (`usage_totals`,
    priced by the config's `llm.price`; local engines cost 0, an unpriced server is unknown), plus
    `server_calls`, every request the backend counted over the invocations (also those of episodes
    that were quarantined, of a persona user or a judge sharing the model)."""
    totals = usage_totals(trajectories)
    totals["server_calls"] = sum(int((run.get("llm") or {}).get("calls", 0)) for run in runs)
    # How the cost is known (priced, local model, unknown), as the backend said in the last invocation.
    totals["cost_basis"] = next((run["llm"]["cost"] for run in reversed(runs) if (run.get("llm") or {}).get("cost")),
                                None)
    return totals


# ---- the report --------------------------------------------------------------------------------


def describe_model(llm: LLMConfig) -> str:
    where = llm.model_path or llm.base_url or ""
    return f"{llm.backend}:{llm.model}" + (f" ({where})" if where else "")


def build_report(out: Path, config: Any, *, split: str, run: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The report of the eval in `out` (every episode it holds); records this invocation in `out/_eval_runs.jsonl`."""
    runs_file = out / RUNS
    with runs_file.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"time": time.time(), "wall_s": round(wall_s, 3), "llm": run.get("llm") or {}}) + "\n")
    runs = [json.loads(line) for line in runs_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    ds = Dataset.open(out)
    scores: dict[str, TaskScore] = {}
    facts: dict[str, dict[str, Any]] = defaultdict(lambda: {"split": None, "steps": [], "wall": [], "failures": Counter(),
                                                            "user_spoiled": 0, "errors": 0})
    failures: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    unusable = action_errors = spoiled = 0
    broke: Counter[str] = Counter()  # why the simulated user broke the episodes it spoiled
    unchecked_tasks: dict[str, set[str]] = defaultdict(set)  # criterion -> tasks scored without it
    steps: list[float] = []
    walls: list[float] = []
    episodes = list(ds.iter_records("trajectories"))
    for t in episodes:
        task = t.provenance.source_id or str(t.details.get("task", {}).get("id", t.id))
        f = facts[task]
        f["split"] = t.provenance.task_split
        if spoiled_by_user(t):
            spoiled += 1
            f["user_spoiled"] += 1
            broke[user_break_reason(t.details.get("user_fidelity"))] += 1
            continue
        for criterion in unchecked_criteria(t):
            unchecked_tasks[criterion].add(task)
        scores.setdefault(task, TaskScore(task)).add(bool(t.success), float(t.reward or 0.0))
        f["steps"].append(int(t.details.get("actions", 0)))
        f["wall"].append(float(t.details.get("wall_s", 0.0)))
        steps.append(f["steps"][-1])
        walls.append(f["wall"][-1])
        stops[str(t.details.get("stop_reason", "unknown"))] += 1
        unusable += int(t.details.get("parse_failures", 0))
        action_errors += len(t.details.get("action_errors") or [])
        for criterion in failed_criteria(t.details.get("evaluation")):
            failures[criterion] += 1
            f["failures"][criterion] += 1
    errors: Counter[str] = Counter()
    spoiled_quarantined = 0
    for q in ds.iter_records("quarantine"):
        try:
            data = json.loads(q.raw)  # an episode's {task, sample}, or a whole trajectory (a broken user's)
            task = str(data.get("task") or (data.get("provenance") or {}).get("source_id")
                       or q.location.removeprefix("task "))
        except (ValueError, AttributeError):
            task = q.location.removeprefix("task ")
        reason = quarantined_user_break(q.stage, q.error, q.raw)
        if reason is not None:  # the simulated user broke it (user.fidelity.on_broken: quarantine)
            spoiled += 1
            spoiled_quarantined += 1
            broke[reason] += 1
            facts[task]["user_spoiled"] += 1
            continue
        errors[q.stage] += 1
        facts[task]["errors"] += 1
    scored = sum(s.samples for s in scores.values())
    rates = pass_rates(list(scores.values()), config.samples)
    rewards = [r for s in scores.values() for r in s.rewards]
    per_task = []
    for task in sorted(facts):
        s, f = scores.get(task, TaskScore(task)), facts[task]
        k = config.samples
        per_task.append({
            "task": task, "group": task_group(task), "split": f["split"], "samples": s.samples,
            "successes": s.successes, "pass@1": s.pass1,
            f"pass^{k}": pass_hat_k(s.samples, s.successes, k) if s.samples >= k else None,
            "reward_mean": mean(s.rewards), "steps_mean": mean(f["steps"]), "wall_s_mean": mean(f["wall"]),
            "failures": dict(sorted(f["failures"].items())), "user_spoiled": f["user_spoiled"], "errors": f["errors"]})
    llm = config.llm
    return {
        "model": describe_model(llm),
        "llm": llm.model_dump(mode="json", exclude_none=True, exclude={"cache_path", "ledger_path"}),
        "env": config.env, "task_source": config.tasks.model_dump(mode="json", exclude_defaults=True),
        "split": split, "samples": config.samples, "max_steps": config.max_steps, "agent_mode": config.agent_mode,
        "config_hash": config.output_hash(), "output": str(out),
        "tasks": len(facts), "episodes": scored + spoiled + sum(errors.values()), "scored": scored,
        "user_spoiled": spoiled, "errors": dict(sorted(errors.items())),
        # Episodes the simulated user made unscorable, by the first broken turn's label, and where they are.
        "unscorable_by_user": {"episodes": spoiled, "by_reason": dict(broke.most_common()),
                               "kept_marked": spoiled - spoiled_quarantined, "quarantined": spoiled_quarantined},
        # Tasks whose scored episodes passed or failed without a criterion of their basis (no judge for NL assertions).
        "scored_without": {c: len(ts) for c, ts in sorted(unchecked_tasks.items())},
        "pass@1": rates["1"]["pass@k"] if rates else None, "pass": rates,
        "reward_mean": mean(rewards),
        "failures": {"by_criterion": dict(failures.most_common()), "stop_reasons": dict(stops.most_common()),
                     "unusable_answers": unusable, "action_errors": action_errors},
        "steps_mean": mean(steps), "usage": usage_of(episodes, runs),
        "wall_s": round(sum(r.get("wall_s", 0.0) for r in runs), 3), "episode_wall_s_mean": mean(walls),
        "groups": group_rows(per_task), "per_task": per_task,
    }


def group_rows(per_task: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pass@1 and reward per task group (a MiniWoB page over its seeds), over the groups' scored episodes."""
    groups: dict[str, dict[str, Any]] = {}
    for row in per_task:
        g = groups.setdefault(row["group"], {"group": row["group"], "tasks": 0, "samples": 0, "successes": 0,
                                             "rewards": []})
        g["tasks"] += 1
        g["samples"] += row["samples"]
        g["successes"] += row["successes"]
        if row["reward_mean"] is not None:
            g["rewards"].append(row["reward_mean"])
    return [{"group": g["group"], "tasks": g["tasks"], "samples": g["samples"], "successes": g["successes"],
             "pass@1": g["successes"] / g["samples"] if g["samples"] else None, "reward_mean": mean(g["rewards"])}
            for g in groups.values()]


# ---- writing -----------------------------------------------------------------------------------


CSV_COLUMNS = ("task", "group", "split", "samples", "successes", "pass@1", "reward_mean", "steps_mean", "wall_s_mean",
               "failures", "user_spoiled", "errors")


def write_report(out: Path, report: dict[str, Any]) -> None:
    from evals.plots import pass_by_group

    (out / REPORT).write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    (out / "tasks.json").write_text(json.dumps(report["per_task"], indent=1, default=str) + "\n", encoding="utf-8")
    with (out / "tasks.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for row in report["per_task"]:
            writer.writerow([_cell(row[c]) if c != "failures" else "; ".join(f"{k}: {v}" for k, v in row[c].items())
                             for c in CSV_COLUMNS])
    plot = pass_by_group(report["groups"], out / "plots" / "pass_by_group.png",
                         f"pass@1 by task ({report['model']}, split {report['split']})")
    (out / "README.md").write_text(markdown(report, plot), encoding="utf-8")


def _cell(value: Any) -> Any:
    return "" if value is None else round(value, 4) if isinstance(value, float) else value


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def num(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.{digits}f}"


def headline(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, value) rows of the report's summary, for the console and the markdown."""
    k = report["samples"]
    rows = [("model", report["model"]), ("environment", f"{report['env']} ({report['task_source'].get('source', 'env')} "
                                                        f"tasks, split {report['split']})"),
            ("tasks x samples", f"{report['tasks']} x {k}"),
            ("episodes scored", f"{report['scored']} of {report['episodes']}"),
            (f"pass@1 (over the {report['scored']} scored)", pct(report["pass@1"]))]
    if k > 1:
        top = report["pass"][str(k)]
        rows += [(f"pass@{k}", pct(top["pass@k"])), (f"pass^{k}", pct(top["pass^k"]))]
    u = report["usage"]
    rows += [("mean reward", num(report["reward_mean"], 3)), ("mean steps", num(report["steps_mean"])),
             ("unscorable: the simulated user broke them (left out)", unscorable_line(report)),
             *[(f"tasks scored without {c} (unchecked: no judge)" if c == "NL_ASSERTION" else
                f"tasks scored without {c} (unchecked)", str(n)) for c, n in report.get("scored_without", {}).items()],
             ("quarantined (world / server errors, left out)",
              ", ".join(f"{s}: {n}" for s, n in report["errors"].items()) or "0"),
             ("unusable answers", str(report["failures"]["unusable_answers"])),
             ("tokens (prompt / completion)", f"{u['prompt_tokens']:,} / {u['completion_tokens']:,}"),
             ("cost", "n/a (no price known)" if u["cost_usd"] is None
              else f"${u['cost_usd']:.4f}" + (f" ({u['cost_basis']})" if u.get("cost_basis") else "")),
             ("wall time", f"{report['wall_s']:.1f} s")]
    return rows


def unscorable_line(report: dict[str, Any]) -> str:
    """How many episodes the simulated user broke, why, and where they are."""
    u = report.get("unscorable_by_user") or {"episodes": report.get("user_spoiled", 0), "by_reason": {}}
    if not u["episodes"]:
        return "0"
    where = [f"{u['kept_marked']} kept, marked (details.user_fidelity)" if u.get("kept_marked") else "",
             f"{u['quarantined']} in quarantine/" if u.get("quarantined") else ""]
    reasons = ", ".join(f"{r}: {n}" for r, n in u["by_reason"].items())
    return f"{u['episodes']} ({reasons}; {'; '.join(w for w in where if w)})"


def markdown(report: dict[str, Any], plot: bool) -> str:
    k = report["samples"]
    lines = [f"# Eval: {report['model']}", "", "| what | value |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in headline(report)]
    if k > 1:
        lines += ["", "| k | pass@k | pass^k | tasks |", "|---|---|---|---|"]
        lines += [f"| {kk} | {pct(v['pass@k'])} | {pct(v['pass^k'])} | {v['tasks']} |" for kk, v in report["pass"].items()]
    fails = report["failures"]
    lines += ["", "## Failures", "", "| criterion | failed episodes |", "|---|---|"]
    lines += [f"| {c} | {n} |" for c, n in fails["by_criterion"].items()] or ["| - | 0 |"]
    lines += ["", "| episode ended by | episodes |", "|---|---|"]
    lines += [f"| {c} | {n} |" for c, n in fails["stop_reasons"].items()]
    lines += ["", "## By task", "", "| task | tasks | episodes | successes | pass@1 | mean reward |", "|---|---|---|---|---|---|"]
    lines += [f"| {g['group']} | {g['tasks']} | {g['samples']} | {g['successes']} | {pct(g['pass@1'])} | "
              f"{num(g['reward_mean'], 3)} |" for g in report["groups"]]
    if plot:
        lines += ["", "![pass@1 by task](plots/pass_by_group.png)"]
    lines += ["", "Per task (each seed): `tasks.csv`, `tasks.json`; the episodes: `trajforge view .`", ""]
    return "\n".join(lines)


def load_report(path: str | Path) -> dict[str, Any]:
    """The report of an eval output directory; ValueError naming the directory when it has none."""
    file = Path(path) / REPORT
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: not an eval output (no {REPORT}); run `trajforge eval` into it first") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{file}: cannot read the report ({exc})") from None
