"""STEVE step verification as a method: label every agent step of an input dataset good / bad.

Input: a dataset directory (`input`); one task per trajectory id; output: the same trajectories
(same ids, in the new dataset directory) with each agent step's `label` set and the reason in
`extra["judge_reason"]`. The labeler is the LLM step judge (`filters.step_judge`, on the judge
model), the rules (`filters.step_rules`), or both (`verifier: both`; `labels_from` picks whose
label is written, the other's goes to `extra["rule_label"]` / `extra["llm_label"]` with its reason).
Ground truth settles outcomes; policy is the rule check's and the judge's. Where a ground-truth label
(`replay`, `reference`, below) settles an outcome (an error; a write that matches the reference or moves
toward the goal state, or one that does not), it is written whatever `verifier` and `labels_from` say,
and the judge's goes to `extra["llm_label"]`. A read or a message that merely succeeded settles nothing
(a read before authentication succeeds too): there the judge's label (else the rules') is written. Above
both, the policy's rule check (`policy_check`, filters/policy_rules.py: the record's tau2 domain, else
none): a step that acts before authentication or writes without a confirmed yes is labelled bad
(`policy`), whatever ground truth and the judge say, so it never becomes a desirable KTO row. Each
labelled step says whose label it carries (`extra["judge"]`: `policy`, `replay`, `reference`, `llm` or
`rules`), and the trajectory counts them (`details["step_verify"]["label_sources"]`; run counts
`labels_from_<source>`). Where the judge gave no usable answer (unreachable after its retries, or never a
valid label: `llm.structured` gives up, ledgered) its steps fall back to the rules' label or stay unlabelled: each such step says so
(`extra["judge_error"]`, `extra["label_fallback"]`), the trajectory counts them
(`details["step_verify"]["judge_failed"]`) and the run summary prints the labels by source, fallbacks
included ("step labels by source").

The judge sees the rules the agent followed: `policy` from the config, else the trajectory's own
system turn, else the policy of the environment it recorded (`details.env`, rebuilt from its
config without starting it); `counts.policy_<source>` says which. On web trajectories it sees the
pages before and after each step (text, capped at `max_page_chars`) and, with `judge.vision`,
their screenshots (read from the input directory; fallbacks counted, see `filters.vision`).

The judge is measured against the rules wherever both label a step, by the source of the rule
labels: `replay` (retail world replays) and `reference` (tau2-style reference actions) are ground
truth; `tool_errors` is only a rule. With `verifier: llm`, `ground_truth` still computes the
ground-truth labels where a trajectory has them (`extra["truth_label"]`, `extra["truth_reason"]`)
to measure the judge. Per trajectory the agreement is in `details["step_verify"]`; over the run the
confusion cells are counted (`judge_<source>_<judge label>_<reference label>`), and accuracy,
Cohen's kappa and precision / recall of "bad" per source (plus `ground_truth`, replay and reference
together) are in the run summary's report (printed by `trajforge generate`) and in the manifest
(`step_verify`). Revision steps (thoughts spliced in by Agent-R) are left unlabeled.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import Field, model_validator

from envs.spec import check_env
from envs.tasks import TaskSourceConfig
from filters import step_judge, step_rules
from filters.policy_rules import PolicyCheck, violations_of
from filters.vision import PageImages
from generators.base import GenerationMethod, MethodConfig, Role, RunSummary, TaskResult, TaskSpec
from generators.registry import register_method
from generators.transcript import system_text
from schemas.models import Trajectory
from schemas.store import Dataset

log = logging.getLogger("trajforge.generators")

ACTION_KINDS = ("api", "code", "message")
SOURCES: tuple[step_rules.ReferenceSource, ...] = ("replay", "reference", "tool_errors")
LABELS_BY_SOURCE = "step labels by source"
# How the run summary names each measurement of the judge.
REPORT_NAMES = {"replay": "judge vs replay labels", "reference": "judge vs reference actions",
                "tool_errors": "judge vs tool-error rules", "ground_truth": "judge vs ground truth (all)"}


class StepVerifyConfig(MethodConfig):
    method: Literal["step_verify"] = "step_verify"
    input: str = Field(description="dataset directory of trajectories to label")
    verifier: Literal["llm", "rules", "both"] = Field("both", description="who labels: the LLM judge, the rules, or both")
    labels_from: Literal["llm", "rules"] = Field("llm", description="whose label is written when verifier = both, "
                                                                   "where no ground-truth label exists (it wins)")
    ground_truth: bool = Field(True, description="measure the judge against ground-truth labels (replay, reference "
                                                 "actions) where a trajectory has them, also with verifier = llm")
    read_only_tools: list[str] | None = Field(None, description="tools that only read, for reference-action labels "
                                                               "(default: tools named with a read verb: get_, find_, ...)")
    policy_check: PolicyCheck | None = Field(default_factory=PolicyCheck, description=(
        "the policy's rule check that labels violating steps bad (default: each record's tau2 domain's rules, none "
        "for other records; null: off)"))
    policy: str | None = Field(None, description="the rules the judged agents followed (default: each trajectory's "
                                                 "system turn, else its environment's policy)")
    max_page_chars: int = Field(step_judge.PAGE_CHARS, ge=200,
                                description="text of each web page before and after a judged step")
    # The world the input was recorded in, optional: `trajforge envs check --config` checks it, and its policy is
    # the judge's rules for trajectories that carry none of their own and record no environment.
    env: str | None = Field(None, description="the environment the input trajectories were recorded in")
    env_config: dict[str, Any] = Field(default_factory=dict, description="its settings")
    tasks: TaskSourceConfig | None = Field(None, description="its tasks, for `trajforge envs check --config`")

    @model_validator(mode="after")
    def _known_env(self) -> StepVerifyConfig:
        if self.env:
            check_env(self.env, self.env_config)
        return self


def agreement_report(counts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The judge's agreement per reference source, and over all ground truth, from run counts."""
    out: dict[str, dict[str, Any]] = {}
    truth: Counter[str] = Counter()
    for source in SOURCES:
        cells = {f"{a}_{b}": int(counts.get(f"judge_{source}_{a}_{b}", 0)) for a in ("good", "bad") for b in ("good", "bad")}
        if sum(cells.values()):
            out[source] = step_judge.agreement(cells)
            if source in step_rules.GROUND_TRUTH:
                truth.update(cells)
    if truth:
        out["ground_truth"] = step_judge.agreement(truth)
    return out


@register_method
class StepVerify(GenerationMethod):
    """STEVE: label each agent step good/bad with an LLM judge and/or rule verifiers (feeds KTO)."""

    name = "step_verify"
    Config = StepVerifyConfig
    templates = step_judge.TEMPLATES
    config: StepVerifyConfig
    roles = (Role("step judge", "labels every agent step good or bad", ("judge",)),)

    def roles_in_use(self) -> list[Role]:
        return list(self.roles) if self.config.verifier != "rules" else []

    def __init__(self, config: StepVerifyConfig, llm: Any):
        super().__init__(config, llm)
        self._input: dict[str, Trajectory] | None = None
        # Screenshot paths are relative to the dataset directory that recorded them: the input.
        self.images = PageImages(Path(config.input), config.judge.vision)
        self._env_policies: dict[str, str | None] = {}

    def inputs(self) -> dict[str, Trajectory]:
        if self._input is None:
            self._input = {t.id: t for t in Dataset.open(Path(self.config.input)).iter_records()}
        return self._input

    def tasks(self) -> Iterable[TaskSpec]:
        for tid in sorted(self.inputs()):
            yield TaskSpec(id=tid)

    def policy_of(self, traj: Trajectory) -> tuple[str | None, str]:
        """The rules the trajectory's agent followed, and where they come from (config, system, env, none)."""
        if self.config.policy:
            return self.config.policy, "config"
        own = system_text(traj.steps)
        if own:
            return own, "system"
        env = traj.details.get("env")
        if isinstance(env, dict) and isinstance(env.get("name"), str):
            policy = self._env_policy(env["name"], step_rules.env_config_of(traj))
            if policy:
                return policy, "env"
        if self.config.env:
            policy = self._env_policy(self.config.env, self.config.env_config)
            if policy:
                return policy, "env"
        return None, "none"

    def _env_policy(self, name: str, config: dict[str, Any]) -> str | None:
        """An environment's policy, read from an unstarted environment of the recorded config (cached)."""
        key = json.dumps([name, config], sort_keys=True, default=str)
        if key not in self._env_policies:
            from envs.registry import make_env

            try:
                self._env_policies[key] = make_env(name, **config).policy
            except Exception as exc:  # noqa: BLE001 - a world that cannot be rebuilt here: judged without its policy
                log.warning("step_verify: cannot read the policy of environment %r from its recorded config (%s); "
                            "its trajectories are judged without it (set policy: to give it)", name, exc)
                self._env_policies[key] = None
        return self._env_policies[key]

    async def _judge(self, traj: Trajectory, indices: list[int], result: TaskResult) -> dict[int, tuple[str, str]]:
        labels: dict[int, tuple[str, str]] = {}
        policy, source = self.policy_of(traj)
        result.counts[f"policy_{source}"] += 1
        judged = await step_judge.judge_trajectory(self.model_for("step judge"), traj.steps, indices, policy=policy,
                                                   images=self.images, counts=result.counts,
                                                   page_chars=self.config.max_page_chars)
        for i, j in judged.items():
            if j is None:
                result.counts["judge_failures"] += 1
                traj.steps[i].extra["judge_error"] = ("no usable answer from the judge (unreachable after its retries, or "
                                                      "never a valid label: see its failure ledger)")
            else:
                labels[i] = (j.label, j.reason)
        return labels

    async def run_task(self, task: TaskSpec) -> TaskResult:
        traj = self.inputs()[task.id].model_copy(deep=True)
        indices = [i for i, s in enumerate(traj.steps) if s.kind in ACTION_KINDS and not step_rules.is_revision(s)]
        result = TaskResult()
        verifier = self.config.verifier
        llm_labels = await self._judge(traj, indices, result) if verifier in ("llm", "both") else {}
        reference: step_rules.Labels | None = None
        if verifier != "llm" or self.config.ground_truth:
            found = await step_rules.labelled(traj, self.config.read_only_tools)
            if verifier != "llm" or found.ground_truth:
                reference = found
        rule_labels = {i: (r.label, r.reason) for i, r in reference.labels.items()} if reference and verifier != "llm" else {}
        # Ground truth (a replay of the world, reference actions) settles outcomes over a judge; the policy's rule
        # check wins over both.
        truth = ({i: (r.label, r.reason) for i, r in reference.labels.items() if r.outcome}
                 if reference is not None and reference.ground_truth else {})
        policy = self._policy_labels(traj, result)
        llm_first = verifier == "llm" or (verifier == "both" and self.config.labels_from == "llm")
        primary, other = (llm_labels, rule_labels) if llm_first else (rule_labels, llm_labels)
        primary_name, other_name = ("llm", "rules") if llm_first else ("rules", "llm")
        sources: Counter[str] = Counter()
        failed = 0
        for i in indices:
            step = traj.steps[i]
            judge_failed = "judge_error" in step.extra
            failed += judge_failed
            if i in policy:
                chosen, source = policy[i], "policy"
            elif i in truth:
                assert reference is not None
                chosen, source = truth[i], reference.source
            else:
                chosen, source = (primary[i], primary_name) if i in primary else (other.get(i), other_name)
            if judge_failed:  # what labelled the step instead of the judge, said on the step and counted
                step.extra["label_fallback"] = source if chosen is not None else "unlabeled"
                result.counts[f"judge_failed_labelled_by_{step.extra['label_fallback']}"] += 1
            if chosen is not None:
                step.label, step.extra["judge_reason"] = chosen[0], chosen[1]  # type: ignore[assignment]
                step.extra["judge"] = source
                sources[source] += 1
                result.counts[f"steps_{chosen[0]}"] += 1
                result.counts[f"labels_from_{source}"] += 1
            else:
                result.counts["steps_unlabeled"] += 1
            # The labels not written, kept beside the one that is.
            if i in llm_labels and source != "llm":
                step.extra["llm_label"], step.extra["llm_reason"] = llm_labels[i]
            if i in rule_labels and i not in truth and source != "rules":
                step.extra["rule_label"], step.extra["rule_reason"] = rule_labels[i]
            if verifier == "llm" and reference is not None and i in reference.labels:
                step.extra["truth_label"], step.extra["truth_reason"] = reference.labels[i].label, reference.labels[i].reason
        if llm_labels and reference is not None:
            cells = step_judge.confusion({i: v[0] for i, v in llm_labels.items()},
                                         {i: r.label for i, r in reference.labels.items()})
            result.counts.update({f"judge_{reference.source}_{k}": v for k, v in cells.items()})
            traj.details["step_verify"] = {"reference": reference.source, "ground_truth": reference.ground_truth,
                                           **step_judge.agreement(cells)}
        info = traj.details.setdefault("step_verify", {})
        info["label_sources"] = dict(sorted(sources.items()))
        if failed:
            info["judge_failed"] = failed
        traj.provenance.parent_ids = list(dict.fromkeys([*traj.provenance.parent_ids, traj.id]))
        result.trajectories.append(traj)
        return result

    def _policy_labels(self, traj: Trajectory, result: TaskResult) -> dict[int, tuple[str, str]]:
        """Bad labels for the steps that break the record's policy rules (none where it has none)."""
        check = self.config.policy_check
        rules = check.rules(traj.details.get("task")) if check is not None else None
        if rules is None:
            return {}
        result.counts["policy_checked"] += 1
        return {i: ("bad", f"policy: {rule}: {what}") for i, rule, what in violations_of(traj, rules)}

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        summary = await super().run(tasks, output, progress=progress)
        # The whole output, finished units from earlier runs included (the run may have resumed).
        counts = output.unit_counts()
        by_source = {k.removeprefix("labels_from_"): v for k, v in sorted(counts.items()) if k.startswith("labels_from_")}
        by_source.update({f"judge failed, then {k.removeprefix('judge_failed_labelled_by_')}": v
                          for k, v in sorted(counts.items()) if k.startswith("judge_failed_labelled_by_")})
        if counts.get("steps_unlabeled"):
            by_source["unlabeled"] = counts["steps_unlabeled"]
        if by_source:
            summary.report[LABELS_BY_SOURCE] = by_source
        report = agreement_report(counts)
        if report:
            summary.report.update({REPORT_NAMES[k]: v for k, v in report.items()})
            output.update_manifest(step_verify=report)
        return summary
