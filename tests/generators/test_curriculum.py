"""curriculum: reward tracking, band selection by variance, verifiable evolution on retail."""

from __future__ import annotations

import asyncio

from envs.retail.env import RetailEnv
from generators.curriculum import Curriculum, CurriculumConfig, RewardTracker, nearest_task
from schemas.store import Dataset
from tests.generators.test_mcts_scripted import ScriptedRetailLLM


def test_tracker_selects_by_variance_inside_the_band():
    tr = RewardTracker((0.0, 1.0))
    for tid, rewards in {"always": [1, 1, 1, 1], "never": [0, 0, 0, 0], "half": [1, 0, 1, 0], "most": [1, 1, 1, 0]}.items():
        for r in rewards:
            tr.record(tid, r)
    assert tr.select(["always", "never", "most", "half"], 5) == ["half", "most"]


def test_evolution_maps_to_env_tasks_and_keeps_only_in_band(tmp_path):
    env = RetailEnv(0)
    cfg = CurriculumConfig(num_tasks=1, candidates=16, generations=1)
    method = Curriculum(cfg, None)  # tasks only
    tasks = list(method.seed_tasks().values()) + method.pool()
    llm = ScriptedRetailLLM(tasks)
    method = Curriculum(cfg, llm)
    out = Dataset.create(tmp_path / "out")
    summary = asyncio.run(method.run(method.tasks(), out))
    seed = tasks[0]
    kept = list(out.iter_records())
    # The seed (a cancel task) is solved by 3 of 4 attempts: in band.
    assert [t.reward for t in kept] == [1.0, 0.0, 1.0, 1.0] and kept[0].details["curriculum"]["in_band"]
    assert summary.counts["evolved_easier"] == 1 and summary.counts["evolved_harder"] == 1
    # Evolved tasks are real env tasks with fewer / more reference actions; the scripted agent always
    # solves them, so they leave the band and their trajectories are rejected with the reason.
    rejected = list(out.iter_records("filtered"))
    assert len(rejected) == 8 and all(f.decision.reason.startswith("out of band") for f in rejected)
    sizes = {f.record.details["task"]["metadata"]["direction"]: len(f.record.details["task"]["goal"]["actions"]) for f in rejected}
    assert sizes["easier"] < len(seed.goal["actions"]) < sizes["harder"]
    assert nearest_task("cancel my order", seed, method.pool(), "harder") is not None
    env.close()
