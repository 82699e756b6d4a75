"""mcts_splice on retail with a scripted model: exact masks of spliced paths, truly shared pair prefixes."""

from __future__ import annotations

import asyncio

import pytest

from filters.step_judge import describe
from generators.base import TaskSpec
from generators.mcts_splice import REVISION_TEMPLATES, MCTSSplice, MCTSSpliceConfig, shared_prefix, splice
from generators.scripted import REVISION_ANSWER, REVISION_MARK, ScriptedRetailLLM, cancel_tasks
from schemas.models import ApiAction, MessageAction, TextObservation, Usage
from schemas.store import Dataset


def _method(**cfg) -> tuple[MCTSSplice, ScriptedRetailLLM]:
    tasks = cancel_tasks(1)
    llm = ScriptedRetailLLM(tasks)
    method = MCTSSplice(MCTSSpliceConfig(tasks={"n": 1}, **cfg), llm)
    assert [t.id for t in method.tasks()] == [tasks[0].id]  # env.generate_tasks(1, 0) is a cancel task
    asyncio.run(method.setup())
    return method, llm


def masked(steps) -> list[int]:
    """The loss-masked steps after the system step (the system prompt is context, never trained)."""
    assert steps[0].name == "system" and not steps[0].train
    return [i for i, s in enumerate(steps) if not s.train and i > 0]


@pytest.fixture(scope="module")
def result():
    method, _ = _method(pairing="closest", max_pairs_per_task=4)  # trajforge's earlier rule, kept as an option
    return asyncio.run(method.run_task(TaskSpec(id=cancel_tasks(1)[0].id)))


def test_spliced_masks_are_exact(result):
    spliced = {t.id.rsplit("/", 2)[-2]: t for t in result.trajectories if t.details["role"] == "spliced"}
    assert set(spliced) == {"n2+n1", "n6+n1", "n10+n3", "n14+n4"}
    # n2 = the wrong cancel right at the root: [0] system prompt, [1] task, [2] wrong cancel (masked), [3] its
    # result (masked), [4] revision thought, then n1's whole path from step 2 on (trained).
    t = spliced["n2+n1"]
    assert masked(t.steps) == [2, 3]
    assert t.details["splice"] == {**t.details["splice"], "prefix_len": 2, "first_error": 2, "masked": [2, 3],
                                   "revision_index": 4, "error_source": "llm"}
    assert t.steps[2].kind == "api" and t.steps[2].function == "cancel_pending_order"
    assert isinstance(t.steps[4], MessageAction) and t.steps[4].extra == {"kind": "revision"} and t.steps[4].train
    # One of Agent-R's revision thoughts: nothing of the verifier's reason.
    assert t.steps[4].content in REVISION_TEMPLATES and t.details["splice"]["reason"] not in t.steps[4].content
    # What the agent's requests did not produce as recorded: the revision, and n1's continuation.
    assert t.details["rewrites"][0] == {"steps": [4], "kind": "written",
                                        "reason": "the revision thought (template), spliced in"}
    assert t.details["rewrites"][1]["kind"] == "context" and t.details["rewrites"][1]["steps"] == [5, 7, 9, 11]
    assert [s.function for s in t.steps if s.kind == "api" and s.train] == [
        "find_user_id_by_name_zip", "get_order_details", "cancel_pending_order"]
    assert t.reward == 1.0 and t.success
    # n6: wrong cancel after finding the user: the prefix's action [2] and the bad segment [4, 5] masked (the
    # whole bad path before the revision, as Agent-R), [6] revision.
    for key in ("n6+n1", "n10+n3", "n14+n4"):
        s = spliced[key]
        assert masked(s.steps) == [2, 4, 5]
        assert s.details["splice"]["revision_index"] == 6 and s.steps[6].extra["kind"] == "revision"
        assert s.steps[1].train and not s.steps[2].train
    # Tool call ids stay unique within a spliced trajectory.
    ids = [s.tool_call_id for s in t.steps if s.kind == "api"]
    assert len(ids) == len(set(ids))


def test_pairs_share_exactly_their_prefix(result):
    by_id = {t.id: t for t in result.trajectories}
    assert len(result.pairs) == 8
    assert {p.level for p in result.pairs} == {"trajectory", "step"}
    assert len(by_id) == len(result.trajectories)  # unique ids
    for pair in result.pairs:
        chosen, rejected = by_id[pair.chosen_id], by_id[pair.rejected_id]
        k = pair.prefix_len
        assert chosen.steps[:k] == rejected.steps[:k]
        assert chosen.steps[k] != rejected.steps[k] and chosen.steps[k].kind in ("api", "message")
        if pair.level == "step":
            assert len(chosen.steps) == len(rejected.steps) == k + 1
            # IPR's step rewards: the mean outcome of 5 seeded rollouts from after each step (draws 0 and 4 of the
            # scripted agent solve the task; after the wrong cancel nothing can).
            assert (pair.chosen_reward, pair.rejected_reward) == (0.4, 0.0)
        else:
            assert chosen.success and not rejected.success
            assert pair.chosen_reward == 1.0 and pair.rejected_reward == 0.0


def test_first_error_sources():
    for verifier, source in (("rules", "rules"), ("divergence", "divergence")):
        method, _ = _method(verifier=verifier, max_pairs_per_task=1, pairing="closest")
        r = asyncio.run(method.run_task(TaskSpec(id=cancel_tasks(1)[0].id)))
        spliced = [t for t in r.trajectories if t.details["role"] == "spliced"]
        assert len(spliced) == 1 and spliced[0].details["splice"]["error_source"] == source
        assert spliced[0].details["splice"]["first_error"] == 2
        assert r.counts[f"first_error_{source}"] == 1


def test_splice_function_masks_bad_segment_up_to_the_error():
    obs = lambda c: TextObservation(content=c, source="environment")  # noqa: E731
    a = lambda f: ApiAction(function=f, tool_call_id=f"x{f}")  # noqa: E731
    prefix = [obs("task")]
    bad = prefix + [a("b1"), obs("r1"), a("b2"), obs("r2"), a("b3"), obs("r3")]
    good = prefix + [a("g1"), obs("q1")]
    assert shared_prefix(good, bad) == 1
    # The same action made by two model calls (each with its own usage) is shared content.
    same = [obs("task"), a("s1").model_copy(update={"usage": Usage(model="m", latency_s=0.1)}), obs("r1")]
    twin = [*same[:1], same[1].model_copy(update={"usage": Usage(model="m", latency_s=0.7)}), obs("r1")]
    assert shared_prefix(same + [a("x"), obs("x")], twin + [a("y"), obs("y")]) == 3
    steps, masked = splice(1, bad, good, error=3, revision="oops")
    assert masked == [1, 2, 3, 4]
    assert [s.train for s in steps] == [True, False, False, False, False, True, True, True]
    # After a shared action, that action is masked too (context the world went through).
    shared, masked_shared = splice(3, same + [a("x"), obs("x")], same + [a("y"), obs("y")], error=3, revision="oops")
    assert masked_shared == [1, 3, 4] and shared[1].extra == {"masked": "context"} and not shared[1].train
    assert steps[5].content == "oops" and steps[6].function == "g1"
    assert [s.tool_call_id for s in steps if s.kind == "api"] == ["call_1", "call_3", "call_6"]


def test_method_run_writes_pairs_and_members(tmp_path):
    method, _ = _method(search={"iterations": 2, "generations": 4})
    ds = Dataset.create(tmp_path / "out", stage="generate:mcts_splice")
    summary = asyncio.run(method.run(method.tasks(), ds))
    trajs = {t.id: t for t in ds.iter_records()}
    pairs = list(ds.iter_records("pairs"))
    assert summary.counts["pairs"] == len(pairs) > 0 and summary.counts["mcts_nodes"] == 1 + 2 * 4
    assert all(p.chosen_id in trajs and p.rejected_id in trajs for p in pairs)


def test_model_written_revision_gets_the_error_context_and_is_spliced_trained():
    method, llm = _method(revision="model", pairing="closest", max_pairs_per_task=4)
    task = cancel_tasks(1)[0]
    r = asyncio.run(method.run_task(TaskSpec(id=task.id)))
    spliced = [t for t in r.trajectories if t.details["role"] == "spliced"]
    revisions = [q for q in llm.requests if REVISION_MARK in q.messages[-1]["content"]]
    assert len(spliced) == 4 and len(revisions) == len(spliced)
    for traj, request in zip(spliced, revisions):
        info = traj.details["splice"]
        error_step = traj.steps[info["first_error"]]
        wrong = describe(error_step)
        # One user turn at temperature 0 naming the request and the wrong step, as the agent saw them: not the
        # verifier's reason (Agent-R's revision thoughts carry none).
        assert [m["role"] for m in request.messages] == ["user"] and request.params["temperature"] == 0.0
        prompt = request.messages[0]["content"]
        assert task.instruction in prompt and f"The wrong step:\n{wrong}\n" in prompt
        assert info["reason"] not in prompt and info["error_source"] == "llm"
        # The model's text is the revision step; the bad path before it is masked.
        revision = traj.steps[info["revision_index"]]
        assert isinstance(revision, MessageAction) and revision.extra == {"kind": "revision"}
        assert revision.content == REVISION_ANSWER.format(step=wrong) and revision.train
        assert masked(traj.steps) == info["masked"]
        prefix_actions = [i for i in range(info["prefix_len"]) if traj.steps[i].kind in ("api", "message")]
        assert info["masked"] == prefix_actions + list(range(info["prefix_len"], info["revision_index"]))
        assert error_step.kind == "api" and not error_step.train and not traj.steps[info["first_error"] + 1].train


def test_the_whole_bad_path_before_the_revision_is_masked_and_still_replays(result):
    """Agent-R trains a revision trajectory from the revision on: every step of the bad path before it, the prefix
    it shares with the good path included, is context with its loss masked. The world still went through that
    prefix: a replay takes it (only the bad segment after it was undone)."""
    from envs.base import transitions

    spliced = {t.id.rsplit("/", 2)[-2]: t for t in result.trajectories if t.details["role"] == "spliced"}
    s = spliced["n6+n1"]  # [2] find the user (shared with the good path), [4] the wrong cancel, [6] revision
    info = s.details["splice"]
    actions = [i for i, st in enumerate(s.steps) if st.kind in ("api", "message")]
    assert [i for i in actions if s.steps[i].train] == [i for i in actions if i >= info["revision_index"]]
    assert info["masked"] == [2, 4, 5] and masked(s.steps) == [2, 4, 5]
    assert s.steps[2].function == "find_user_id_by_name_zip" and s.steps[2].extra == {"masked": "context"}
    # A replay goes through the shared prefix and the good continuation, not the undone wrong cancel.
    replayed = [a.function for a, _ in transitions(s.steps) if a.kind == "api"]
    assert replayed == ["find_user_id_by_name_zip", "get_order_details", "cancel_pending_order"]


def test_step_pairs_come_from_monte_carlo_step_rewards(result):
    """IPR: each compared step's reward is the mean outcome of N rollouts from the state after it; a step pair is
    made only when one side is better by its path's final reward and by its step reward (each by more than a
    threshold), and the pair carries both estimates."""
    steps = [p for p in result.pairs if p.level == "step"]
    assert steps and result.counts["ipr_step_pairs"] == len(steps)
    for pair in steps:
        values = pair.details["step_values"]
        assert values["method"] == "monte_carlo" and values["rollouts"] == 5 and values["expert"] == "chosen"
        assert values["chosen"]["rewards"] == [1.0, 0.0, 0.0, 0.0, 1.0] and values["chosen"]["value"] == 0.4
        assert values["rejected"]["rewards"] == [0.0] * 5 and values["rejected"]["final_reward"] == 0.0
        assert (pair.chosen_reward, pair.rejected_reward) == (values["chosen"]["value"], values["rejected"]["value"])
    # One estimate per distinct step history (the good path's step is shared by its pairs), 5 rollouts each.
    assert result.counts["ipr_rollouts"] % 5 == 0 and result.counts["ipr_rollouts"] > 0


def test_ipr_rule():
    from generators.mcts_splice import ipr_preference

    assert ipr_preference(1.0, 0.0, 0.4, 0.0, 0.01, 0.01) == "expert"
    assert ipr_preference(0.0, 1.0, 0.2, 0.6, 0.01, 0.01) == "agent"
    # A better final reward with an equal step reward is a tie: the step itself was not what made the difference.
    assert ipr_preference(1.0, 0.0, 0.4, 0.4, 0.01, 0.01) is None
    assert ipr_preference(1.0, 0.0, 0.4, 0.6, 0.01, 0.01) is None  # the two criteria disagree
    assert ipr_preference(1.0, 1.0, 0.8, 0.2, 0.01, 0.01) is None  # equal outcomes


def test_all_good_bad_combinations_are_paired_as_agent_r():
    """Agent-R's path_collection.py pairs every (high, low) leaf path whose value gap exceeds beta, uncapped."""
    from generators.mcts import MCTS
    from generators.mcts_splice import complete_paths

    method, _ = _method()  # pairing: all, no cap (the defaults)
    task = cancel_tasks(1)[0]
    r = asyncio.run(method.run_task(TaskSpec(id=task.id)))
    tree = asyncio.run(MCTS(method.make_env, method.policy(1.0), method.config.search,
                            rollout_policy=method.policy(0.0)).search(method.env_tasks()[task.id]))
    paths = complete_paths(tree)
    good = [p for p in paths if p.reward >= 0.5]
    expected = {(g.node, p.node) for g in good for p in paths if p is not g and g.reward - p.reward >= 0.2}
    spliced = [t for t in r.trajectories if t.details["role"] == "spliced"]
    got = {(t.details["splice"]["good_node"], t.details["splice"]["bad_node"]) for t in spliced}
    assert len(good) > 1 and got == expected and len(got) == len(good) * (len(paths) - len(good)) > 4
    assert all(t.details["splice"]["pairing"] == "all" for t in spliced)
    assert r.counts["pairing_all"] == len(got)
    trajectory_pairs = [p for p in r.pairs if p.level == "trajectory"]
    assert len(trajectory_pairs) == len(got) and all(p.details["pairing"] == "all" for p in trajectory_pairs)


def test_step_pair_members_never_become_sft_rows(tmp_path):
    """A step pair's sides (a good prefix + one action) train through their pair only: an SFT export of the run
    leaves them out, so the good path's prefix is not trained again as extra copies."""
    from converters.export import ExportConfig, export
    from converters.export.records import PAIR_MEMBER

    method, _ = _method(search={"iterations": 2, "generations": 4})
    ds = Dataset.create(tmp_path / "out", stage="generate:mcts_splice")
    asyncio.run(method.run(method.tasks(), ds))
    trajs = list(ds.iter_records())
    members = [t for t in trajs if t.details["role"] == "step"]
    assert members and all(t.details["pair_only"] is True for t in members)
    report = export(ds.path, tmp_path / "sft", ExportConfig(format="trl-sft"))
    assert report.skipped[PAIR_MEMBER] == len(members)
    episodes = [t for t in trajs if t.details["role"] != "step" and t.success]
    assert report.records_exported == len(episodes) > 0
    # The pairs still hold them: the DPO export joins both sides.
    dpo = export(ds.path, tmp_path / "dpo", ExportConfig(format="trl-dpo", dpo_level="step"))
    assert dpo.rows > 0


class _EmptyRevisionLLM(ScriptedRetailLLM):
    """Writes empty revisions and a first-error verifier that calls every step good (names no error)."""

    async def _complete(self, request):
        text = request.messages[-1]["content"] if request.messages else ""
        if REVISION_MARK in text:
            return [self._to_completion("", request, 0)]
        return await super()._complete(request)

    def _judge(self, request):
        answer = super()._judge(request)
        for step in answer.get("steps", []):
            step["verdict"], step["reason"] = "Good", "fine"
        return answer


def test_every_fallback_is_counted_warned_once_and_recorded(tmp_path, caplog):
    from converters.export import ExportConfig, export

    tasks = cancel_tasks(1)
    method = MCTSSplice(MCTSSpliceConfig(tasks={"n": 1}, revision="model", verifier="llm"), _EmptyRevisionLLM(tasks))
    asyncio.run(method.setup())
    ds = Dataset.create(tmp_path / "out", stage="generate:mcts_splice")
    with caplog.at_level("WARNING", logger="trajforge.generators"):
        summary = asyncio.run(method.run(method.tasks(), ds))
    spliced = [t for t in ds.iter_records() if t.details["role"] == "spliced"]
    assert spliced and summary.counts["fallback_revision"] == summary.counts["fallback_first_error"] == len(spliced)
    for t in spliced:
        assert set(t.details["fallbacks"]) == {"revision", "first_error"}
        assert t.details["splice"]["revision_writer"] == "template" and t.details["splice"]["error_source"] == "divergence"
        # The record no longer claims a model revision; the thought says nothing of the search.
        assert t.details["rewrites"][0]["reason"] == "the revision thought (template), spliced in"
        assert t.steps[t.details["splice"]["revision_index"]].content in REVISION_TEMPLATES
    warnings = [r.getMessage() for r in caplog.records if "mcts_splice:" in r.getMessage()]
    assert len([w for w in warnings if "revision" in w.split(":")[1]]) == 1
    assert len([w for w in warnings if "first error" in w]) == 1
    report = export(ds.path, tmp_path / "sft", ExportConfig(format="trl-sft"))
    notes = {k: v for k, v in report.notes.items() if k.startswith("fallback in mcts_splice records")}
    assert sorted(notes.values()) == [len(spliced)] * 2
    card = (tmp_path / "sft" / "README.md").read_text()
    assert "fallback in mcts_splice records: revision:" in card
