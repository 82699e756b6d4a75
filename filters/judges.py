"""LLM judges: outcome (AgentTrek style: thoughts + success) and quality (score 1-5 + reason).

Judges write their verdicts onto the record (`details["judge"][...]`, and `success` for the
outcome judge) before deciding, so kept records carry them too. A judge that gets no valid
answer raises JudgeFailed (the chain quarantines the record with stage "judge"), or, with
`on_failure: keep`, keeps the record flagged `details["judge"][kind] = {"error": ...}`.

A judge reads what the world showed: the record's steps without the agent's thoughts and raw answers
(`filters.world_view`), since an agent's account of its own success talks a judge into it;
`self_report: true` lets it read them too. Each verdict records what it read (`reads`) and whether the
judge is the model that generated the record (`same_model_as_generator`, from the record's
`provenance.model`; null when the record names none): a model grading its own output favours it, so
that case is warned about once per judge.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from filters.base import BaseFilter, Decision, JudgeFailed, drop, keep, register
from filters.text import render, task_text
from filters.world_view import judged_steps
from schemas.models import Trajectory

log = logging.getLogger("trajforge.filters")

OUTCOME_PROMPT = """You are evaluating whether an AI agent completed a task.

Task: {task}

Trajectory (actions and observations):
{transcript}

Think about whether the final state and the agent's final answer accomplish the task.
Answer as JSON: {{"thoughts": "<your reasoning>", "success": true|false}}"""

QUALITY_PROMPT = """Rate the quality of this AI agent trajectory as training data, from 1 (useless:
incoherent, wrong tool use, hallucinated results) to 5 (excellent: correct, efficient, well reasoned).

Task: {task}

Trajectory:
{transcript}

Answer as JSON: {{"score": <1-5>, "reason": "<one or two sentences>"}}"""


class OutcomeVerdict(BaseModel):
    thoughts: str
    success: bool


class QualityVerdict(BaseModel):
    score: int = Field(ge=1, le=5)
    reason: str


class _Judge(BaseFilter):
    kind: ClassVar[str] = "judge"
    verdict_key: ClassVar[str]

    def __init__(self, llm: dict[str, Any] | None = None, on_failure: str = "quarantine",
                 max_chars: int = 12_000, prompt: str | None = None, self_report: bool = False) -> None:
        from backends.config import LLMConfig

        if on_failure not in ("quarantine", "keep"):
            raise ValueError(f"on_failure must be quarantine or keep, not {on_failure!r}")
        self.llm_config = LLMConfig.from_yaml(llm or {})
        self.on_failure = on_failure
        self.max_chars = max_chars
        self.prompt = prompt
        self.self_report = self_report
        self._llm: Any = None
        self._warned_same_model = False

    def _client(self) -> Any:
        # Built lazily inside the running event loop: HTTP sessions belong to the loop that made them.
        if self._llm is None:
            from backends.registry import make_llm

            self._llm = make_llm(self.llm_config)
        return self._llm

    async def aclose(self) -> None:
        if self._llm is not None:
            await self._llm.aclose()
            self._llm = None

    def messages(self, record: Trajectory, template: str) -> list[dict[str, str]]:
        steps, _ = judged_steps(record.steps, self.self_report)
        text = (self.prompt or template).format(task=task_text(record) or "(not stated)",
                                               transcript=render(record.model_copy(update={"steps": steps}),
                                                                 self.max_chars))
        return [{"role": "user", "content": text}]

    def same_model_as_generator(self, record: Trajectory) -> bool | None:
        """Whether this judge's model made `record` (its `provenance.model`, `backend:model`); None: not recorded."""
        made = record.provenance.model if record.provenance is not None else None
        if not made:
            return None
        mine = f"{self.llm_config.backend}:{self.llm_config.model}"
        name = made.split(":", 1)[-1]
        # The same weights behind another client still grade their own output: a shared model name counts too.
        same = made == mine or (name == self.llm_config.model and name not in ("", "default", "None"))
        if same and not self._warned_same_model:
            self._warned_same_model = True
            log.warning("%s: the judge model %s generated the records it judges (e.g. %s): a model grading its own "
                        "output favours it; give the judge another model (llm: ...)", self.name, mine, record.id)
        return same

    def _annotated(self, record: Trajectory, verdict: dict[str, Any]) -> Trajectory:
        out = record.model_copy(deep=True)
        judge = dict(out.details.get("judge") or {})
        judge[self.verdict_key] = {**verdict, "model": self.llm_config.model,
                                   "same_model_as_generator": self.same_model_as_generator(record),
                                   "reads": judged_steps([], self.self_report)[1]}
        out.details = {**out.details, "judge": judge}
        return out

    def _failed(self, record: Trajectory) -> Decision:
        message = f"{self.name}: no valid answer from the LLM"
        if self.on_failure == "quarantine":
            raise JudgeFailed(message)
        return keep(self._annotated(record, {"error": message}))


@register("outcome_judge")
class OutcomeJudge(_Judge):
    """Judges task success; sets record.success. drop_failed: drop records judged unsuccessful."""

    verdict_key = "outcome"

    def __init__(self, drop_failed: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.drop_failed = drop_failed

    async def decide(self, record: Trajectory) -> Decision:
        verdict = await self._client().structured(self.messages(record, OUTCOME_PROMPT), OutcomeVerdict)
        if verdict is None:
            return self._failed(record)
        out = self._annotated(record, verdict.model_dump())
        out.success = verdict.success
        if self.drop_failed and not verdict.success:
            return drop(out, "judged unsuccessful", 0.0)
        return keep(out, 1.0 if verdict.success else 0.0)


@register("quality_judge")
class QualityJudge(_Judge):
    """Scores quality 1-5 with a reason; drops records scored below min_score."""

    verdict_key = "quality"

    def __init__(self, min_score: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_score = min_score

    async def decide(self, record: Trajectory) -> Decision:
        verdict = await self._client().structured(self.messages(record, QUALITY_PROMPT), QualityVerdict)
        if verdict is None:
            return self._failed(record)
        out = self._annotated(record, verdict.model_dump())
        if verdict.score < self.min_score:
            return drop(out, f"quality {verdict.score} < {self.min_score}", float(verdict.score))
        return keep(out, float(verdict.score))
