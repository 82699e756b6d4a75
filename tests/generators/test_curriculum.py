"""curriculum: reward tracking, next tasks chosen by reward variance, verifiable evolution on retail."""

from __future__ import annotations

import asyncio

from envs.retail.env import RetailEnv
from generators.curriculum import EVOLVE, Curriculum, CurriculumConfig, RewardTracker, nearest_task
from generators.scripted import ScriptedRetailLLM
from schemas.store import Dataset


def test_tracker_selects_by_variance_inside_the_band():
    tr = RewardTracker((0.0, 1.0))
    for tid, rewards in {"always": [1, 1, 1, 1], "never": [0, 0, 0, 0], "half": [1, 0, 1, 0], "most": [1, 1, 1, 0]}.items():
        for r in rewards:
            tr.record(tid, r)
    assert tr.select(["always", "never", "most", "half"], 5) == ["half", "most"]


def _evolve_prompts(llm: ScriptedRetailLLM) -> list[str]:
    head = EVOLVE.split("{rate", 1)[0]
    return [r.messages[-1]["content"] for r in llm.requests if r.messages[-1]["content"].startswith(head)]


def test_next_round_evolves_the_mixed_tasks_by_reward_variance(tmp_path):
    cfg = CurriculumConfig(tasks={"n": 6}, candidates=16, generations=1, select=2)
    seeds = list(Curriculum(cfg, None).seed_tasks().values())
    t = [s.id for s in seeds]
    # Scripted outcomes over 4 rollouts: t1, t4 always solved; t2, t5 never; t3 solved 2 of 4 (variance
    # 0.25); t0, a cancel task, by the default script 3 of 4 (0.1875). Seed order puts t0 first.
    solved = {t[1]: 4, t[4]: 4, t[2]: 0, t[5]: 0, t[3]: 2}
    method = Curriculum(cfg, None)
    llm = ScriptedRetailLLM(seeds + method.pool(), solved=solved)
    method = Curriculum(cfg, llm)
    out = Dataset.create(tmp_path / "out")
    summary = asyncio.run(method.run(method.tasks(), out))

    seed_rewards = {}
    for traj in out.iter_records():
        if traj.details["curriculum"]["generation"] == 0:
            seed_rewards.setdefault(traj.details["curriculum"]["task_id"], []).append(traj.reward)
    assert seed_rewards == {t[0]: [1.0, 0.0, 1.0, 1.0], t[1]: [1.0] * 4, t[2]: [0.0] * 4, t[3]: [1.0, 1.0, 0.0, 0.0],
                            t[4]: [1.0] * 4, t[5]: [0.0] * 4}
    # The mixed tasks, highest variance first, are the ones evolved next; the others never are.
    assert method.tracker.select(t, 6) == [t[3], t[0]]
    prompts = _evolve_prompts(llm)
    assert len(prompts) == 4
    assert [next(i for i, s in enumerate(seeds) if s.instruction in p) for p in prompts] == [3, 3, 0, 0]
    later = [*out.iter_records(), *(f.record for f in out.iter_records("filtered"))]
    later = [x for x in later if x.details["curriculum"]["generation"] == 1]
    assert {x.details["curriculum"]["parent"] for x in later} == {t[3], t[0]} and len(later) == 16
    assert {x.details["curriculum"]["task_id"] for x in later} == {f"{p}/{d}" for p in (t[3], t[0]) for d in ("easier", "harder")}
    assert summary.counts["evolved_easier"] == summary.counts["evolved_harder"] == 2 and summary.tasks == 6 + 4

    # A re-run resumes: every task is done, the same selection is made, no model call is repeated.
    again = Curriculum(cfg, ScriptedRetailLLM(seeds + method.pool(), solved=solved))
    rerun = asyncio.run(again.run(again.tasks(), out))
    assert rerun.processed == 0 and rerun.skipped == 10 and not again.llm.requests
    assert again.tracker.select(t, 6) == [t[3], t[0]]


def test_evolution_maps_to_env_tasks_and_keeps_only_in_band(tmp_path):
    env = RetailEnv(0)
    cfg = CurriculumConfig(tasks={"n": 1}, candidates=16, generations=1)
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
    asyncio.run(env.close())
