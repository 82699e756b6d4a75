"""`trl-dpo`: TRL DPOTrainer rows `{"prompt", "chosen", "rejected"}`, conversational, from pairs.

A pair names two trajectories that share their first `prefix_len` steps. Both are rendered whole
(no split inside a message, so no tool call is left without its answer by the cut); the *fork*
is the first message that holds step `prefix_len` or a later one. `prompt` = the messages before
the fork, which must render identically for both (else "prefix mismatch"), plus any messages at
the fork before the next assistant message when both trajectories have the same ones there.

- `step` level (default): `chosen` / `rejected` = the next assistant message of each, nothing
  else. DPO has no per-token mask, so this is the only layout in which the preference is learned
  on the agent's own tokens alone.
- `trajectory` level: `chosen` / `rejected` = each continuation through its last assistant
  message (trailing observations cut). Tool results and user turns between the assistant
  messages are part of both sequences and so of the preference; the card says so.

A pair of records that carry render settings (generated in an environment; `history="request"`,
the default) gets as `prompt` the request both sides answered at the fork, exactly as sent
(`converters.export.request`): its system prompt, its history window, pages cut as they were.

Skipped (with the reason): a prefix mismatch, an empty prompt, a continuation without an
assistant message, trajectories that differ before the next assistant message (step level:
the fork is an observation, not a choice of the agent), identical chosen and rejected messages,
a masked step among the compared messages (a masked step is never trained), or a missing
trajectory (reported by the driver). `tools` comes from the chosen trajectory; `level` is the
pair's own level as stored.
"""

from __future__ import annotations

from typing import Any

from converters.export.options import FormatOptions
from converters.export.records import PairRef, Record
from converters.export.render import Conversation, Unrenderable
from converters.export.request import request_positions


def fork_position(conv: Conversation, step: int) -> int:
    """The first message (after a hoisted system message) that holds step `step` or a later one."""
    for k in range(len(conv)):
        steps = conv.steps(k)
        if steps and steps[-1] >= step:
            return k
    return len(conv)


def _leading_observations(conv: Conversation) -> int:
    positions = conv.assistant_positions()
    return positions[0] if positions else len(conv)


def _masked(conv: Conversation, record: Record) -> bool:
    """Whether any step behind these messages is loss-masked (DPO trains every token it compares)."""
    return any(record.step("train", j) is False for k in range(len(conv)) for j in conv.steps(k))


def _request(chosen: Record, rejected: Record, k: int) -> Conversation:
    """The request both sides answered at the fork (message k of both; their prefixes are equal)."""
    if rejected.settings != chosen.settings:
        raise Unrenderable("chosen and rejected were rendered with different settings")
    assert chosen.settings is not None
    sent = chosen.render_request()
    prompt = sent[request_positions(sent, k, chosen.settings)]
    other = rejected.render_request()
    if prompt.keys() != other[request_positions(other, k, chosen.settings)].keys():
        raise Unrenderable("prefix mismatch")
    return prompt


def dpo_rows(pair: PairRef, chosen: Record, rejected: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    c, r = chosen.render(opts.render), rejected.render(opts.render)
    fc, fr = fork_position(c, pair.prefix_len), fork_position(r, pair.prefix_len)
    prompt = c[:fc]
    if prompt.keys() != r[:fr].keys():
        raise Unrenderable("prefix mismatch")
    if not len(prompt):
        raise Unrenderable("empty prompt")
    c_rest, r_rest = c[fc:].through_last_assistant(), r[fr:].through_last_assistant()
    if not len(c_rest) or not len(r_rest):
        raise Unrenderable("continuation has no assistant turn")
    lc, lr = _leading_observations(c_rest), _leading_observations(r_rest)
    if c_rest[:lc].keys() == r_rest[:lr].keys():
        prompt, c_rest, r_rest = prompt + c_rest[:lc], c_rest[lc:], r_rest[lr:]
    elif opts.dpo_level == "step":
        raise Unrenderable("trajectories differ before the next assistant turn")
    if opts.dpo_level == "step":
        c_rest, r_rest = c_rest[:1], r_rest[:1]
        if c_rest.keys() == r_rest.keys():
            raise Unrenderable("chosen and rejected turns are identical")
    if _masked(c_rest, chosen) or _masked(r_rest, rejected):
        raise Unrenderable("masked step in a compared turn")
    if chosen.settings is not None and opts.history == "request":
        prompt = _request(chosen, rejected, len(prompt))
    return [{
        "id": pair.id,
        "source": pair.source,
        "level": pair.level,
        "chosen_id": chosen.id,
        "rejected_id": rejected.id,
        "prompt": prompt,
        "chosen": c_rest,
        "rejected": r_rest,
        "tools": chosen.tools_json(),
    }]
