"""The exporter's input: stored trajectories and pairs read column-wise, a batch at a time.

A `Batch` wraps one Arrow batch of trajectory rows: it renders all of them at once (per render
options, on first use), computes their tools once per distinct tool list, and hands out
`Record`s, one trajectory each as the per-record formats see it (id, source, success, its steps'
labels and masks, its tools and its rendered `Conversation`).

A record that says how its acting model's prompts were rendered (`details["render"]`, generated
trajectories) renders with those settings' page limit and tool format whatever the export's
options say, and its tools are the tools as sent: the declared ones (none in the text tool
format, where the system prompt lists them), not extended by functions it called. Nothing is validated into model
objects on the way: the store validated every record when it was written and checks each
shard's schema when it is read. `Record.of(trajectory)` takes the path a stored trajectory takes
(its Arrow row), so a model object exports exactly as it would from a dataset directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import orjson

from converters.export.render import ACTION_KINDS, KINDS, Conversation, RenderOptions, Rendered, render_batch
from converters.export.request import render_options
from converters.export.tools import specs_of, tool_keys, tools_columns
from schemas.arrow import PAIR_SCHEMA, TRAJECTORY_SCHEMA, pair_to_row, trajectory_to_row
from schemas.models import RenderSettings, rewritten_steps

_KINDS = pa.array(KINDS)
_ORIGINS = pa.array(["user", "agent", "environment"])
_LABELS = pa.array(["good", "bad", "unknown"])
# The trajectory columns the exporter reads (details: for the card's per-environment counts).
COLUMNS = ["id", "source", "success", "reward", "steps", "tools", "provenance", "details"]
# Why an episode kept marked (`user.fidelity.on_broken: mark`) gives no row: its agent answered a user that
# does not exist (eval leaves such episodes out for the same reason).
SPOILED = "the simulated user broke the episode (details.user_fidelity)"
# A record that exists only as one side of a preference pair (a step pair's prefix + one action): it is no
# episode, so per-record formats leave it out; its pair trains it.
PAIR_ONLY = "pair_only"
PAIR_MEMBER = "a pair member only (details.pair_only): trained through its pair"


def trains_records(fmt: Any) -> bool:
    """Whether a format trains on each record by itself (SFT, KTO): those leave pair-only records out; an
    interchange format (ATIF) keeps every record."""
    return bool(fmt.supervised) or fmt.name == "trl-kto"


# Where a method fell back from what its paper does (e.g. no first error named: the divergence point), the record
# says so in `details["fallbacks"]` ({what: what was used instead}); the card counts them.
FALLBACKS = "fallbacks"


@dataclass
class Record:
    batch: "Batch"
    index: int  # row in the batch

    @property
    def id(self) -> str:
        return self.batch.py("id")[self.index]

    @property
    def source(self) -> str:
        return self.batch.py("source")[self.index]

    @property
    def success(self) -> bool | None:
        return self.batch.py("success")[self.index]

    def __len__(self) -> int:
        return int(self.batch.lengths[self.index])

    @property
    def settings(self) -> RenderSettings | None:
        """How its acting model's prompts were rendered (None: the record does not say)."""
        return self.batch.settings[self.index]

    def render(self, opts: RenderOptions) -> Conversation:
        """The whole trajectory, rendered with `opts` (the recorded page limit and tool format win)."""
        return self.batch.rendered(self.batch.options(opts, self.index)).conversation(self.index)

    def render_request(self) -> Conversation:
        """The whole trajectory rendered as its acting model's requests were (needs `settings`)."""
        assert self.settings is not None
        return self.batch.rendered(render_options(self.settings)).conversation(self.index)

    def rewritten(self) -> set[int]:
        """The steps the record declares rewritten (`details["rewrites"]`)."""
        return self.batch.rewritten[self.index]

    def step(self, field: str, j: int) -> Any:
        """Field `kind`, `label`, `train` (None: the default, true) or `source` of step j."""
        return self.batch.step_values(field)[int(self.batch.offsets[self.index]) + j]

    def tokens(self, j: int) -> dict[str, Any] | None:
        """The token truth of the model call that made step j (`usage.tokens`: ids, logprobs, tokenizer), or None."""
        column = self.batch.step_tokens
        return None if column is None else column[int(self.batch.offsets[self.index]) + j].as_py()

    @property
    def reward(self) -> float | None:
        return self.batch.py("reward")[self.index]

    def has_masked_assistant_step(self) -> bool:
        """Whether a step that renders as an assistant message is loss-masked (`train = false`)."""
        return bool(self.batch.masked_assistant[self.index])

    def function_specs(self) -> list[dict[str, Any]]:
        """`[{"name", "description"?, "parameters"}]`: declared tools, then undeclared called functions (none
        for a record whose tools count as sent; nothing for one in the text tool format)."""
        if self.batch.text_format[self.index]:
            return []
        return specs_of(self.batch.tool_key(self.index))[0]

    def openai_tools(self) -> list[dict[str, Any]]:
        """`[{"type": "function", "function": spec}]` — OpenAI and HF chat templates (`tools=`)."""
        return [{"type": "function", "function": spec} for spec in self.function_specs()]

    def tools_json(self) -> str | None:
        """`openai_tools` as JSON text (TRL's trainers `json.loads` a string `tools` column); None without tools."""
        return self.batch.py("tools_json")[self.index]

    def specs_json(self) -> str | None:
        """`function_specs` as JSON text (LLaMA-Factory's `tools` column); None without tools."""
        return self.batch.py("specs_json")[self.index]

    @classmethod
    def of(cls, trajectory: Any) -> "Record":
        """A model object (`schemas.models.Trajectory`) as the exporter reads it from a shard."""
        table = pa.Table.from_pylist([trajectory_to_row(trajectory)], schema=TRAJECTORY_SCHEMA)
        record = Batch(table.to_struct_array().combine_chunks()).records[0]
        assert record is not None
        return record


class Batch:
    """A batch of trajectory rows (some may be null: a pair's missing trajectory)."""

    def __init__(self, trajectories: pa.StructArray | pa.RecordBatch | pa.ChunkedArray) -> None:
        if isinstance(trajectories, pa.RecordBatch):
            trajectories = trajectories.to_struct_array()
        if isinstance(trajectories, pa.ChunkedArray):
            trajectories = trajectories.combine_chunks()
        self.rows = trajectories
        self.steps = trajectories.field("steps")
        raw = self.steps.offsets.to_numpy()
        self.offsets = (raw - raw[0]).astype(np.int64)
        self.values = self.steps.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
        self.lengths = np.diff(self.offsets)
        self.valid = trajectories.is_valid().to_numpy(zero_copy_only=False) & \
            trajectories.field("id").is_valid().to_numpy(zero_copy_only=False)
        self._rendered: dict[RenderOptions, Rendered] = {}
        self._py: dict[str, list[Any]] = {}
        self._steps_py: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    @cached_property
    def owner(self) -> np.ndarray:
        """The trajectory of each step."""
        return np.repeat(np.arange(len(self)), self.lengths)

    @cached_property
    def records(self) -> list[Record | None]:
        return [Record(self, r) if self.valid[r] else None for r in range(len(self))]

    @cached_property
    def masked_assistant(self) -> np.ndarray:
        """Per trajectory: does a step that renders as an assistant message have `train = false`?"""
        kinds = self.values.field("kind")
        agent = pc.and_(pc.equal(kinds, "text"), pc.equal(self.values.field("source"), "agent"))
        assistant = pc.or_(pc.is_in(kinds, pa.array(sorted(ACTION_KINDS))), pc.fill_null(agent, False))
        masked = pc.and_(pc.invert(pc.fill_null(self.values.field("train"), True)), assistant)
        return np.bincount(self.owner[masked.to_numpy(zero_copy_only=False)], minlength=len(self)) > 0

    @cached_property
    def step_tokens(self) -> pa.Array | None:
        """Per step, its model call's `usage.tokens` (null where none); None when the batch has none at all
        (shards written before the field existed, or by a backend that gave no ids)."""
        usage = self.values.type.get_field_index("usage")
        if usage < 0 or self.values.type.field(usage).type.get_field_index("tokens") < 0:
            return None
        column = pc.struct_field(self.values, ["usage", "tokens"])
        return column if column.null_count < len(column) else None

    @cached_property
    def _details(self) -> list[dict[str, Any] | None]:
        """The details of records that carry render settings or rewrites (others: None, never parsed)."""
        if "details" not in self.rows.type.names:
            return [None] * len(self)
        column = self.rows.field("details")
        wanted = pc.fill_null(pc.or_(pc.match_substring(column, '"render"'), pc.match_substring(column, '"rewrites"')),
                              False).to_numpy(zero_copy_only=False)
        out: list[dict[str, Any] | None] = [None] * len(self)
        rows = np.flatnonzero(wanted & self.valid)
        for r, text in zip(rows.tolist(), column.take(pa.array(rows)).to_pylist()):
            out[r] = orjson.loads(text)
        return out

    @cached_property
    def spoiled_by_user(self) -> np.ndarray:
        """Per record, whether the check of its simulated user found a broken turn (`details.user_fidelity.ok`
        false: the episode was kept marked, `on_broken: mark`); only details that mention it are parsed."""
        out = np.zeros(len(self), dtype=bool)
        for r, fidelity in self._details_key("user_fidelity"):
            out[r] = isinstance(fidelity, dict) and fidelity.get("ok") is False
        return out

    def _details_key(self, key: str) -> list[tuple[int, Any]]:
        """(row, details[key]) of the valid records whose details mention `key`: only those are parsed, the rest
        of the column is matched as bytes."""
        if "details" not in self.rows.type.names:
            return []
        column = self.rows.field("details")
        rows = np.flatnonzero(pc.fill_null(pc.match_substring(column, f'"{key}"'), False)
                              .to_numpy(zero_copy_only=False) & self.valid)
        return [(r, orjson.loads(text).get(key))
                for r, text in zip(rows.tolist(), column.take(pa.array(rows)).to_pylist())]

    @cached_property
    def pair_only(self) -> np.ndarray:
        """Per record, whether it is only a member of a preference pair (`details.pair_only` set)."""
        out = np.zeros(len(self), dtype=bool)
        for r, value in self._details_key(PAIR_ONLY):
            out[r] = bool(value)
        return out

    @cached_property
    def fallbacks(self) -> list[dict[str, str]]:
        """Per record, the fallbacks its method took (`details.fallbacks`: what -> what was used instead), for the
        card's counts; only details that mention them are parsed."""
        out: list[dict[str, str]] = [{} for _ in range(len(self))]
        for r, found in self._details_key(FALLBACKS):
            out[r] = {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
        return out

    @cached_property
    def settings(self) -> list[RenderSettings | None]:
        """Per record, its recorded render settings (`details["render"]`), or None."""
        return [RenderSettings.of(d) if d is not None else None for d in self._details]

    @cached_property
    def rewritten(self) -> list[set[int]]:
        return [rewritten_steps(d) if d is not None else set() for d in self._details]

    def options(self, opts: RenderOptions, r: int) -> RenderOptions:
        """The render options of record r under the export's `opts`: its recorded page limit and tool format win."""
        settings = self.settings[r]
        if settings is None:
            return opts
        return render_options(settings, reasoning=opts.reasoning)

    @cached_property
    def as_sent(self) -> np.ndarray:
        """Per record: do its tools count as sent (recorded settings), not extended by called functions?"""
        return np.array([s is not None for s in self.settings], dtype=bool)

    @cached_property
    def text_format(self) -> np.ndarray:
        """Per record: were its tools listed in the system prompt (the text tool format), not sent apart?"""
        return np.array([s is not None and s.tool_format == "text" for s in self.settings], dtype=bool)

    @cached_property
    def tool_keys(self) -> pa.DictionaryArray:
        return tool_keys(self.rows.field("tools"), self.values, self.owner, len(self), self.as_sent)

    @cached_property
    def _tools(self) -> tuple[pa.Array, pa.Array]:
        openai, specs = tools_columns(self.tool_keys)
        if self.text_format.any():
            none = pa.array(self.text_format)
            openai = pc.if_else(none, pa.scalar(None, pa.string()), openai)
            specs = pc.if_else(none, pa.scalar(None, pa.string()), specs)
        return openai, specs

    def tool_key(self, r: int) -> str:
        if "tool_keys" not in self._py:
            self._py["tool_keys"] = self.tool_keys.dictionary.to_pylist()
            self._py["tool_key_index"] = self.tool_keys.indices.to_pylist()
        return self._py["tool_keys"][self._py["tool_key_index"][r]]

    def column(self, name: str) -> pa.Array:
        """A per-trajectory column: a stored one, or `tools_json` / `specs_json`."""
        if name == "tools_json":
            return self._tools[0]
        if name == "specs_json":
            return self._tools[1]
        if name in ("method", "source_dataset", "model"):
            return self.rows.field("provenance").field(name)
        return self.rows.field(name)

    def py(self, name: str) -> list[Any]:
        if name not in self._py:
            self._py[name] = self.column(name).to_pylist()
        return self._py[name]

    def rendered(self, opts: RenderOptions) -> Rendered:
        if opts not in self._rendered:
            self._rendered[opts] = render_batch(self.steps, opts)
        return self._rendered[opts]

    def step_values(self, field: str) -> list[Any]:
        if field not in self._steps_py:
            self._steps_py[field] = self.values.field(field).to_pylist()
        return self._steps_py[field]

    def first_problem(self) -> tuple[str | None, str] | None:
        """(record id, what is wrong) for the first record the models would refuse in a way the
        export depends on, else None. Shards written through the models never have one; rows
        written raw (`write_row`) or by other tools can."""
        valid = pa.array(self.valid)
        for column in ("id", "source"):
            empty = pc.and_(valid, pc.fill_null(pc.equal(pc.utf8_length(self.rows.field(column)), 0), True))
            if pc.any(empty).as_py():
                r = int(np.flatnonzero(empty.to_numpy(zero_copy_only=False))[0])
                return self.rows.field("id")[r].as_py(), f"{column}: empty"
        v, kind = self.values, self.values.field("kind")
        checks = [
            (pc.invert(pc.is_in(kind, _KINDS)), "kind: not one of " + ", ".join(_KINDS.to_pylist())),
            (pc.and_(pc.equal(kind, "api"), pc.fill_null(pc.equal(pc.utf8_length(v.field("function")), 0), True)),
             "function: missing"),
            (pc.and_(pc.equal(kind, "api"), pc.invert(pc.fill_null(pc.and_(
                pc.starts_with(pc.utf8_trim_whitespace(v.field("arguments")), "{"),
                pc.ends_with(pc.utf8_trim_whitespace(v.field("arguments")), "}")), False))),
             "arguments: not a JSON object"),
            (pc.and_(pc.is_in(kind, pa.array(["code", "message", "text", "json"])), pc.is_null(v.field("content"))),
             "content: missing"),
            (pc.and_(pc.equal(kind, "code"), pc.is_null(v.field("language"))), "language: missing"),
            (pc.and_(pc.is_in(kind, pa.array(["text", "json"])),
                     pc.invert(pc.fill_null(pc.is_in(v.field("source"), _ORIGINS), False))), "source: not one of "
             + ", ".join(_ORIGINS.to_pylist())),
            (pc.and_(pc.equal(kind, "image"), pc.is_null(pc.struct_field(v.field("image"), ["path"]))),
             "image: no path"),
            (pc.invert(pc.fill_null(pc.is_in(v.field("label"), _LABELS), True)), "label: not one of "
             + ", ".join(_LABELS.to_pylist())),
        ]
        for bad, problem in checks:
            bad = pc.fill_null(bad, True).to_numpy(zero_copy_only=False)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                r = int(self.owner[i])
                return self.rows.field("id")[r].as_py(), f"steps[{i - int(self.offsets[r])}].{problem}"
        return None

    def action_labels(self, exported: np.ndarray) -> dict[str, int]:
        """Labels of the action steps of the trajectories flagged in `exported`."""
        actions = pc.is_in(self.values.field("kind"), pa.array(sorted(ACTION_KINDS))).to_numpy(zero_copy_only=False)
        mask = np.repeat(exported, self.lengths) & actions
        counts = pc.value_counts(self.values.field("label").fill_null("unknown").filter(pa.array(mask)))
        return {str(v): int(n) for v, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())}


@dataclass
class PairRef:
    """The fields of a stored pair the DPO export reads."""

    id: str
    source: str
    level: str
    prefix_len: int
    chosen_id: str
    rejected_id: str


def pair_refs(pairs: pa.StructArray | pa.ChunkedArray) -> list[PairRef]:
    if isinstance(pairs, pa.ChunkedArray):
        pairs = pairs.combine_chunks()
    fields = [pairs.field(f).to_pylist() for f in ("id", "source", "level", "prefix_len", "chosen_id", "rejected_id")]
    return [PairRef(*values) for values in zip(*fields)]


def pair_of(pair: Any) -> PairRef:
    """A model object (`schemas.models.Pair`) as the exporter reads it."""
    table = pa.Table.from_pylist([pair_to_row(pair)], schema=PAIR_SCHEMA)
    return pair_refs(table.to_struct_array().combine_chunks())[0]
