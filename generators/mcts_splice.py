"""Agent-R reflection splicing: MCTS trees -> spliced revision trajectories + preference pairs.

Per environment task: search a tree (`generators.mcts`), read every node's complete path (its
history plus its greedy rollout; content-identical paths count once), split them into good
(outcome >= alpha) and bad (below alpha), and match each bad path with the good path that
shares its longest prefix (outcome gap >= beta). Each match gives:

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
  trajectories are written too (unique ids), so the DPO exporter can join them.

Works on every environment: worlds that snapshot branch from copies, the others (MCP servers,
browsers) by replaying a node's history in a fresh episode (`mcts_replays` counts them). Every
path's outcome is the environment's own evaluation at its end (goal state, task criteria, an LLM
judge). Generated trajectories carry `details["task"]` / `details["env_config"]`, which the step
verification rules use to replay them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from pydantic import Field

from envs.base import ACTION_KINDS, MASKED_CONTEXT, Evaluation, Task
from filters import step_judge, step_rules
from generators._episode import renumber_calls
from generators.base import Role, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.failures import episode_failure
from generators.mcts import MCTS, SearchConfig, Tree
from generators.registry import register_method
from schemas.models import MessageAction, Pair, Rewrite, Step, Trajectory

REVISION_TEMPLATES = (
    "I realize my previous action was wrong: {reason} Let me go back and take a better approach.",
    "Wait, that step was a mistake: {reason} I should correct course from before it.",
    "Looking back, my last steps did not move the task forward: {reason} Let me try a different action.",
    "I made an error here: {reason} I will revise my plan and continue correctly.",
)
REVISION_PROMPT = (
    "You are an agent that just noticed a mistake. Task:\n{task}\n\nThe wrong step:\n{step}\n\nWhy it was wrong: "
    "{reason}\n\nWrite one or two sentences, in the first person, in which you notice the mistake and decide to "
    "correct it. Do not call tools."
)


class MCTSSpliceConfig(EnvMethodConfig):
    method: Literal["mcts_splice"] = "mcts_splice"
    search: SearchConfig = Field(default_factory=SearchConfig)
    temperature: float = Field(1.0, description="sampling temperature of expansions")
    rollout_temperature: float = Field(0.0, description="greedy rollouts")
    alpha: float = Field(0.5, description="a path is good when its outcome >= alpha")
    beta: float = Field(0.2, ge=0, description="good.outcome - bad.outcome must be >= beta")
    max_pairs_per_task: int = Field(4, ge=0)
    verifier: Literal["llm", "rules", "divergence"] = "llm"
    revision: Literal["template", "model"] = "template"
    trajectory_pairs: bool = True
    step_pairs: bool = True
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


def match_paths(paths: list[SearchPath], alpha: float, beta: float, limit: int) -> list[tuple[SearchPath, SearchPath, int]]:
    """(good, bad, prefix_len): each bad path with the good path sharing its longest prefix."""
    good = [p for p in paths if p.reward >= alpha]
    out = []
    for bad in (p for p in paths if p.reward < alpha):
        options = [(shared_prefix(g.steps, bad.steps), g) for g in good if g.reward - bad.reward >= beta]
        options = [(k, g) for k, g in options if k > 0]
        if not options:
            continue
        k, g = max(options, key=lambda o: (o[0], o[1].reward, -o[1].node))
        out.append((g, bad, k))
        if len(out) >= limit:
            break
    return out


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

        matches = match_paths(paths, self.config.alpha, self.config.beta, self.config.max_pairs_per_task)
        for good, bad, k in matches:
            g_traj = keep(self._trajectory(task, f"n{good.node}", good.steps, good, "path"))
            b_traj = keep(self._trajectory(task, f"n{bad.node}", bad.steps, bad, "path"))
            if self.config.trajectory_pairs:
                result.pairs.append(self._pair(task, g_traj, b_traj, k, "trajectory"))
            if self.config.step_pairs:
                gs = keep(self._trajectory(task, f"n{good.node}/a{k}", good.steps[: k + 1], good, "step"))
                bs = keep(self._trajectory(task, f"n{bad.node}/a{k}", bad.steps[: k + 1], bad, "step"))
                result.pairs.append(self._pair(task, gs, bs, k, "step"))
            spliced = await self._splice(task, good, bad, k, b_traj, result)
            keep(spliced)
        if self.config.keep_best_good:
            best = max((p for p in paths if p.reward >= self.config.alpha), key=lambda p: (p.reward, -p.node), default=None)
            if best is not None:
                keep(self._trajectory(task, f"n{best.node}", best.steps, best, "path"))
        result.trajectories.extend(written.values())
        result.counts["spliced"] += sum(1 for t in written.values() if t.details.get("role") == "spliced")
        return result

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

    async def _revision(self, task: Task, step: Step, reason: str, node: int) -> str:
        reason = reason.strip().rstrip(".") + "." if reason.strip() else "it did not help the task."
        if self.config.revision == "model":
            prompt = REVISION_PROMPT.format(task=task.instruction, step=step_judge.describe(step), reason=reason)
            text = (await self.llm.chat([{"role": "user", "content": prompt}], temperature=0.0))[0].text.strip()
            if text:
                return text
        template = REVISION_TEMPLATES[int(hashlib.sha256(f"{task.id}/{node}".encode()).hexdigest(), 16) % len(REVISION_TEMPLATES)]
        return template.format(reason=reason)

    async def _splice(self, task: Task, good: SearchPath, bad: SearchPath, k: int,
                      b_traj: Trajectory, result: TaskResult) -> Trajectory:
        error, reason, source = await self._first_error(bad, k, b_traj)
        result.counts[f"first_error_{source}"] += 1
        revision = await self._revision(task, bad.steps[error], reason, bad.node)
        steps, masked = splice(k, bad.steps, good.steps, error, revision)
        traj = self._trajectory(task, f"n{bad.node}+n{good.node}/spliced", steps, good, "spliced")
        revision_index = masked[-1] + 1
        traj.details["splice"] = {"prefix_len": k, "first_error": error, "error_source": source, "reason": reason,
                                  "masked": masked, "revision_index": revision_index, "bad_node": bad.node,
                                  "good_node": good.node}
        continued = [i for i in range(revision_index + 1, len(steps)) if steps[i].kind in ACTION_KINDS]
        traj.details["rewrites"] = [
            Rewrite(steps=[revision_index], kind="written",
                    reason=f"the revision thought ({self.config.revision}), spliced in").model_dump(),
            Rewrite(steps=continued, kind="context",
                    reason=f"the good path's continuation, answered after step {k} of that path, here after the "
                           "masked failed segment and the revision").model_dump()]
        traj.provenance.parent_ids = [f"{self.name}/{task.id}/n{bad.node}", f"{self.name}/{task.id}/n{good.node}"]
        return traj

    def _trajectory(self, task: Task, key: str, steps: list[Step], path: SearchPath, role: str) -> Trajectory:
        evaluation = path.evaluation or Evaluation.of(path.reward, "search outcome")
        node = int(key.split("/")[0].split("+")[0][1:])
        return self.trajectory(task, f"/{key}", steps, evaluation, role=role, node=node)

    def _pair(self, task: Task, chosen: Trajectory, rejected: Trajectory, k: int, level: Literal["trajectory", "step"]) -> Pair:
        good, bad = chosen.details["node"], rejected.details["node"]
        return Pair(
            id=f"{self.name}/{task.id}/pair/n{good}-vs-n{bad}/{level}",
            chosen_id=chosen.id, rejected_id=rejected.id, prefix_len=k, source=self.name, level=level,
            chosen_reward=chosen.reward, rejected_reward=rejected.reward,
            provenance=self.provenance(task.id, parents=[chosen.id, rejected.id], seed=task.seed),
        )
