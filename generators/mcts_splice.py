"""Agent-R reflection splicing: MCTS trees -> spliced revision trajectories + preference pairs.

Per environment task: search a tree (`generators.mcts`), read every node's complete path (its
history plus its greedy rollout; content-identical paths count once), split them into good
(outcome >= alpha) and bad, and match them (`pairing`): `all` (Agent-R's `pair_leaf_paths`,
the default) pairs every good path with every path whose outcome is lower by at least beta;
`closest` (trajforge's earlier rule, kept as an option) pairs each bad path (below alpha) with
the one good path sharing its longest prefix. `max_pairs_per_task` caps the matches (default:
none, as Agent-R); the records say which rule ran (`details["splice"]["pairing"]`). Each match gives:

- a spliced trajectory: the bad path up to and including the first error and its observation,
  all context with the loss masked as Agent-R masks it (the prefix shared with the good path
  included: its actions are marked `extra["masked"] = "context"`, taken in the world; the bad
  segment after it is the branch not taken) + a revision thought + the good path's continuation
  from the shared prefix (trained). The first error comes from the verifier model (`verifier: llm`, per-step
  Good/Bad/Uncertain, first Bad at or after the divergence), the step rules (`rules`), or is the
  divergence point itself (`divergence`; also the fallback when none is named).
  The revision thought is a `MessageAction` tagged `extra["kind"] = "revision"`: it renders as an
  assistant turn (merged with the tool call that follows), and replayers skip it. The record
  declares what no request of the agent produced as recorded (`details["rewrites"]`): the revision
  (written), and the good continuation (context: the agent chose those actions after the good
  path's own steps, not after the failed segment).
- preference pairs, both with `prefix_len` = the shared prefix: trajectory level (the two
  complete paths) and step level (IPR / Agent Q: prefix + the next action only). Member
  trajectories are written too (unique ids), so the DPO exporter can join them; a step pair's
  members are no episodes and carry `details["pair_only"]`: SFT and KTO exports leave them out.
- every fallback (no first error named: the divergence point; an empty model revision: a
  template) counted (`fallback_<what>`), warned once per run, and recorded on the spliced
  record (`details["fallbacks"]`), which the export card counts.

Works on every environment: worlds that snapshot branch from copies, the others (MCP servers,
browsers) by replaying a node's history in a fresh episode (`mcts_replays` counts them). Every
path's outcome is the environment's own evaluation at its end (goal state, task criteria, an LLM
judge). Generated trajectories carry `details["task"]` / `details["env_config"]`, which the step
verification rules use to replay them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

from converters.export.records import FALLBACKS, PAIR_ONLY
from envs.base import ACTION_KINDS, MASKED_CONTEXT, Evaluation, Task
from filters import step_judge, step_rules
from generators._episode import continue_episode, renumber_calls
from generators.base import Role, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.failures import episode_failure
from generators.mcts import MCTS, SearchConfig, Tree
from generators.registry import register_method
from schemas.models import MessageAction, Pair, Rewrite, Step, Trajectory

log = logging.getLogger("trajforge.generators")

# Agent-R's revision thoughts (bytedance/Agent-R, mcts_utils/llm_server.py; its splicing draws from the first ten):
# the agent notices a mistake in its own words, with neither the verifier's reason nor the search's wording, which
# the trained agent never sees.
REVISION_TEMPLATES = (
    "I realize my approach was flawed. I need to revise it.",
    "I took the wrong steps. I need to identify the right path.",
    "My actions were incorrect. I must adjust my strategy.",
    "I see an error in my actions. I need to fix it.",
    "I misunderstood the situation. Time to reassess.",
    "My decision was wrong. I should reevaluate.",
    "I went off course. I need to steer back on track.",
    "I recognize my mistake. Let's find a better solution.",
    "My judgment was incorrect. I need to rethink it.",
    "I made an error. I must determine how to correct it.",
)
REVISION_PROMPT = (
    "You are an agent that just noticed a mistake. The request:\n{task}\n\nThe wrong step:\n{step}\n\nWrite one or "
    "two sentences, in the first person, in which you notice the mistake and decide to correct it. Do not call tools."
)


class StepRewards(BaseModel):
    """IPR's Monte Carlo step rewards, the source of step-level pairs (defaults: IPR's code)."""

    model_config = ConfigDict(extra="forbid")

    rollouts: int = Field(5, ge=1, description="rollouts to the end of the episode from each compared step (IPR: 5)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of those rollouts (every step)")
    step_threshold: float = Field(0.01, ge=0, description="the step values must differ by more than this")
    trajectory_threshold: float = Field(0.01, ge=0, description="the paths' final rewards must differ by more than this")


class MCTSSpliceConfig(EnvMethodConfig):
    method: Literal["mcts_splice"] = "mcts_splice"
    search: SearchConfig = Field(default_factory=SearchConfig)
    temperature: float = Field(1.0, description="sampling temperature of expansions")
    rollout_temperature: float = Field(0.0, description="greedy rollouts")
    alpha: float = Field(0.5, description="a path is good when its outcome >= alpha")
    beta: float = Field(0.2, ge=0, description="good.outcome - bad.outcome must be >= beta")
    pairing: Literal["all", "closest"] = Field(
        "all", description="all: every (good, worse) combination with an outcome gap >= beta (Agent-R's code); "
                           "closest: each bad path with the good path sharing its longest prefix")
    max_pairs_per_task: int | None = Field(None, ge=0, description="cap on matches per tree (null: none, as Agent-R)")
    verifier: Literal["llm", "rules", "divergence"] = "llm"
    revision: Literal["template", "model"] = "template"
    trajectory_pairs: bool = True
    step_pairs: bool = Field(True, description="step-level pairs, by IPR's Monte Carlo step rewards (step_rewards)")
    step_rewards: StepRewards = Field(default_factory=StepRewards)
    keep_best_good: bool = Field(True, description="also write the best good path of each tree")


@dataclass(frozen=True)
class SearchPath:
    """A complete path of the tree: a node's history + rollout, and its outcome."""

    node: int
    steps: list[Step]
    reward: float
    evaluation: Evaluation | None = None


# What a step holds beyond its content: the model call that made it.
_NOT_CONTENT = {"usage"}


def complete_paths(tree: Tree) -> list[SearchPath]:
    """Every rolled-out node's complete path, content duplicates dropped, in node order."""
    seen: set[str] = set()
    out: list[SearchPath] = []
    for node in tree.nodes[1:]:
        if node.outcome is None:
            continue
        steps = node.path_steps()
        key = hashlib.sha256("\x00".join(s.model_dump_json(exclude=_NOT_CONTENT) for s in steps).encode()).hexdigest()
        if key not in seen:
            seen.add(key)
            out.append(SearchPath(node.id, steps, float(node.outcome), node.evaluation))
    return out


def same_content(a: Step, b: Step) -> bool:
    """Equal steps, whichever model call made them (usage differs from call to call)."""
    return a is b or a.model_dump(exclude=_NOT_CONTENT) == b.model_dump(exclude=_NOT_CONTENT)


def shared_prefix(a: list[Step], b: list[Step]) -> int:
    """Leading steps equal in content, backed off so both continue with an agent action there."""
    k = 0
    while k < min(len(a), len(b)) and same_content(a[k], b[k]):
        k += 1
    while k > 0 and not (k < len(a) and k < len(b) and a[k].kind in ACTION_KINDS and b[k].kind in ACTION_KINDS):
        k -= 1
    return k


def match_paths(paths: list[SearchPath], alpha: float, beta: float, limit: int | None,
                pairing: Literal["all", "closest"] = "all") -> list[tuple[SearchPath, SearchPath, int]]:
    """(good, bad, prefix_len) matches, at most `limit` (None: all).

    `all`, Agent-R's `pair_leaf_paths`: every good path (outcome >= alpha) with every path whose outcome is lower
    by at least beta, in path order; `closest`: each bad path (below alpha) with the good path that shares its
    longest prefix."""
    good = [p for p in paths if p.reward >= alpha]
    out: list[tuple[SearchPath, SearchPath, int]] = []
    if pairing == "all":
        for g in good:
            for other in paths:
                k = shared_prefix(g.steps, other.steps)
                if other is not g and g.reward - other.reward >= beta and k > 0:
                    out.append((g, other, k))
        return out if limit is None else out[:limit]
    for bad in (p for p in paths if p.reward < alpha):
        options = [(shared_prefix(g.steps, bad.steps), g) for g in good if g.reward - bad.reward >= beta]
        options = [(k, g) for k, g in options if k > 0]
        if not options:
            continue
        k, g = max(options, key=lambda o: (o[0], o[1].reward, -o[1].node))
        out.append((g, bad, k))
        if limit is not None and len(out) >= limit:
            break
    return out


def through(steps: list[Step], k: int) -> list[Step]:
    """`steps` up to and including the action at `k` and the observation that answered it."""
    end = k + 1
    if end < len(steps) and steps[end].kind not in ACTION_KINDS:
        end += 1
    return list(steps[:end])


def ipr_preference(expert_final: float, agent_final: float, expert_value: float, agent_value: float,
                   trajectory_threshold: float, step_threshold: float) -> Literal["expert", "agent"] | None:
    """IPR's rule for a step-level pair (construct_preference_monte_carlo_*.py): the agent's step wins when its
    path's final reward and its Monte Carlo step reward both beat the expert's by more than the thresholds,
    the expert's step when both of the expert's do; anything else is a tie (no pair)."""
    if agent_final > expert_final + trajectory_threshold and agent_value > expert_value + step_threshold:
        return "agent"
    if expert_final > agent_final + trajectory_threshold and expert_value > agent_value + step_threshold:
        return "expert"
    return None


def splice(prefix_len: int, bad: list[Step], good: list[Step], error: int, revision: str) -> tuple[list[Step], list[int]]:
    """bad[:error] and the error's observation (all loss-masked) + revision + good continuation.

    As Agent-R, the loss falls on the revision and what follows only: the bad path before it is context, the
    prefix it shares with the good path included. The prefix's actions are marked `extra["masked"] =
    "context"` (the world went through them: replays take them); the bad segment after it is the branch not
    taken. Returns the steps and the indices with train = false (the prefix's actions, the bad segment).
    """
    end = error + 1
    if end < len(bad) and bad[end].kind not in ACTION_KINDS:
        end += 1  # the erroneous action's observation is part of the masked segment
    head = [s.model_copy(update={"train": False, "extra": {**s.extra, "masked": MASKED_CONTEXT}})
            if s.kind in ACTION_KINDS and s.train else s for s in bad[:prefix_len]]
    masked_part = [s.model_copy(update={"train": False}) for s in bad[prefix_len:end]]
    thought = MessageAction(content=revision, extra={"kind": "revision"})
    steps = renumber_calls(head + masked_part + [thought] + list(good[prefix_len:]))
    masked = [i for i, s in enumerate(bad[:prefix_len]) if s.kind in ACTION_KINDS and s.train]
    return steps, masked + list(range(prefix_len, end))


@register_method
class MCTSSplice(EnvMethod):
    """Agent-R: MCTS over an environment; spliced revision trajectories and sibling preference pairs."""

    name = "mcts_splice"
    Config = MCTSSpliceConfig
    templates = (*REVISION_TEMPLATES, REVISION_PROMPT, *step_judge.TEMPLATES)
    config: MCTSSpliceConfig
    roles = (Role("first-error verifier", "names the first wrong step of a failed path", ("judge",),
                  by_design="Agent-R has the acting model find its own first error"),
             Role("revision writer", "writes the revision thought", (),
                  by_design="the revision is the agent's own thought, trained as its turn"))

    def __init__(self, config: MCTSSpliceConfig, llm: Any) -> None:
        super().__init__(config, llm)
        self._warned_fallbacks: set[str] = set()  # each kind of fallback is warned once per run

    def roles_in_use(self) -> list[Role]:
        used = {"first-error verifier": self.config.verifier == "llm", "revision writer": self.config.revision == "model"}
        return [r for r in super().roles_in_use() if used.get(r.name, True)]

    def tasks(self) -> Iterable[TaskSpec]:
        return [TaskSpec(id=t.id, instruction=t.instruction) for t in self.env_tasks().values()]

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        task = self.env_tasks()[spec.id]
        expand = self.policy(self.config.temperature)
        greedy = self.policy(self.config.rollout_temperature)
        result = TaskResult()
        try:
            tree = await MCTS(self.make_env, expand, self.config.search, rollout_policy=greedy).search(task)
        except Exception as exc:  # noqa: BLE001 - classified and quarantined; the run goes on
            stage, error = episode_failure(exc)
            result.fail(spec.id, stage, error, {"task": task.id})
            return result
        result.counts.update(tree.stats.as_counts())
        result.counts["mcts_nodes"] += len(tree.nodes)
        paths = complete_paths(tree)
        result.counts["mcts_paths"] += len(paths)
        written: dict[str, Trajectory] = {}

        def keep(traj: Trajectory) -> Trajectory:
            written.setdefault(traj.id, traj)
            return written[traj.id]

        matches = match_paths(paths, self.config.alpha, self.config.beta, self.config.max_pairs_per_task,
                              self.config.pairing)
        result.counts[f"pairing_{self.config.pairing}"] += len(matches)
        values: dict[str, asyncio.Future[list[float]]] = {}  # step values by the history they continue
        for good, bad, k in matches:
            g_traj = keep(self._trajectory(task, f"n{good.node}", good.steps, good, "path"))
            b_traj = keep(self._trajectory(task, f"n{bad.node}", bad.steps, bad, "path"))
            if self.config.trajectory_pairs:
                result.pairs.append(self._pair(task, g_traj, b_traj, k, "trajectory"))
            if self.config.step_pairs:
                pair = await self._step_pair(task, good, bad, k, values, result)
                if pair is not None:
                    chosen, rejected, details = pair
                    cs = keep(self._member(task, chosen, k))
                    rs = keep(self._member(task, rejected, k))
                    result.pairs.append(self._pair(task, cs, rs, k, "step", chosen_reward=details["chosen"]["value"],
                                                   rejected_reward=details["rejected"]["value"], step_values=details))
            spliced = await self._splice(task, good, bad, k, b_traj, result)
            keep(spliced)
        if self.config.keep_best_good:
            best = max((p for p in paths if p.reward >= self.config.alpha), key=lambda p: (p.reward, -p.node), default=None)
            if best is not None:
                keep(self._trajectory(task, f"n{best.node}", best.steps, best, "path"))
        result.trajectories.extend(written.values())
        result.counts["spliced"] += sum(1 for t in written.values() if t.details.get("role") == "spliced")
        return result

    def _fallback(self, result: TaskResult, what: str, instead: str) -> None:
        """Count a fallback from the configured way, and warn the first time this run takes it."""
        result.counts[f"fallback_{what}"] += 1
        if what not in self._warned_fallbacks:
            self._warned_fallbacks.add(what)
            log.warning("mcts_splice: %s: %s (counted as fallback_%s; each record says so in details.fallbacks)",
                        what.replace("_", " "), instead, what)

    async def _first_error(self, bad: SearchPath, k: int, b_traj: Trajectory) -> tuple[int, str, str]:
        """(error step index, reason, where it came from); falls back to the divergence point."""
        if self.config.verifier == "llm":
            index, reason = await step_judge.locate_first_error(self.model_for("first-error verifier"), bad.steps, k)
            if index is not None:
                return index, reason, "llm"
        elif self.config.verifier == "rules":
            labels = await step_rules.rule_labels(b_traj)
            index = step_rules.first_bad(labels, k)
            if index is not None:
                return index, labels[index].reason, "rules"
        return k, "this path diverged from the successful one here and failed.", "divergence"

    async def _revision(self, task: Task, steps: list[Step], error: int, node: int) -> tuple[str, str]:
        """(the revision thought, who wrote it: "model" or "template"). Either sees only what the agent saw: the
        request as the user made it and the wrong step, never the verifier's reason or the task's hidden parts."""
        if self.config.revision == "model":
            prompt = REVISION_PROMPT.format(task=step_judge.task_text(steps), step=step_judge.describe(steps[error]))
            text = (await self.llm.chat([{"role": "user", "content": prompt}], temperature=0.0))[0].text.strip()
            if text:
                return text, "model"
        return REVISION_TEMPLATES[int(hashlib.sha256(f"{task.id}/{node}".encode()).hexdigest(), 16)
                                  % len(REVISION_TEMPLATES)], "template"

    async def _splice(self, task: Task, good: SearchPath, bad: SearchPath, k: int,
                      b_traj: Trajectory, result: TaskResult) -> Trajectory:
        error, reason, source = await self._first_error(bad, k, b_traj)
        result.counts[f"first_error_{source}"] += 1
        fallbacks: dict[str, str] = {}
        if source != self.config.verifier:
            fallbacks["first_error"] = (f"the {self.config.verifier} verifier named no wrong step: the divergence point "
                                        "is the first error")
        revision, writer = await self._revision(task, bad.steps, error, bad.node)
        if writer != self.config.revision:
            fallbacks["revision"] = "the model's revision was empty: a template revision was spliced in"
        for what, instead in fallbacks.items():
            self._fallback(result, what, instead)
        steps, masked = splice(k, bad.steps, good.steps, error, revision)
        traj = self._trajectory(task, f"n{bad.node}+n{good.node}/spliced", steps, good, "spliced")
        revision_index = masked[-1] + 1
        traj.details["splice"] = {"prefix_len": k, "first_error": error, "error_source": source, "reason": reason,
                                  "masked": masked, "revision_index": revision_index, "bad_node": bad.node,
                                  "good_node": good.node, "pairing": self.config.pairing, "revision_writer": writer}
        if fallbacks:
            traj.details[FALLBACKS] = fallbacks
        continued = [i for i in range(revision_index + 1, len(steps)) if steps[i].kind in ACTION_KINDS]
        traj.details["rewrites"] = [
            Rewrite(steps=[revision_index], kind="written",
                    reason=f"the revision thought ({writer}), spliced in").model_dump(),
            Rewrite(steps=continued, kind="context",
                    reason=f"the good path's continuation, answered after step {k} of that path, here after the "
                           "masked failed segment and the revision").model_dump()]
        traj.provenance.parent_ids = [f"{self.name}/{task.id}/n{bad.node}", f"{self.name}/{task.id}/n{good.node}"]
        return traj

    def _trajectory(self, task: Task, key: str, steps: list[Step], path: SearchPath, role: str) -> Trajectory:
        evaluation = path.evaluation or Evaluation.of(path.reward, "search outcome")
        node = int(key.split("/")[0].split("+")[0][1:])
        return self.trajectory(task, f"/{key}", steps, evaluation, role=role, node=node)

    def _member(self, task: Task, path: SearchPath, k: int) -> Trajectory:
        """A step pair's side: the shared prefix + the path's action at `k`. It is no episode (its outcome is the
        whole path's), so it is marked a pair member only: per-record exports (SFT, KTO) leave it out, and the
        good path's prefix is not trained again as an extra copy."""
        traj = self._trajectory(task, f"n{path.node}/a{k}", path.steps[: k + 1], path, "step")
        traj.details[PAIR_ONLY] = True
        return traj

    def _pair(self, task: Task, chosen: Trajectory, rejected: Trajectory, k: int, level: Literal["trajectory", "step"],
              chosen_reward: float | None = None, rejected_reward: float | None = None, **details: Any) -> Pair:
        good, bad = chosen.details["node"], rejected.details["node"]
        return Pair(
            id=f"{self.name}/{task.id}/pair/n{good}-vs-n{bad}/{level}",
            chosen_id=chosen.id, rejected_id=rejected.id, prefix_len=k, source=self.name, level=level,
            chosen_reward=chosen.reward if chosen_reward is None else chosen_reward,
            rejected_reward=rejected.reward if rejected_reward is None else rejected_reward,
            provenance=self.provenance(task.id, parents=[chosen.id, rejected.id], seed=task.seed),
            details={"pairing": self.config.pairing, **details},
        )

    # ---- IPR: Monte Carlo step rewards ------------------------------------------------------------

    async def step_value(self, task: Task, history: list[Step]) -> list[float]:
        """IPR's step reward of the last action of `history`: the outcomes of `step_rewards.rollouts` independent
        rollouts (draw k samples every step with its own seed) from the state after it to the end of the episode."""
        cfg = self.config.step_rewards
        actions = sum(1 for s in history if s.kind in ACTION_KINDS)

        async def draw(k: int) -> float:
            async with self.make_env() as env:
                await env.replay(task, history)
                episode = await continue_episode(env, self.policy(cfg.temperature, draw=k), history,
                                                 max_steps=self.config.search.max_depth, actions_taken=actions,
                                                 max_parse_failures=self.config.max_parse_failures)
            return episode.reward

        return list(await asyncio.gather(*(draw(k) for k in range(cfg.rollouts))))

    async def _step_pair(self, task: Task, good: SearchPath, bad: SearchPath, k: int,
                         values: dict[str, asyncio.Future[list[float]]],
                         result: TaskResult) -> tuple[SearchPath, SearchPath, dict[str, Any]] | None:
        """The step-level pair at the paths' divergence `k`, by IPR's rule; None for a tie.

        IPR compares the agent's action at a step of the expert's trajectory with the expert's: each one's step
        reward is the mean outcome of Monte Carlo rollouts from the state after it, and a pair is made only when
        one side is better by both its path's final reward and its step reward, each by more than a threshold.
        Here the good path stands for the expert, the bad path's action at `k` for the agent's."""
        cfg = self.config.step_rewards
        estimates: list[list[float]] = []
        for path in (good, bad):
            history = through(path.steps, k)
            key = hashlib.sha256("\x00".join(s.model_dump_json(exclude=_NOT_CONTENT) for s in history).encode()).hexdigest()
            if key not in values:
                values[key] = asyncio.ensure_future(self.step_value(task, history))
                result.counts["ipr_rollouts"] += cfg.rollouts
            estimates.append(await values[key])
        expert, agent = ({"final_reward": p.reward, "rewards": r, "value": sum(r) / len(r)}
                         for p, r in zip((good, bad), estimates))
        winner = ipr_preference(expert["final_reward"], agent["final_reward"], expert["value"], agent["value"],
                                cfg.trajectory_threshold, cfg.step_threshold)
        if winner is None:
            result.counts["ipr_ties"] += 1
            return None
        result.counts["ipr_step_pairs"] += 1
        chosen, rejected = (good, bad) if winner == "expert" else (bad, good)
        details = {"method": "monte_carlo", "rollouts": cfg.rollouts, "temperature": cfg.temperature,
                   "thresholds": {"step": cfg.step_threshold, "trajectory": cfg.trajectory_threshold},
                   "expert": "chosen" if winner == "expert" else "rejected",
                   "chosen": expert if winner == "expert" else agent,
                   "rejected": agent if winner == "expert" else expert}
        return chosen, rejected, details
