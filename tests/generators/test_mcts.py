"""MCTS over the retail environment with a scripted model: tree shape, determinism, parallel leaves."""

from __future__ import annotations

import asyncio

from envs.retail.env import RetailEnv
from generators.agent import AgentPolicy
from generators.mcts import MCTS, SearchConfig, Tree, tree_signature
from generators.scripted import ScriptedRetailLLM, cancel_tasks


def _search(config: SearchConfig, **llm_kw) -> tuple[Tree, ScriptedRetailLLM]:
    task = cancel_tasks(1)[0]
    llm = ScriptedRetailLLM([task], **llm_kw)
    tools = RetailEnv(0).tools()
    tree = asyncio.run(MCTS(lambda: RetailEnv(0), AgentPolicy(llm, tools), config,
                            rollout_policy=AgentPolicy(llm, tools, temperature=0.0)).search(task))
    return tree, llm


def test_tree_has_the_configured_shape():
    tree, llm = _search(SearchConfig())  # paper defaults: 4 iterations x 4 generations, depth 10, c = 0.25
    assert len(tree.nodes) == 1 + 4 * 4
    assert len(tree.expanded()) == 4 and all(len(n.children) == 4 for n in tree.expanded())
    assert tree.depth() == 2 and tree.root.visits == 16
    # Each expansion is ONE model call asking for n = 4 samples.
    expansions = [r for r in llm.requests if r.n == 4]
    assert len(expansions) == 4 == tree.stats.expansions
    for node in tree.nodes[1:]:
        assert node.outcome in (0.0, 1.0)
        assert node.history[: len(node.parent.history)] == node.parent.history
        # Rollouts stay within max depth (agent actions along the whole path).
        assert node.depth + sum(1 for s in node.rollout if s.kind in ("api", "message")) <= 10
    # The wrong write (sample 1) never recovers; the others succeed.
    assert [c.outcome for c in tree.root.children] == [1.0, 0.0, 1.0, 1.0]
    assert tree.root.value_sum == sum(n.outcome for n in tree.nodes[1:])


def test_search_is_deterministic_for_a_scripted_model():
    a, _ = _search(SearchConfig(iterations=3, generations=3, c=0.5))
    b, _ = _search(SearchConfig(iterations=3, generations=3, c=0.5))
    assert tree_signature(a) == tree_signature(b)
    assert len(a.nodes) == 1 + 3 * 3


def test_depth_cap_and_duplicate_merging():
    tree, _ = _search(SearchConfig(iterations=3, generations=8, max_depth=2))
    # 8 samples but only 4 distinct actions per expansion; depth-capped leaves are closed, never grown.
    assert all(len(n.children) == 4 for n in tree.expanded())
    assert tree.stats.duplicate_samples == 4 * len(tree.expanded())
    assert tree.depth() <= 2
    assert all(n.depth + sum(1 for s in n.rollout if s.kind in ("api", "message")) <= 2 for n in tree.nodes[1:])


def test_parallel_leaves_and_critical_path():
    tree, _ = _search(SearchConfig(iterations=2, generations=2, leaves_per_iteration=2))
    # Iteration 1 has one leaf (the root); iteration 2 grows both children at once.
    assert len(tree.nodes) == 1 + 2 + 2 * 2
    assert tree.stats.expansions == 3
    assert tree.stats.critical_calls < tree.stats.model_calls


def test_ended_paths_are_closed_and_no_iteration_is_spent_on_them():
    """Agent-R's search (mcts_raw.py) never selects a terminal node again: every iteration expands an open node."""
    tree, _ = _search(SearchConfig(iterations=3, generations=8, max_depth=2))
    # Iteration 2 grew a depth-1 node into 4 depth-capped (ended) children; iteration 3 grows another node.
    assert tree.stats.iterations == tree.stats.expansions == 3
    assert len(tree.expanded()) == 3 and all(not n.terminal for n in tree.expanded())
    assert all(n.closed for n in tree.nodes if n.depth == 2)
    # Each ended path is counted once: the root's visits are exactly its descendants' backed-up outcomes.
    assert tree.root.visits == len(tree.nodes) - 1


def test_search_stops_when_every_path_has_ended():
    tree, llm = _search(SearchConfig(iterations=10, generations=8, max_depth=1))
    # One expansion ends every path (depth cap 1): the root closes and the other 9 iterations are not run.
    assert tree.root.closed and tree.stats.exhausted == 1
    assert tree.stats.iterations == tree.stats.expansions == 1
    assert tree.root.visits == len(tree.root.children) == 4
    assert len([r for r in llm.requests if r.n == 8]) == 1
