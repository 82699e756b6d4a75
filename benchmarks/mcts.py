"""MCTS speed: environment steps/s and tree nodes/s with a zero-latency scripted model
(`generators.scripted`), and the search's overhead over waiting for the model at latency L.

"Sum of its model-call latencies" is the latency-bound critical path: the model calls the search
must wait for one after another (per iteration one expansion call plus the longest of the
concurrent rollouts: `SearchStats.critical_calls`) times L. Target: wall / critical path < 1.10 at
L = 0.2 s (the latency of the LLM throughput benchmark); L = 0.05 s is measured and printed too.
The fully sequential sum (every call one after another) is printed for each L, to show what
parallel expansion saves. Each measured run starts with cold retail caches (memoised calls, table
digests). Run: `python -m benchmarks.mcts [--latency 0.05 --latency 0.2] [--tasks 4]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchmarks._common import row, write_results
from envs.retail.env import RetailEnv
from envs.retail.memo import clear_caches
from envs.retail.tasks import generate_tasks
from generators.agent import AgentPolicy
from generators.mcts import MCTS, SearchConfig, SearchStats
from generators.scripted import ScriptedRetailLLM

TARGET = 1.10  # on wall / critical path, not on wall / all calls in sequence
# The target is judged at the latency the LLM throughput benchmark uses; 0.05 s is shown as well.
TARGET_LATENCY = 0.2
DEFAULT_LATENCIES = [0.05, 0.2]


async def _search_all(tasks: list[Any], latency: float, config: SearchConfig) -> tuple[float, list[SearchStats], int]:
    llm = ScriptedRetailLLM(tasks, latency=latency)
    tools = RetailEnv(0).tools()
    stats, nodes = [], 0
    start = time.perf_counter()
    for task in tasks:  # one tree at a time: the critical path is per tree
        tree = await MCTS(lambda: RetailEnv(0), AgentPolicy(llm, tools), config,
                          rollout_policy=AgentPolicy(llm, tools, temperature=0.0)).search(task)
        stats.append(tree.stats)
        nodes += len(tree.nodes)
    return time.perf_counter() - start, stats, nodes


def _with_latency(tasks: list[Any], latency: float, config: SearchConfig) -> dict[str, Any]:
    clear_caches()  # each measured run starts cold: reuse counts only within its own searches
    wall, stats, _ = asyncio.run(_search_all(tasks, latency, config))
    critical = sum(s.critical_calls for s in stats) * latency
    sequential = sum(s.model_calls for s in stats) * latency
    return {"latency_s": latency, "wall_s": round(wall, 3), "critical_path_s": round(critical, 3),
            "sequential_sum_s": round(sequential, 3), "wall_over_critical_path": round(wall / critical, 3),
            "wall_over_sequential_sum": round(wall / sequential, 3)}


def run(latencies: list[float], n_tasks: int) -> dict[str, Any]:
    tasks = generate_tasks(n_tasks, seed=0, kinds=["cancel"])
    config = SearchConfig()
    asyncio.run(_search_all(tasks[:1], 0.0, config))  # warm-up: imports, world caches
    clear_caches()
    wall0, stats0, nodes0 = asyncio.run(_search_all(tasks, 0.0, config))
    steps0 = sum(s.env_steps for s in stats0)
    runs = [_with_latency(tasks, latency, config) for latency in latencies]
    judged = next(r for r in runs if r["latency_s"] == TARGET_LATENCY)
    return {
        "tasks": n_tasks, "search": config.model_dump(),
        "zero_latency": {"wall_s": round(wall0, 3), "env_steps": steps0, "env_steps_per_s": round(steps0 / wall0, 1),
                         "nodes": nodes0, "nodes_per_s": round(nodes0 / wall0, 1),
                         "model_calls": sum(s.model_calls for s in stats0)},
        "with_latency": runs,
        "target": {"metric": "wall_over_critical_path", "latency_s": TARGET_LATENCY, "below": TARGET,
                   "value": judged["wall_over_critical_path"], "met": judged["wall_over_critical_path"] < TARGET},
    }


def rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary-table rows: search speed, and wall time against the critical path per latency."""
    z = res["zero_latency"]
    out = [row("env steps/s, zero-latency model", z["env_steps_per_s"], "steps/s"),
           row("tree nodes/s, zero-latency model", z["nodes_per_s"], "nodes/s")]
    for r in res["with_latency"]:
        judged = r["latency_s"] == TARGET_LATENCY
        out.append(row(f"wall time at {r['latency_s']} s latency", r["wall_s"], "s", r["critical_path_s"],
                       "critical path of model calls", f"< {TARGET}" if judged else "",
                       r["wall_over_critical_path"] < TARGET if judged else None))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, action="append",
                        help=f"model latency in seconds (repeatable; default {DEFAULT_LATENCIES}, must include {TARGET_LATENCY})")
    parser.add_argument("--tasks", type=int, default=4)
    args = parser.parse_args()
    latencies = sorted(set(args.latency or DEFAULT_LATENCIES) | {TARGET_LATENCY})
    res = run(latencies, args.tasks)
    z, t = res["zero_latency"], res["target"]
    print(f"MCTS (retail, {res['tasks']} trees, 4 iterations x 4 generations, scripted model)")
    print(f"  zero latency : {z['env_steps_per_s']:>8} env steps/s  {z['nodes_per_s']:>8} nodes/s  ({z['wall_s']} s)")
    for w in res["with_latency"]:
        judged = " <- target judged here" if w["latency_s"] == TARGET_LATENCY else ""
        print(f"  latency {w['latency_s']} s: wall {w['wall_s']} s | critical path {w['critical_path_s']} s "
              f"(wall / critical path {w['wall_over_critical_path']}) | all calls in sequence "
              f"{w['sequential_sum_s']} s (wall / sequence {w['wall_over_sequential_sum']}){judged}")
    print(f"  target: wall / critical path < {TARGET} at latency {TARGET_LATENCY} s: {t['value']} "
          f"({'met' if t['met'] else 'NOT met'})")
    print(f"  results -> {write_results('mcts', rows(res), **res)}")


if __name__ == "__main__":
    main()
