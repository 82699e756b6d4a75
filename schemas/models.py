"""The interlingua as pydantic models: trajectories, preference pairs, quarantined inputs.

A trajectory follows the Agent Data Protocol (ADP): an id plus an ordered list of
agent actions (api / code / message) and observations (text / json / image / web),
extended with what training needs: tools, outcome reward, per-step labels and loss
masks, and provenance.
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from schemas.cut import FULL_OBSERVATIONS, full_texts

# 1.1: converted records' ids hash with xxh3-128 (1.0: sha256), and provenance names the version.
SCHEMA_VERSION = "1.1"

Origin = Literal["user", "agent", "environment"]
StepLabel = Literal["good", "bad", "unknown"]


def _as_utc(value: datetime) -> datetime:
    # Parquet stores UTC timestamps; normalise so records compare equal after a round trip.
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class BoundingBox(_Model):
    x: float
    y: float
    width: float
    height: float


class Annotation(_Model):
    """A labelled UI element on a screenshot."""

    text: str
    element_type: str
    bounding_box: BoundingBox


class ImageRef(_Model):
    """A reference to an image file (never the pixels), with optional UI annotations."""

    path: str
    source: Origin = "environment"
    annotations: list[Annotation] | None = None


def _as_float32(values: list[float] | None) -> list[float] | None:
    # Parquet keeps logprobs as float32 (half the bytes, and what engines compute them in); rounding
    # here makes a record equal to itself after a round trip.
    if values is None:
        return None
    return list(struct.unpack(f"{len(values)}f", struct.pack(f"{len(values)}f", *values)))


class Tokens(_Model):
    """The token truth of a model call: the ids the model was fed and produced, as its backend reported
    them (never a re-tokenization of the text), so a trainer trains exactly those tokens.

    `logprobs` has one entry per completion id (the model's own distribution, before sampling
    settings), or is None where the backend gave none. `tokenizer` names the tokenizer (a model
    path or served model name); `chat_template` is the sha256 (16 hex digits) of the chat template
    that rendered the prompt, None where the server applied its own unseen one.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: Annotated[list[float] | None, AfterValidator(_as_float32)] = None
    tokenizer: str | None = None
    chat_template: str | None = None

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> "Tokens":
        if self.logprobs is not None and len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"tokens: {len(self.logprobs)} logprobs for {len(self.completion_ids)} completion ids")
        return self


class Usage(_Model):
    """What the model call that made a step used: tokens, time, retries, cost.

    Tokens and cost count every attempt of the call (retried ones too: they were paid for);
    `latency_s` is the time the model took to answer over those attempts (not time spent queued
    or backing off). `cost_usd` is None when no price is configured for a remote model (unknown,
    never 0), 0.0 for a local one. A `cached` answer was served from the response cache: it
    cost nothing this time (`cost_usd` 0.0, `latency_s` 0.0, `retries` 0), its tokens are the
    answer's own.
    """

    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    retries: int = 0
    cost_usd: float | None = None
    cached: bool = False
    # The call's token ids and logprobs where the backend gives them (`llm.token_ids`); None otherwise.
    tokens: Tokens | None = None


class _Step(_Model):
    """Fields every step carries, whatever its kind."""

    tool_call_id: str | None = None
    reward: float | None = None
    # Per-step label from step verification; feeds KTO.
    label: StepLabel = "unknown"
    # Loss mask: False keeps the step as context but trains nothing on it.
    train: bool = True
    # Free-form extras that have no field (kept so converters stay lossless).
    extra: dict[str, Any] = Field(default_factory=dict)
    # Set on steps a model call made (actions, and the raw text of an answer that could not be used).
    usage: Usage | None = None


class _Action(_Step):
    # The short thought that precedes the action (ADP `description`).
    thought: str | None = None
    # Long hidden chain of thought, e.g. a <think> block (ADP `reasoning_content`).
    reasoning: str | None = None


class ApiAction(_Action):
    """A function / tool call with keyword arguments."""

    kind: Literal["api"] = "api"
    function: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class CodeAction(_Action):
    """Code the agent runs in some language."""

    kind: Literal["code"] = "code"
    language: str
    content: str


class MessageAction(_Action):
    """Text the agent sends to the user (a final answer, a question)."""

    kind: Literal["message"] = "message"
    content: str


class TextObservation(_Step):
    """Text the agent receives: a user turn, tool output, terminal output, system text."""

    kind: Literal["text"] = "text"
    content: str
    source: Origin
    name: str | None = None
    # The whole texts of fields an environment cut (schemas/cut.py), in memory only: never serialized.
    _full_texts: dict[str, str] | None = PrivateAttr(default=None)


class JsonObservation(_Step):
    """Structured tool output."""

    kind: Literal["json"] = "json"
    content: Any
    source: Origin = "environment"
    name: str | None = None


class ImageObservation(_Step):
    """An image the agent receives (a screenshot, a photo)."""

    kind: Literal["image"] = "image"
    image: ImageRef


class WebObservation(_Step):
    """A web page state: url, html and/or accessibility tree, optional screenshot."""

    kind: Literal["web"] = "web"
    url: str | None = None
    html: str | None = None
    axtree: str | None = None
    screenshot: ImageRef | None = None
    viewport: tuple[int, int] | None = None
    # The whole texts of fields an environment cut (schemas/cut.py), in memory only: never serialized.
    _full_texts: dict[str, str] | None = PrivateAttr(default=None)


Action = Union[ApiAction, CodeAction, MessageAction]
Observation = Union[TextObservation, JsonObservation, ImageObservation, WebObservation]
Step = Annotated[
    Union[ApiAction, CodeAction, MessageAction, TextObservation, JsonObservation, ImageObservation, WebObservation],
    Field(discriminator="kind"),
]
ACTION_KINDS = frozenset({"api", "code", "message"})
OBSERVATION_KINDS = frozenset({"text", "json", "image", "web"})


class Tool(_Model):
    """A tool the agent may call: name, description, JSON Schema of its parameters."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Provenance(_Model):
    """Where a record came from: a source dataset or a generation method, and how."""

    method: str | None = None
    source_dataset: str | None = None
    # The record's id upstream (ids there need not be unique; ours are).
    source_id: str | None = None
    # The format the record was read from, e.g. "adp-0" or "adp-1.3.0"; lets writers
    # reproduce the original layout.
    source_format: str | None = None
    model: str | None = None
    prompt_template_hash: str | None = None
    seed: int | None = None
    task_id: str | None = None
    parent_ids: list[str] = Field(default_factory=list)
    trajforge_version: str | None = None
    created_at: UtcDatetime | None = None
    # The interlingua version the record was made under (its id scheme among other rules).
    schema_version: str | None = SCHEMA_VERSION
    # The split of the task's benchmark (e.g. tau2's train / test) a generated record ran: no training
    # on test tasks by accident.
    task_split: str | None = None


class Trajectory(_Model):
    """One agent trajectory: ordered actions and observations plus training metadata."""

    id: str = Field(min_length=1)
    source: str = Field(min_length=1, description="Dataset or generation method the record comes from.")
    steps: list[Step] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)
    reward: float | None = None
    success: bool | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    details: dict[str, Any] = Field(default_factory=dict)

    # Observations an environment cut (schemas/cut.py) bring their whole texts along: the trajectory
    # keeps each once, in `details["full_observations"]` (sha256 -> text), whoever builds it.
    @model_validator(mode="after")
    def _keep_whole_observations(self) -> "Trajectory":
        if whole := full_texts(self.steps):
            self.details = {**self.details, FULL_OBSERVATIONS: {**self.details.get(FULL_OBSERVATIONS, {}), **whole}}
        return self


class Pair(_Model):
    """A preference pair: two trajectories that share their first `prefix_len` steps."""

    id: str = Field(min_length=1)
    chosen_id: str = Field(min_length=1)
    rejected_id: str = Field(min_length=1)
    prefix_len: int = Field(ge=0, description="Number of leading steps both trajectories share.")
    source: str = Field(min_length=1)
    # "trajectory" for whole-continuation pairs, "step" for single-step pairs.
    level: Literal["trajectory", "step"] = "trajectory"
    chosen_reward: float | None = None
    rejected_reward: float | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    details: dict[str, Any] = Field(default_factory=dict)


class Quarantined(_Model):
    """An input that could not be parsed, converted or validated, kept with the reason."""

    id: str = Field(min_length=1)
    stage: str
    error: str
    raw: str = Field(description="The raw input as a JSON string (or its repr when not JSON).")
    location: str | None = Field(default=None, description="Input file and line / row / key.")
    created_at: UtcDatetime | None = None


class FilterDecision(_Model):
    """Why a filter dropped a record."""

    filter: str
    reason: str
    score: float | None = None


class Filtered(_Model):
    """A trajectory a filter dropped, kept with the decision so nothing vanishes."""

    record: Trajectory
    decision: FilterDecision


# ---- what the acting model saw ---------------------------------------------------------------------

# The name of the step that holds the system prompt the acting model received (the first step of a
# generated trajectory; exporters hoist it into the system message).
SYSTEM_STEP = "system"


class RenderSettings(BaseModel):
    """How the acting model's requests were rendered from its trajectory, kept in `details["render"]`.

    With the trajectory's steps they determine each request exactly (`converters.export.request`):
    the request for the action at step k is the render of steps[:k] with these settings.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "tools": native function calling (tool messages, `tool_calls`); "text": tool calls written as
    # `<tool_call>` blocks in the text, tool results as user turns starting "TOOL: ".
    tool_format: Literal["tools", "text"] = "tools"
    # Page text (accessibility tree or html) is cut to this many characters (0: not cut).
    web_max_chars: int = Field(12_000, ge=0)
    # The history window: the task and the most recent messages that fit in this many characters of
    # content (None: the whole history).
    history_chars: int | None = Field(12_000, ge=1)
    # Whether earlier turns' reasoning is sent again.
    reasoning: bool = False

    @classmethod
    def of(cls, details: dict[str, Any]) -> RenderSettings | None:
        """The settings a record's details carry, or None (a record that does not say: converted data)."""
        raw = details.get("render")
        return cls.model_validate(raw) if isinstance(raw, dict) else None


class Rewrite(_Model):
    """Steps of a record that no request of its acting model produced as recorded, kept in `details["rewrites"]`.

    - `written`: someone else wrote these steps (a teacher's correction, a template's revision
      thought, a whole synthesised transcript): no request of the acting model answered them.
    - `context`: the acting model answered these steps, but to a request that differs from the
      record's prefix before them (the record changed what came before: a relabelled instruction,
      a spliced-in failed segment).
    """

    steps: list[int]
    kind: Literal["written", "context"]
    reason: str = Field(min_length=1)


def rewrites(details: dict[str, Any]) -> list[Rewrite]:
    return [Rewrite.model_validate(r) for r in details.get("rewrites") or []]


def rewritten_steps(details: dict[str, Any]) -> set[int]:
    """Every step index a record declares rewritten (of either kind)."""
    return {i for r in rewrites(details) for i in r.steps}


def system_step(content: str) -> TextObservation:
    """The step that records the system prompt an acting model received."""
    return TextObservation(content=content, source="environment", name=SYSTEM_STEP, train=False)


def is_system_step(step: Any) -> bool:
    return getattr(step, "kind", None) == "text" and getattr(step, "name", None) == SYSTEM_STEP


def task_text(steps: Any) -> str | None:
    """The task: the first user text of a trajectory (or of its steps), after any system step; None without one."""
    for step in getattr(steps, "steps", steps):
        if step.kind == "text" and step.source == "user" and step.name != SYSTEM_STEP:
            return step.content
    return None
