"""`trajforge improve`: measure a model, make training data, train, measure again, as one Prefect flow.

Stages, each a Prefect task that is skipped when it finished before with the same inputs
(`<output>/_state/<stage>.json`; the library calls resume what was half done):

1. base      a GGUF base is unpacked once into a Hugging Face directory (`base/`): the evals and
             training load it in a second instead of converting the GGUF each time;
2. baseline  `trajforge eval` of the model on the test split (`eval-baseline/`);
3. data      the pipeline flow as a subflow (`data/`): generate on the train split with any method
             (`demonstrations` records the environment's reference solutions), then filter, dedup
             and export as configured;
4. train     `trajforge train` on the export with the card's settings (`model/`), or the user's
             command (`train: {command: ...}`);
5. trained   the same eval of the trained model on the same test tasks (`eval-trained/`);
6. report    `report.md` / `report.json`: before and after, per task, the paired bootstrap interval
             of the difference, a plot, and the lineage of every artefact.

With `rounds: N` (and an optional warm start, round 0) stages 3-5 repeat per round into `round-k/`:
round k generates with round k-1's model, keeps what the world verified, and trains from the last
model (or from the base on every round's data); the report gives each round's pass@1 with paired
intervals against the baseline and the previous round (`flows/improve_rounds.py`).

Before anything runs, `flows/improve_checks.py` checks the output, the base, that the generation tasks
and the test tasks share no task, and that no reference solution is used on a measured task group.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from backends.config import LLMConfig
from flows.fatal import quiet_fatal_tracebacks, retry_unless_fatal
from flows import console as term
from flows.hooks import HookError, run_hook
from flows.improve_checks import STATE_DIR, ImproveError, TaskPlan, check_base, preflight
from flows.improve_config import HookTrain, ImproveConfig, load_improve_config
from flows.improve_rounds import Round, merge_exports, round_figures, write_rounds
from flows.pipeline import output_lock, pipeline_flow
from flows.pipeline_config import stage_key
from flows.progress import RichProgress

REPORT = "report.json"
__all__ = ["ImproveError", "improve_flow"]


# ---- stage state -------------------------------------------------------------------------------


def _state_file(cfg: ImproveConfig, stage: str) -> Path:
    return cfg.root / STATE_DIR / f"{stage}.json"


def _done(cfg: ImproveConfig, stage: str, key: str) -> dict[str, Any] | None:
    try:
        state = json.loads(_state_file(cfg, stage).read_text())
    except (OSError, ValueError):
        return None
    return state if state.get("key") == key and Path(state.get("output", "")).exists() else None


def _record(cfg: ImproveConfig, stage: str, key: str, output: Path, **facts: Any) -> dict[str, Any]:
    state = {"stage": stage, "key": key, "output": str(output), **facts}
    path = _state_file(cfg, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(path)
    return state


def _skipped(state: dict[str, Any]) -> dict[str, Any]:
    term.console.print("  skipped: done before with the same inputs", highlight=False)
    return state


# ---- stages ------------------------------------------------------------------------------------


def _task(name: str):
    # log_prints off: libraries print on purpose into captured stdout (dill disassembles the functions datasets
    # hashes), which Prefect would log line by line.
    def deco(fn):
        return task(name=name, cache_policy=NO_CACHE, persist_result=False, log_prints=False,
                    retry_condition_fn=retry_unless_fatal)(fn)
    return deco


@_task("improve-base")
def base_stage(cfg: ImproveConfig) -> dict[str, Any]:
    """The base as a Hugging Face directory (a GGUF file is unpacked into `base/`)."""
    from training.trainer import file_digest

    source = check_base(cfg)
    digest = file_digest(source)
    if source.is_dir():
        return {"stage": "base", "key": digest, "output": str(source), "source": str(source), "sha256": digest}
    key = stage_key("base", digest)
    if (done := _done(cfg, "base", key)) is not None:
        return _skipped(done)
    from backends.transformers_backend import load_model

    out = cfg.root / "base"
    model, tokenizer = load_model(str(source), device="cpu", train=True)
    tmp = cfg.root / ".base.tmp"
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.replace(out)
    return _record(cfg, "base", key, out, source=str(source), sha256=digest)


@_task("improve-eval")
def eval_stage(cfg: ImproveConfig, name: str, llm: dict[str, Any], model_key: str) -> dict[str, Any]:
    """`name` is the output folder; `model_key` says which weights are served (a retrained model is evaluated again)."""
    from evals.report import load_report
    from evals.run import run_eval

    out = cfg.root / name
    ecfg = cfg.eval_config(LLMConfig.model_validate(llm))
    key = stage_key("eval", ecfg.output_hash(), cfg.eval.model_dump(), model_key)
    if (done := _done(cfg, name, key)) is not None and (out / "eval.json").is_file():
        return _skipped({**done, "report": load_report(out)})
    with RichProgress(f"{name} episodes") as progress:
        report = asyncio.run(run_eval(ecfg, out, split=cfg.eval.split, max_tasks=cfg.eval.tasks, progress=progress))
    term.console.print(f"  pass@1 {_pct(report['pass@1'])} over {report['scored']} episodes ({report['tasks']} tasks, "
                       f"split {report['split']}), {report['wall_s']:.0f} s", highlight=False)
    state = _record(cfg, name, key, out, model=report["model"], split=report["split"], pass1=report["pass@1"])
    return {**state, "report": report}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def data_stage(cfg: ImproveConfig, rnd: Round, llm: LLMConfig) -> dict[str, Any]:
    """Generate (with `llm` acting), keep what the world verified, filter, dedup, decontaminate, export: the
    pipeline flow as a subflow into the round's `data/` (it skips the stages it finished before)."""
    chain = ([{"name": "verified"}] if cfg.keeps == "verified" else []) + (cfg.filter.chain if cfg.filter else [])
    pipeline: dict[str, Any] = {"output": str(rnd.data), "generate": cfg.generate_entries(rnd.k, llm),
                                "export": [cfg.export.format]}
    if chain:
        pipeline["filter"] = {"chain": chain}
    if cfg.dedup is not None:
        pipeline["dedup"] = cfg.dedup.model_dump(mode="json")
    rnd.data.mkdir(parents=True, exist_ok=True)
    path = rnd.data / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    result = pipeline_flow(str(path))
    exports = [s for s in result["stages"] if s["stage"] == "export"]
    return {"stage": "data", "output": str(rnd.data), "exports": [e["output"] for e in exports],
            "export": exports[-1]["output"], "export_key": stage_key(*(e["key"] for e in exports)),
            "stages": result["stages"], "entries": pipeline["generate"]}


@_task("improve-train")
def train_stage(cfg: ImproveConfig, rnd: Round, export: str, export_key: str, base: str) -> dict[str, Any]:
    out = rnd.model
    if isinstance(cfg.train, HookTrain):
        return _hook_train(cfg, rnd, cfg.train, export, export_key, base, out)
    from training.trainer import train

    settings = cfg.train
    if settings.chat_template is None and cfg.llm.chat_template is not None:
        settings = settings.model_copy(update={"chat_template": cfg.llm.chat_template})  # what the evals render
    card = train(export, base, out, settings, log=lambda m: term.console.print(f"  {m}", highlight=False))
    term.console.print(f"  trained {card['steps']} steps on {card['rows']} rows, loss {card['train_loss']:.4f}, "
                       f"{card['seconds']:.0f} s", highlight=False)
    model = {"backend": "transformers", "model_path": str(out)}
    return {"stage": "train", "key": card["key"], "output": str(out), "card": card, "model": model}


def _hook_train(cfg: ImproveConfig, rnd: Round, hook: HookTrain, export: str, export_key: str, base: str,
                out: Path) -> dict[str, Any]:
    from flows.agent_r_config import next_model

    key = stage_key("train-hook", hook.command, export_key, base)
    if (done := _done(cfg, rnd.state("train"), key)) is not None:
        return _skipped(done)
    out.mkdir(parents=True, exist_ok=True)
    pending = rnd.dir / ".next_model.json"
    pending.unlink(missing_ok=True)
    log = rnd.dir / "train-hook.log"
    values = {"export": export, "base": base, "output": str(out), "round_dir": str(rnd.dir),
              "next_model_file": str(pending), "round": str(rnd.k)}
    argv = [arg.format(**values) for arg in shlex.split(hook.command)]
    env = {**os.environ, "TRAJFORGE_EXPORT": export, "TRAJFORGE_BASE": base, "TRAJFORGE_OUTPUT": str(out),
           "TRAJFORGE_NEXT_MODEL_FILE": str(pending), "TRAJFORGE_ROUND": str(rnd.k)}
    last = run_hook(argv, env=env, cwd=hook.cwd, log_path=log, timeout_s=hook.timeout_s, what="train hook")
    # What the hook reports, in order: a model in $TRAJFORGE_NEXT_MODEL_FILE (JSON fields or a URL: a server it
    # started), a checkpoint in {output} (served in process), the last line it printed.
    if pending.is_file() or not (out / "config.json").is_file():
        reported = pending.read_text(encoding="utf-8") if pending.is_file() else last
        try:
            model: dict[str, Any] = next_model(cfg.llm, reported).model_dump(mode="json", exclude_none=True)
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise HookError(f"train hook: wrote no model to {out} and reported none ({first}); log: {log}") from None
    else:
        model = {"backend": "transformers", "model_path": str(out)}
    pending.unlink(missing_ok=True)
    return _record(cfg, rnd.state("train"), key, out, command=hook.command, model=model)


def trained_llm(cfg: ImproveConfig, model: dict[str, Any]) -> dict[str, Any]:
    """The trained model with the baseline's generation settings (tokens, temperature, stop)."""
    keep = {k: v for k, v in cfg.llm.model_dump(mode="json", exclude_none=True).items()
            if k in ("max_tokens", "temperature", "top_p", "seed", "stop", "n_threads", "device", "request_timeout_s",
                     "max_retries", "max_concurrency")}
    return {**keep, **model}


# ---- flow --------------------------------------------------------------------------------------


@flow(name="trajforge-improve", log_prints=True)
def improve_flow(config_path: str, output: str | None = None) -> dict[str, Any]:
    """The whole loop of the improve config at `config_path` (`output` replaces its output root)."""
    quiet_fatal_tracebacks()
    cfg = load_improve_config(config_path, output)
    plan = preflight(cfg)
    (cfg.root / STATE_DIR).mkdir(parents=True, exist_ok=True)  # marks the output as improve's own
    with output_lock(cfg.root):
        return _run(cfg, config_path, plan)


class _Steps:
    def __init__(self, cfg: ImproveConfig) -> None:
        self.n, self.total = 0, 3 + 3 * (cfg.rounds - cfg.first_round() + 1)

    def __call__(self, label: str) -> None:
        self.n += 1
        term.console.rule(f"[bold]improve {self.n}/{self.total} {label}", align="left")


def _timed(timings: dict[str, float], name: str, fn: Any, *args: Any) -> Any:
    t = time.time()
    result = fn(*args)
    timings[name] = round(time.time() - t, 1)
    return result


def _run(cfg: ImproveConfig, config_path: str, plan: TaskPlan) -> dict[str, Any]:
    started = time.time()
    timings: dict[str, float] = {}
    step = _Steps(cfg)
    term.console.print(f"improve {describe(cfg.llm)}: {plan.test} test task(s), {plan.train} generation task(s), "
                       f"{cfg.rounds} round(s) -> {cfg.root}", highlight=False)
    if plan.split == "none":
        term.console.print("[bold yellow]warning:[/] the task source has no splits; the evals run every task",
                           highlight=False)
    step("base model")
    base = _timed(timings, "base", base_stage, cfg)
    llm = cfg.llm.model_dump(mode="json", exclude_none=True)
    if cfg.llm.backend == "transformers":
        llm["model_path"] = base["output"]  # the unpacked base: same weights, loaded in a second
    step("baseline eval (test split)")
    before = _timed(timings, "baseline", eval_stage, cfg, "eval-baseline", llm, base["key"])
    current = {"llm": llm, "key": base["key"], "path": base["output"]}
    rounds: list[dict[str, Any]] = []
    exports: list[str] = []
    for k in range(cfg.first_round(), cfg.rounds + 1):
        rnd = Round.of(cfg, k)
        times: dict[str, float] = {}
        what = ", ".join(e["method"] for e in cfg.round_generate(k))
        step(f"{rnd.label}training data ({what} on the train split, keep {cfg.keeps}, export {cfg.export.format})")
        data = _timed(times, "data", data_stage, cfg, rnd, LLMConfig.model_validate(current["llm"]))
        exports += data["exports"]
        start_from = base["output"] if cfg.train_from == "base" or k == cfg.first_round() else current["path"]
        export = merge_exports(exports if cfg.train_from == "base" else data["exports"], rnd.dir / "export")
        export_key = _sha256(export / "card.json") if export is not None else None
        source = ("the base on every round's data so far" if cfg.train_from == "base" and k > cfg.first_round()
                  else "the base" if start_from == base["output"] else f"round {k - 1}'s model")
        step(f"{rnd.label}train ({source})")
        if export is None:
            term.console.print("  skipped: no row to train on; the model stays as it was", highlight=False)
            trained = {"stage": "train", "key": current["key"], "output": current["path"], "model": None}
        else:
            trained = _timed(times, "train", train_stage, cfg, rnd, str(export), export_key, start_from)
            current = {"llm": trained_llm(cfg, trained["model"]), "key": trained["key"],
                       "path": trained["model"].get("model_path") or start_from}
        step(f"{rnd.label}eval of the trained model (same test tasks)")
        after = _timed(times, "eval", eval_stage, cfg, rnd.eval_name, current["llm"], current["key"])
        # The single-round layout keeps its stage names (`trained`: the eval of the trained model).
        timings.update({rnd.prefix + ("trained" if name == "eval" and not rnd.prefix else name): v
                        for name, v in times.items()})
        rounds.append({"round": rnd, "data": data, "trained": trained, "after": after, "export": export,
                       "stage_seconds": times, "trains_from": cfg.train_from})
    step("report")
    return write_report(cfg, config_path, plan, base, before, rounds, timings, time.time() - started)


def describe(llm: LLMConfig) -> str:
    return f"{llm.backend}:{llm.model}" + (f" ({llm.model_path})" if llm.model_path else "")


def write_report(cfg: ImproveConfig, config_path: str, plan: TaskPlan, base: dict[str, Any], before: dict[str, Any],
                 rounds: list[dict[str, Any]], timings: dict[str, float], seconds: float) -> dict[str, Any]:
    from evals.compare import compare, markdown, summary_rows
    from evals.plots import before_after

    last = rounds[-1]
    data, trained, after = last["data"], last["trained"], last["after"]
    result = compare(before["report"], after["report"], seed=cfg.seed)
    plot = before_after(result["groups"], cfg.root / "plots" / "before_after.png",
                        "pass@1 before and after training", ("before", "after"))
    export = Path(last["export"] or data["export"])
    export_card = _read_json(export / "card.json")
    lineage = {
        "config": str(Path(config_path).resolve()),
        "base": {k: base.get(k) for k in ("source", "sha256", "output")},
        "baseline_eval": _eval_lineage(before["report"]),
        "data": [{"stage": s["stage"], "name": s["name"], "output": s["output"], "counts": s["counts"],
                  "reason": s["reason"]} for s in data["stages"]],
        "export": {"output": str(export), "format": export_card.get("format"), "counts": export_card.get("counts"),
                   "card_sha256": _sha256(export / "card.json")},
        "model": {"output": trained["output"], "model": trained["model"],
                  **({k: trained["card"][k] for k in ("objective", "steps", "rows", "train_loss", "learning_rate",
                                                      "settings", "base", "export", "seconds")}
                     if "card" in trained else {"command": trained.get("command")})},
        "trained_eval": _eval_lineage(after["report"]),
        "rounds": [{"round": r["round"].k, "export": str(r["export"]) if r["export"] else None,
                    "model": r["trained"]["output"], "eval": _eval_lineage(r["after"]["report"]),
                    "data": [{k: s[k] for k in ("stage", "name", "output", "counts")} for s in r["data"]["stages"]]}
                   for r in rounds],
    }
    figures = round_figures(cfg, before["report"], rounds)
    out = {"output": str(cfg.root), "seconds": round(seconds, 1), "stage_seconds": timings,
           "before": _headline(before["report"]), "after": _headline(after["report"]), "comparison": result,
           "lineage": lineage, "baseline_eval": before["report"]["output"], "train_from": cfg.train_from,
           "keep": cfg.keeps, "warm_start": plan.warm_start(), "rounds": figures}
    (cfg.root / REPORT).write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
    md = markdown(result, "plots/before_after.png" if plot else None,
                  title="Improve: before and after training" + (f" ({len(rounds)} rounds)" if cfg.in_rounds else ""))
    md += "\n## Before and after\n\n| | before | after |\n|---|---|---|\n"
    for key in ("pass@1", "reward_mean", "steps_mean", "unusable_answers", "episodes", "wall_s"):
        md += f"| {key} | {_fmt(out['before'][key])} | {_fmt(out['after'][key])} |\n"
    md += write_rounds(cfg, out)
    md += "\n## Lineage\n\n```json\n" + json.dumps(lineage, indent=1, default=str) + "\n```\n"
    (cfg.root / "report.md").write_text(md, encoding="utf-8")
    create_markdown_artifact(key="trajforge-improve-report", markdown=md.split("\n## Lineage")[0],
                             description=f"trajforge improve: before and after training ({cfg.root})")
    for what, value in summary_rows(result):
        term.console.print(f"  {what}: {value}", highlight=False)
    term.console.print(f"report: {cfg.root / 'report.md'}", highlight=False)
    return out


def _headline(report: dict[str, Any]) -> dict[str, Any]:
    return {"model": report["model"], "pass@1": report["pass@1"], "reward_mean": report["reward_mean"],
            "steps_mean": report["steps_mean"], "unusable_answers": report["failures"]["unusable_answers"],
            "failures": report["failures"]["by_criterion"], "episodes": report["scored"], "wall_s": report["wall_s"],
            "usage": report["usage"], "split": report["split"], "output": report["output"]}


def _eval_lineage(report: dict[str, Any]) -> dict[str, Any]:
    return {k: report[k] for k in ("output", "model", "config_hash", "split", "tasks", "samples", "scored")}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "n/a" if value is None else str(value)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
