"""NNetNav live-web demonstrations (stanfordnlp/nnetnav-live) -> interlingua.

Raw format: one object per *step*; a trajectory is the run of consecutive rows with the same `id`
(use `episodes(rows)`; `convert` takes an episode's list of rows, or one row as a one-step episode):
- `id`: trajectory id, e.g. "openweb_6442".
- `dataset`: e.g. "openweb_NNetNav_Bof3".
- `messages`: [system prompt, user "OBSERVATION: <axtree>\\nURL: <url>\\nOBJECTIVE: ...\\nPREVIOUS
  ACTIONS: ...", assistant "... In summary, the next action I will perform is ```click [12]```"].
- `output`, `prompt`: the same step rendered as Llama-3 chat text; `n_tokens`: its length.

Follows ADP's `datasets/nnetnav-live/raw_to_standardized.py`: a goal text observation built from the
objective, then per step a web observation (url + axtree) and the action as a browsergym-style api
call (arguments in ADP's quoted-string convention; `type`'s press_enter_after is "0" unless a 4th
bracket is given, as ADP parses it); `stop [answer]` is the final `<finish>` message. ADP drops
episodes that do not end with stop; we keep them with `details["completed"] = False`.
"""

from __future__ import annotations

from typing import Any

from converters._nnetnav import EPISODE_KEY, convert_episode, episodes  # noqa: F401  (episodes is part of the API)
from converters._util import guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "nnetnav-live"
DATASET = "stanfordnlp/nnetnav-live"


@register(NAME, sources=[DATASET], episode_key=EPISODE_KEY)
@guarded(("id",))
def convert(record: Any) -> Trajectory:
    return convert_episode(record, NAME, DATASET)
