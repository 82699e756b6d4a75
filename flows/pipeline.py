"""The Prefect pipeline flow: convert + generate -> decontaminate -> filter -> dedup -> mix -> export, from one YAML.

Each stage is a Prefect task (retries, timeout) around a library call; the library does the
work and its own resume (finished units are never redone). The flow adds a stage-level skip:
a stage whose output manifest says complete, with the config hash the flow recorded for the
same stage config, is not run again. State lives in `<output>/_state/<stage>/<name>.json`.
At the end the flow publishes a markdown artifact (counts per stage and per reason, ran/skipped
and why, links to the outputs), link artifacts to the exports, and appends one line to
`<output>/_runs.jsonl`. While it runs it prints one line per stage (and a progress bar for
generation) on the console. Runs into the same output take turns (`<output>/_pipeline.lock`).

Only this package imports Prefect; generators and Beam pipelines run without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.fatal import quiet_fatal_tracebacks, retry_unless_fatal

# The module, not its Console: a served flow is cloudpickled by value, and a Console holds a lock.
from flows import console as term
from flows.pipeline_config import PipelineConfig, load_pipeline_config, stage_key
from flows.progress import RichProgress
from flows.run_summary import endpoint_counts, reasons
from pipelines.decontam_report import merge_reports

RUNS_FILE = "_runs.jsonl"
STATE_DIR = "_state"
LOCK_FILE = "_pipeline.lock"


def _version() -> str:
    from pipelines.convert import trajforge_version

    return trajforge_version()


# ---- stage state -------------------------------------------------------------------------------


def _state_path(cfg: PipelineConfig, stage: str, name: str) -> Path:
    return cfg.root / STATE_DIR / stage / f"{name}.json"


def _read_state(cfg: PipelineConfig, stage: str, name: str) -> dict[str, Any] | None:
    p = _state_path(cfg, stage, name)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _write_state(cfg: PipelineConfig, stage: str, name: str, state: dict[str, Any]) -> None:
    p = _state_path(cfg, stage, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, sort_keys=True, default=str))
    tmp.replace(p)


def _dataset_done(path: Path, expected_hash: str | None) -> bool:
    from schemas.store import Dataset, StoreError

    try:
        ds = Dataset.open(path)
    except StoreError:
        return False
    return bool(ds.complete) and expected_hash is not None and ds.config_hash == expected_hash


def _manifest_hash(path: Path) -> str | None:
    from schemas.store import Dataset

    return Dataset.open(path).config_hash


def _skip(cfg: PipelineConfig, stage: str, name: str, key: str, out: Path, dataset: bool = True) -> dict | None:
    """The recorded result when this stage is already done with this config, else None."""
    state = _read_state(cfg, stage, name)
    if not state or state.get("key") != key:
        return None
    if dataset and not _dataset_done(out, state.get("config_hash")):
        return None
    if not dataset and not (out / "README.md").is_file():
        return None
    return {**state, "reason": "skipped: complete with the same config hash"}


def _finish(cfg: PipelineConfig, stage: str, name: str, key: str, out: Path, counts: dict[str, Any],
            dataset: bool = True) -> dict[str, Any]:
    state = {"stage": stage, "name": name, "key": key, "output": str(out),
             "config_hash": _manifest_hash(out) if dataset else None,
             "counts": {k: v for k, v in sorted(counts.items())}, "finished": _now()}
    _write_state(cfg, stage, name, state)
    return {**state, "reason": "ran"}


def _changed(cfg: PipelineConfig, stage: str, name: str, key: str) -> bool:
    """A derived stage written by the flow with another config: start it afresh."""
    state = _read_state(cfg, stage, name)
    return state is not None and state.get("key") != key


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---- stages ------------------------------------------------------------------------------------


def _task(name: str):
    def deco(fn):
        return task(name=name, cache_policy=NO_CACHE, persist_result=False, retry_delay_seconds=2,
                    retry_condition_fn=retry_unless_fatal)(fn)
    return deco


@_task("convert")
def convert_stage(cfg: PipelineConfig, index: int) -> dict[str, Any]:
    from pipelines.convert import DEFAULT_CHUNK_SIZE, run_convert
    from schemas.models import SCHEMA_VERSION

    entry = cfg.convert[index]
    out = cfg.stage_dir("convert", entry.name)
    inputs = entry.resolved_inputs()
    chunk = entry.chunk_size or DEFAULT_CHUNK_SIZE
    key = stage_key("convert", entry.source, inputs, chunk, _version(), SCHEMA_VERSION)
    if (done := _skip(cfg, "convert", entry.name, key, out)) is not None:
        return done
    summary = run_convert(entry.source, inputs, str(out), chunk_size=chunk)
    counts = {k: summary.counts[k] for k in ("in", "out", "quarantined", "duplicate")}
    counts.update({f"quarantined:{k}": v for k, v in summary.quarantine_reasons.items()})
    return _finish(cfg, "convert", entry.name, key, out, counts)


@_task("generate")
def generate_stage(cfg: PipelineConfig, index: int) -> dict[str, Any]:
    from generators.runner import generate, load_config
    from schemas.store import Dataset

    entry = cfg.generate[index]
    out = cfg.stage_dir("generate", entry.name)
    data = entry.method_config(cfg.llm)
    method_cfg = load_config(data)
    key = stage_key("generate", entry.agent, method_cfg.output_hash(), _version())
    if (done := _skip(cfg, "generate", entry.name, key, out)) is not None:
        return done
    with RichProgress(f"{entry.method} tasks") as progress:
        if entry.agent == "scripted":
            summary = asyncio.run(_generate_scripted(method_cfg, out, progress))
        else:
            summary = asyncio.run(generate(method_cfg, out, progress=progress))
    counts = {k: v for k, v in (Dataset.open(out).manifest().get("counts") or {}).items()}
    counts.setdefault("tasks", summary.tasks)
    counts.update(method=entry.method, env=getattr(method_cfg, "env", None))
    if entry.agent == "llm":
        counts.update({f"llm_{k}": summary.llm.get(k, 0)
                       for k in ("prompt_tokens", "completion_tokens", "truncated", "unusable", "latency_s",
                                 "cost_usd", "cost")})
        counts.update(endpoint_counts(summary.llm))
    return _finish(cfg, "generate", entry.name, key, out, counts)


async def _generate_scripted(config: Any, out: Path, progress: Any) -> Any:
    """`generators.runner.generate` with the scripted retail agent in place of an LLM."""
    from envs.spec import EnvFactory, EnvSpec
    from generators.registry import get_method
    from generators.scripted import ScriptedRetailLLM
    from schemas.store import Dataset

    if not isinstance(config, EnvSpec) or config.env != "retail":
        raise ValueError(f"agent: scripted plays retail methods (env: retail); not {config.method} on "
                         f"{getattr(config, 'env', 'no env')}")
    tasks = EnvFactory(config).tasks()
    ds = Dataset.create(out, stage=f"generate:{config.method}", config_hash=config.output_hash())
    ds.recover()
    method = get_method(config.method)(config, ScriptedRetailLLM(tasks))
    summary = await method.run(method.tasks(), ds, progress=progress)
    ds.mark_complete({**dict(ds.unit_counts()), "tasks_total": summary.tasks, "scripted_calls": summary.llm.get("calls", 0)})
    return summary


@_task("decontaminate")
def decontam_stage(cfg: PipelineConfig, name: str, src: str, upstream: str, references: list[Any]) -> dict[str, Any]:
    from pipelines.decontam import run_decontam
    from pipelines.decontam_report import decontamination_report

    d = cfg.decontaminate
    out = cfg.stage_dir("decontaminate", name)
    digest = stage_key([(r.source, r.id, r.instruction, r.text) for r in references])
    key = stage_key("decontaminate", d.model_dump(exclude={"enabled", "references"}), digest, upstream, _version())
    done = _skip(cfg, "decontaminate", name, key, out)
    if done is None:
        summary = run_decontam(src, str(out), references, ngram=d.ngram, threshold=d.threshold, num_perm=d.num_perm,
                               min_ngrams=d.min_ngrams, overwrite=_changed(cfg, "decontaminate", name, key))
        done = _finish(cfg, "decontaminate", name, key, out, dict(summary.counts))
    return {**done, "report": decontamination_report(out)}


def decontam_references(cfg: PipelineConfig) -> list[Any]:
    """The test data the run checks against: the test splits of its task sources, and the named files."""
    from envs.tasks import TaskSourceConfig
    from filters.decontam import file_references, held_out_references

    d = cfg.decontaminate
    if d.enabled is False:
        return []
    sources = []
    if d.task_sources:
        for entry in cfg.generate:
            data = entry.method_config(cfg.llm)
            if isinstance(data.get("tasks"), dict):
                sources.append((TaskSourceConfig.model_validate(data["tasks"]), str(data.get("env") or "retail")))
    refs = held_out_references(sources)
    for path in d.references:
        refs += file_references(Path(path).resolve())
    if d.enabled is True and not refs:
        raise ValueError("decontaminate: enabled, but no task source of the run has a test split and no references "
                         "file is named")
    return refs


@_task("filter")
def filter_stage(cfg: PipelineConfig, name: str, src: str, upstream: str) -> dict[str, Any]:
    from pipelines.filter import run_filter

    assert cfg.filter is not None
    out = cfg.stage_dir("filter", name)
    key = stage_key("filter", cfg.filter.chain, upstream, _version())
    if (done := _skip(cfg, "filter", name, key, out)) is not None:
        return done
    summary = run_filter(src, list(cfg.filter.chain), str(out), overwrite=_changed(cfg, "filter", name, key))
    return _finish(cfg, "filter", name, key, out, dict(summary.counts))


@_task("dedup")
def dedup_stage(cfg: PipelineConfig, name: str, src: str, upstream: str) -> dict[str, Any]:
    from pipelines.dedup import run_dedup

    assert cfg.dedup is not None
    out = cfg.stage_dir("dedup", name)
    d = cfg.dedup
    key = stage_key("dedup", d.model_dump(), upstream, _version())
    if (done := _skip(cfg, "dedup", name, key, out)) is not None:
        return done
    summary = run_dedup(src, str(out), threshold=d.threshold, num_perm=d.num_perm, exact_only=d.exact_only,
                        prefer_reward=d.prefer_reward, overwrite=_changed(cfg, "dedup", name, key))
    return _finish(cfg, "dedup", name, key, out, dict(summary.counts))


@_task("mix")
def mix_stage(cfg: PipelineConfig, sources: dict[str, str], upstream: list[str]) -> dict[str, Any]:
    from pipelines.mix import run_mix

    assert cfg.mix is not None
    m = cfg.mix
    out = cfg.stage_dir("mix", m.name)
    key = stage_key("mix", m.model_dump(), upstream, _version())
    if (done := _skip(cfg, "mix", m.name, key, out)) is not None:
        return done
    summary = run_mix(list(sources.values()), str(out), weights=m.weights, temperature=m.temperature, seed=m.seed,
                      total=m.total, overwrite=_changed(cfg, "mix", m.name, key))
    counts = {"written": summary.written, **{f"source:{s.name}": s.written for s in summary.sources}}
    return _finish(cfg, "mix", m.name, key, out, counts)


@_task("export")
def export_stage(cfg: PipelineConfig, name: str, src: str, fmt: str, upstream: str,
                 decontamination: dict[str, Any] | None = None) -> dict[str, Any]:
    from converters.export import ExportConfig, export
    from converters.export.run import NothingToExport

    label = f"{name}-{fmt}"
    out = cfg.stage_dir("export", label)
    key = stage_key("export", fmt, upstream, _version())
    if (done := _skip(cfg, "export", label, key, out, dataset=False)) is not None:
        return done
    try:
        report = export(src, out, ExportConfig(format=fmt, overwrite=True, decontamination=decontamination))
    except NothingToExport as exc:
        # No row is no dataset (`datasets` cannot load it): the run writes none, says why and goes on.
        report = exc.report
        counts = {"in": report.records_in, "exported": 0, "rows": 0,
                  **{f"skipped:{k}": v for k, v in report.skipped.items()}}
        return {"stage": "export", "name": label, "key": key, "output": str(out), "config_hash": None,
                "counts": counts, "finished": _now(), "reason": f"skipped: {exc}"}
    counts = {"in": report.records_in, "exported": report.records_exported, "rows": report.rows,
              **{f"skipped:{k}": v for k, v in report.skipped.items()}}
    return _finish(cfg, "export", label, key, out, counts, dataset=False)


def _configured(fn, retries: int, timeout: float):
    return fn.with_options(retries=retries, timeout_seconds=timeout)


# ---- flow --------------------------------------------------------------------------------------


@flow(name="trajforge-pipeline", log_prints=True)
def pipeline_flow(config_path: str, output: str | None = None) -> dict[str, Any]:
    """Run every stage of the pipeline config at `config_path` (`output` replaces its output root)."""
    quiet_fatal_tracebacks()
    cfg = load_pipeline_config(config_path, output)
    cfg.root.mkdir(parents=True, exist_ok=True)
    with output_lock(cfg.root):
        return _run_stages(cfg, config_path)


@contextlib.contextmanager
def output_lock(root: Path) -> Iterator[None]:
    """Hold `<root>/_pipeline.lock` while the stages run: a second run into the same output (an
    overlapping schedule, two workers, a manual run) waits for the first, then finds its stages
    done, instead of writing the same units twice. The OS releases the lock of a killed run."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 500, 0).decode("utf-8", "replace").strip() or "another run"
            get_run_logger().info("waiting for %s to finish with %s", holder, root)
            term.console.print(f"waiting for {holder} to finish with {root}", highlight=False)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pipeline run {_flow_run_id()} (pid {os.getpid()} on {socket.gethostname()})".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _run_stages(cfg: PipelineConfig, config_path: str) -> dict[str, Any]:
    logger = get_run_logger()
    started = time.time()
    r, t = cfg.retries, cfg.timeouts
    results: list[dict[str, Any]] = []
    references = decontam_references(cfg)
    step = _Steps(_stage_count(cfg, bool(references)))

    def run(stage_task, timeout: float, label: str, *args: Any) -> dict[str, Any]:
        step.announce(label)
        res = _configured(stage_task, r, timeout)(cfg, *args)
        term.console.print(f"  {res['reason']}: " + ", ".join(f"{k}={v}" for k, v in res["counts"].items()), highlight=False)
        results.append(res)
        return res

    current: dict[str, tuple[str, str]] = {}  # dataset name -> (path, stage key), latest stage
    for i, entry in enumerate(cfg.convert):
        res = run(convert_stage, t.convert, f"convert {entry.name} ({entry.source})", i)
        current[entry.name] = (res["output"], res["key"])
    for i, entry in enumerate(cfg.generate):
        res = run(generate_stage, t.generate, f"generate {entry.name} ({entry.method}, {_agent_label(cfg, i)})", i)
        current[entry.name] = (res["output"], res["key"])
    reports: dict[str, dict[str, Any]] = {}  # dataset name -> what decontamination dropped
    if references:  # first, so no later stage (nor a DPO export of the pairs) sees contaminated records
        for name, (src, up) in list(current.items()):
            res = run(decontam_stage, t.decontaminate, f"decontaminate {name}", name, src, up, references)
            current[name] = (res["output"], res["key"])
            if res.get("report"):
                reports[name] = res["report"]
    origin = dict(current)  # as converted / generated (and decontaminated): the only stage that holds pairs
    if cfg.filter is not None:
        for name, (src, up) in list(current.items()):
            res = run(filter_stage, t.filter, f"filter {name}", name, src, up)
            current[name] = (res["output"], res["key"])
    if cfg.dedup is not None:
        for name, (src, up) in list(current.items()):
            res = run(dedup_stage, t.dedup, f"dedup {name}", name, src, up)
            current[name] = (res["output"], res["key"])
    if cfg.mix is not None:
        res = run(mix_stage, t.mix, f"mix {', '.join(current)} -> {cfg.mix.name}",
                  {n: p for n, (p, _) in current.items()}, [k for _, k in current.values()])
        current = {cfg.mix.name: (res["output"], res["key"])}
    for ex in cfg.exports():
        targets = {ex.dataset: origin[ex.dataset]} if ex.dataset is not None else current
        for name, (src, up) in targets.items():
            upstream = [reports[n] for n in ([name] if name in origin else sorted(origin)) if n in reports]
            run(export_stage, t.export, f"export {name} as {ex.format}", name, src, ex.format, up,
                merge_reports(upstream) if upstream else None)

    seconds = round(time.time() - started, 3)
    _publish(cfg, results)
    line = {"time": _now(), "config": str(Path(config_path).resolve()), "output": str(cfg.root), "seconds": seconds,
            "flow_run_id": _flow_run_id(),
            "stages": [{k: res[k] for k in ("stage", "name", "reason", "counts", "output")} for res in results]}
    with open(cfg.root / RUNS_FILE, "a") as fh:
        fh.write(json.dumps(line, default=str) + "\n")
    for res in results:
        logger.info("%s/%s: %s %s", res["stage"], res["name"], res["reason"], res["counts"])
    return {"output": str(cfg.root), "seconds": seconds, "stages": results}


class _Steps:
    """Numbered stage lines on the console: what the flow is doing now."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def announce(self, label: str) -> None:
        self.done += 1
        term.console.rule(f"[bold]{self.done}/{self.total} {label}", align="left")


def _stage_count(cfg: PipelineConfig, decontaminate: bool) -> int:
    datasets = len(cfg.convert) + len(cfg.generate)
    per_dataset = datasets * ((cfg.filter is not None) + (cfg.dedup is not None) + decontaminate)
    exported = 1 if cfg.mix is not None else datasets
    exports = sum(1 if e.dataset is not None else exported for e in cfg.exports())
    return datasets + per_dataset + (cfg.mix is not None) + exports


def _agent_label(cfg: PipelineConfig, index: int) -> str:
    entry = cfg.generate[index]
    if entry.agent == "scripted":
        return "scripted retail agent"
    llm = entry.method_config(cfg.llm).get("llm") or {}
    return f"{llm.get('backend', 'llm')}:{llm.get('model', 'default')}"


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def _artifact_key(*parts: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100]


def _publish(cfg: PipelineConfig, results: list[dict[str, Any]]) -> None:
    rows = ["| stage | name | reason | counts |", "|---|---|---|---|"]
    for res in results:
        counts = ", ".join(f"{k}={v}" for k, v in res["counts"].items())
        rows.append(f"| {res['stage']} | {res['name']} | {res['reason']} | {counts} |")
    rows += ["", "**Counts by reason**", "", "| stage | name | count | records |", "|---|---|---|---|"]
    for res in results:
        rows += [f"| {res['stage']} | {res['name']} | {k} | {v} |" for k, v in reasons(res["counts"]).items()]
    rows += ["", "**Outputs**", ""]
    rows += [f"- {res['stage']}/{res['name']}: [{res['output']}]({Path(res['output']).as_uri()})" for res in results]
    rows += [f"- run log: [{cfg.root / RUNS_FILE}]({(cfg.root / RUNS_FILE).as_uri()})"]
    create_markdown_artifact(key="trajforge-pipeline-summary", markdown="\n".join(rows),
                             description=f"trajforge pipeline counts per stage ({cfg.root})")
    for res in results:
        if res["stage"] == "export" and (Path(res["output"]) / "README.md").is_file():  # not an empty one
            create_link_artifact(key=_artifact_key("trajforge-export", res["name"]),
                                 link=Path(res["output"]).as_uri(), link_text=res["output"],
                                 description=f"export {res['name']}")
