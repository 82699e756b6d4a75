"""STEVE step verification as a method: label every agent step of an input dataset good / bad.

Input: a dataset directory (`input`); one task per trajectory id; output: the same trajectories
(same ids, in the new dataset directory) with each agent step's `label` set and the reason in
`extra["judge_reason"]`. The labeler is the LLM step judge (`filters.step_judge`), the rule
verifiers (`filters.step_rules`), or both (`verifier: both`; `labels_from` picks whose label is
written, the other's goes to `extra["rule_label"]` / `extra["llm_label"]`). With both, their
agreement (rate and Cohen's kappa over steps both labeled) is in each trajectory's
`details["step_verify"]`, in the run summary counts (`judge_agreement`, `judge_kappa`, and the
confusion cells `llm_<label>_rules_<label>`) and in the output manifest (`step_verify`).
Revision steps (thoughts spliced in by Agent-R) are left unlabeled.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import Field

from filters import step_judge, step_rules
from generators.base import GenerationMethod, MethodConfig, RunSummary, TaskResult, TaskSpec
from generators.registry import register_method
from schemas.models import Trajectory
from schemas.store import Dataset

ACTION_KINDS = ("api", "code", "message")


class StepVerifyConfig(MethodConfig):
    method: Literal["step_verify"] = "step_verify"
    input: str = Field(description="dataset directory of trajectories to label")
    verifier: Literal["llm", "rules", "both"] = Field("both", description="who labels: the LLM judge, the rules, or both")
    labels_from: Literal["llm", "rules"] = Field("llm", description="whose label is written when judge = both")


def _cells(llm: dict[int, str], rules: dict[int, str]) -> Counter[str]:
    return Counter({f"llm_{k.replace('_', '_rules_', 1)}": v for k, v in step_judge.confusion(llm, rules).items()})


def agreement_from_counts(counts: dict[str, Any]) -> dict[str, Any]:
    cells = {f"{a}_{b}": counts.get(f"llm_{a}_rules_{b}", 0) for a in ("good", "bad") for b in ("good", "bad")}
    return step_judge.agreement(cells)


@register_method
class StepVerify(GenerationMethod):
    """STEVE: label each agent step good/bad with an LLM judge and/or rule verifiers (feeds KTO)."""

    name = "step_verify"
    Config = StepVerifyConfig
    templates = step_judge.TEMPLATES
    config: StepVerifyConfig

    def __init__(self, config: StepVerifyConfig, llm: Any):
        super().__init__(config, llm)
        self._input: dict[str, Trajectory] | None = None

    def inputs(self) -> dict[str, Trajectory]:
        if self._input is None:
            self._input = {t.id: t for t in Dataset.open(Path(self.config.input)).iter_records()}
        return self._input

    def tasks(self) -> Iterable[TaskSpec]:
        for tid in sorted(self.inputs()):
            yield TaskSpec(id=tid)

    async def run_task(self, task: TaskSpec) -> TaskResult:
        traj = self.inputs()[task.id].model_copy(deep=True)
        indices = [i for i, s in enumerate(traj.steps) if s.kind in ACTION_KINDS and not step_rules.is_revision(s)]
        result = TaskResult()
        llm_labels: dict[int, tuple[str, str]] = {}
        rule_labels: dict[int, tuple[str, str]] = {}
        if self.config.verifier in ("llm", "both"):
            judged = await step_judge.judge_trajectory(self.judge_llm, traj.steps, indices)
            for i, j in judged.items():
                if j is None:
                    result.counts["judge_failures"] += 1
                else:
                    llm_labels[i] = (j.label, j.reason)
        if self.config.verifier in ("rules", "both"):
            found = await step_rules.rule_labels(traj)
            rule_labels = {i: (r.label, r.reason) for i, r in found.items()}
        llm_first = self.config.verifier == "llm" or (self.config.verifier == "both" and self.config.labels_from == "llm")
        primary, other = (llm_labels, rule_labels) if llm_first else (rule_labels, llm_labels)
        primary_name, other_name = ("llm", "rule") if llm_first else ("rules", "llm")
        for i in indices:
            step = traj.steps[i]
            chosen = primary.get(i) or other.get(i)
            if chosen is not None:
                step.label, step.extra["judge_reason"] = chosen[0], chosen[1]  # type: ignore[assignment]
                step.extra["judge"] = primary_name if i in primary else other_name
                result.counts[f"steps_{chosen[0]}"] += 1
            else:
                result.counts["steps_unlabeled"] += 1
            if i in other and self.config.verifier == "both":
                step.extra[f"{other_name}_label"], step.extra[f"{other_name}_reason"] = other[i]
        if self.config.verifier == "both":
            cells = _cells({i: v[0] for i, v in llm_labels.items()}, {i: v[0] for i, v in rule_labels.items()})
            result.counts.update(cells)
            traj.details["step_verify"] = agreement_from_counts(cells)
        traj.provenance.parent_ids = list(dict.fromkeys([*traj.provenance.parent_ids, traj.id]))
        result.trajectories.append(traj)
        return result

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        summary = await super().run(tasks, output, progress=progress)
        if self.config.verifier == "both":
            # The whole output, finished units from earlier runs included (the run may have resumed).
            stats = agreement_from_counts(output.unit_counts())
            for key in ("agreement", "kappa"):
                if stats[key] is not None:
                    summary.counts[f"judge_{key}"] = stats[key]
            output.update_manifest(step_verify=stats)
        return summary
