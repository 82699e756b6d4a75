"""Agent-R's iterative self-training as a Prefect flow: round k searches and splices with the model of round k.

Agent-R improves a model in rounds: the current model searches tasks with MCTS, its bad and good
paths are spliced into revision trajectories, the model is fine-tuned on them, and the tuned
model searches again. Here each round is the pipeline flow (`flows.pipeline.pipeline_flow`, as a
subflow: generate with mcts_splice, then whatever filter / export stages the config names) into
`<output>/round-k/`, with the round's model; between rounds, the user's hook trains on the round's
data and serves the next model (`flows.agent_r_config`). A re-run resumes: finished stages are
skipped by the pipeline flow, and a hook that already reported its model (`round-k/next_model.json`,
for the same command) is not run again. A hook is one process group: on timeout or abort it is
killed with its children.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from backends.config import LLMConfig
from flows import console as term
from flows.agent_r_config import NEXT_MODEL_FILE, AgentRConfig, HookConfig, load_agent_r_config, next_model
from flows.hooks import HookError, run_hook
from flows.pipeline import pipeline_flow

SUMMARY_FILE = "agent_r.json"


def _describe(model: LLMConfig) -> str:
    return f"{model.backend}:{model.model}" + (f" @ {model.base_url}" if model.base_url else "")


def _outputs(result: dict[str, Any], stage: str) -> list[str]:
    return [s["output"] for s in result["stages"] if s["stage"] == stage]


@task(name="agent-r-hook", cache_policy=NO_CACHE, persist_result=False)
def hook_task(hook: HookConfig, k: int, round_dir: str, model: LLMConfig, data: list[str], exports: list[str],
              all_data: list[str]) -> dict[str, Any]:
    """Run the hook after round k; the model it reports for round k+1 (as LLM config fields)."""
    out = Path(round_dir)
    model_file = out / NEXT_MODEL_FILE
    pending = out / f".{NEXT_MODEL_FILE}.hook"  # where the hook writes; renamed once read and checked
    pending.unlink(missing_ok=True)
    values = {"round": str(k), "round_dir": round_dir, "data": os.pathsep.join(data),
              "exports": os.pathsep.join(exports), "next_model_file": str(pending)}
    argv = [arg.format(**values) for arg in shlex.split(hook.command)]
    env = {**os.environ, "TRAJFORGE_ROUND": str(k), "TRAJFORGE_ROUND_DIR": round_dir,
           "TRAJFORGE_DATA": values["data"], "TRAJFORGE_EXPORTS": values["exports"],
           "TRAJFORGE_ALL_DATA": os.pathsep.join(all_data), "TRAJFORGE_NEXT_MODEL_FILE": str(pending),
           "TRAJFORGE_MODEL": model.model_dump_json(exclude_none=True)}
    last = run_hook(argv, env=env, cwd=hook.cwd, log_path=out / "hook.log", timeout_s=hook.timeout_s,
                    what=f"round {k} hook")
    reported = pending.read_text(encoding="utf-8") if pending.is_file() else last
    try:
        nxt = next_model(model, reported)
    except ValueError as exc:
        raise HookError(f"round {k} hook: {exc}; log: {out / 'hook.log'}") from None
    state = {"command": hook.command, "model": nxt.model_dump(mode="json", exclude_none=True)}
    model_file.write_text(json.dumps(state, indent=1))
    pending.unlink(missing_ok=True)
    return state["model"]


def _reported(cfg: AgentRConfig, k: int) -> LLMConfig | None:
    """The model a hook already reported after round k (for the configured command), else None."""
    try:
        state = json.loads((cfg.round_dir(k) / NEXT_MODEL_FILE).read_text())
    except (OSError, ValueError):
        return None
    if cfg.hook is None or state.get("command") != cfg.hook.command:
        return None
    return LLMConfig.model_validate(state["model"])


@flow(name="trajforge-agent-r", log_prints=True)
def agent_r_flow(config_path: str, output: str | None = None) -> dict[str, Any]:
    """Every round of the Agent-R config at `config_path` (`output` replaces its output root)."""
    cfg = load_agent_r_config(config_path, output)
    cfg.root.mkdir(parents=True, exist_ok=True)
    model = cfg.models[0] if cfg.models else cfg.model
    assert model is not None
    rounds: list[dict[str, Any]] = []
    all_data: list[str] = []
    for k in range(1, cfg.rounds + 1):
        term.console.rule(f"[bold]Agent-R round {k}/{cfg.rounds}: {_describe(model)}", align="left")
        round_dir = cfg.round_dir(k)
        round_dir.mkdir(parents=True, exist_ok=True)
        pipeline = cfg.round_pipeline(k, model)
        path = round_dir / "pipeline.yaml"
        path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
        result = pipeline_flow(str(path))
        data, exports = _outputs(result, "generate"), _outputs(result, "export")
        all_data += data
        entry: dict[str, Any] = {"round": k, "model": model.model_dump(mode="json", exclude_none=True),
                                 "output": str(round_dir), "data": data, "exports": exports, "result": result}
        rounds.append(entry)
        if k == cfg.rounds:
            break
        if cfg.models:
            model = cfg.models[k]
            continue
        assert cfg.hook is not None
        done = _reported(cfg, k)
        if done is not None:
            term.console.print(f"  hook: skipped: round {k} already reported {_describe(done)}", highlight=False)
            model = done
        else:
            model = LLMConfig.model_validate(hook_task(cfg.hook, k, str(round_dir), model, data, exports, all_data))
        entry["next_model"] = model.model_dump(mode="json", exclude_none=True)
    summary = {"config": str(Path(config_path).resolve()), "output": str(cfg.root),
               "rounds": [{k: v for k, v in r.items() if k != "result"} for r in rounds]}
    (cfg.root / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str))
    return {**summary, "results": [r["result"] for r in rounds]}
