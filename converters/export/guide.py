"""How to train on an export: the trainer settings under which loss falls only where it should.

The dataset card shows this section; `docs/export.md` gives the same settings. Checked with TRL
1.16 (`tests/export/test_trl_trainers.py` asserts on the trainers' own batch tensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

TRL_TEMPLATES = (
    "It needs a chat template with `{% generation %}` markers. TRL 1.16 swaps in its bundled training template "
    "when it knows the model family, but not every one renders what agent rows hold (Llama 3's renders neither "
    "tools nor tool calls): the section Chat templates says which render every row of this export. For any other "
    "template use `--format tokenized`, whose masks do not depend on the trainer and whose rows are checked "
    "against the template.")
MAX_LENGTH = (
    "`max_length=None` (or at least your longest row in tokens): TRL's default of 1024 cuts longer rows at the end"
    "{drops}.")


# --format rl's columns under the names of the rollout outputs RL trainers take.
RL_FIELDS = [
    ("prompt_ids", "prompt_ids", "prompt_token_ids", "the first request's tokens, as the model was fed them"),
    ("completion_ids", "completion_ids", "response_ids", "everything after: the model's tokens and, between its "
     "turns, the environment's and user's"),
    ("completion_mask", "completion_mask", "loss_masks", "1 on the model's own tokens, 0 on environment and user "
     "tokens (and on loss-masked or rewritten steps)"),
    ("completion_logprobs", "completion_logprobs", "rollout_logprobs", "the model's logprob of each of its tokens "
     "(0 elsewhere); null where the backend gave none"),
    ("reward", "reward", "rewards", "the episode's reward; `step_rewards` has each model turn's step reward"),
]


# The formats TRL trains (`trajforge train` takes these); the others are for other trainers or tools.
TRL_FORMATS = ("trl-sft", "tokenized", "trl-dpo", "trl-kto")


def kto_weights(labels: dict[str, int]) -> tuple[float, float]:
    """(desirable_weight, undesirable_weight) that put TRL's balance ratio
    desirable_weight * n_desirable / (undesirable_weight * n_undesirable) at 1 (TRL wants [1, 4/3])."""
    good, bad = labels.get("desirable", 0), labels.get("undesirable", 0)
    if not good or not bad:
        return 1.0, 1.0
    # Two decimals, rounded towards the balanced side: rounded to nearest, the ratio could land just
    # below 1 (0.9984), outside what TRL asks for.
    if bad > good:
        return _two_decimals(bad / good, +1, lambda w: w * good / bad >= 1), 1.0
    return 1.0, _two_decimals(good / bad, -1, lambda w: good / (w * bad) >= 1)


def _two_decimals(exact: float, step: int, ok: Callable[[float], bool]) -> float:
    """The two-decimal weight nearest `exact` in the direction of `step` for which `ok` holds (TRL's own
    float arithmetic decides)."""
    weight = (math.ceil if step > 0 else math.floor)(round(exact * 100, 6)) / 100
    while not ok(weight):
        weight = round(weight + step / 100, 2)
    return weight


@dataclass(frozen=True)
class TrainerSettings:
    """The TRL config an export is made for: the objective, the config class and its arguments."""

    objective: str  # sft | dpo | kto
    config: str  # SFTConfig, DPOConfig, KTOConfig
    kwargs: dict[str, Any]

    @property
    def trainer(self) -> str:
        return self.config.replace("Config", "Trainer")

    def code(self) -> list[str]:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return [f"from trl import {self.config}, {self.trainer}", f"args = {self.config}({args})"]


def trainer_settings(data: dict[str, Any]) -> TrainerSettings | None:
    """The settings of an export's card data (`card.json`) under which its loss masks are exact; None for
    formats not trained with TRL (openai, sharegpt). `trajforge train` applies exactly these."""
    fmt = data["format"]
    if fmt == "trl-sft":
        return TrainerSettings("sft", "SFTConfig", {"assistant_only_loss": True, "max_length": None})
    if fmt == "trl-dpo":
        return TrainerSettings("dpo", "DPOConfig", {"max_length": None})
    if fmt == "trl-kto":
        desirable, undesirable = kto_weights(data["distributions"].get("kto_labels", {}))
        return TrainerSettings("kto", "KTOConfig", {"max_length": None, "desirable_weight": desirable,
                                                    "undesirable_weight": undesirable})
    if fmt == "tokenized":
        limit = (data.get("tokenizer") or {}).get("max_length")
        return TrainerSettings("sft", "SFTConfig", {"max_length": limit if limit else None})
    return None


def _code(lines: list[str]) -> list[str]:
    return ["```python", *lines, "```", ""]


def training_section(data: dict[str, Any]) -> list[str]:
    """Markdown: the config to train with, and what the export could not express."""
    fmt, settings = data["format"], data["settings"]
    trainer = trainer_settings(data)
    out = ["## Training", ""]
    if fmt == "trl-sft":
        assert trainer is not None
        out += _code(trainer.code())
        if data["sft_layout"] == "prompt-completion":
            out += ["Loss falls on the assistant tokens of the completion: `completion_only_loss` is TRL's default for "
                    "prompt/completion rows and combines with `assistant_only_loss`, so tool results and user turns "
                    "inside a completion, and every masked step (always in the prompt), carry no loss. "]
        else:
            out += ["Loss falls on every assistant message (`assistant_only_loss=True`); tool results, user and system "
                    "turns carry none. No row has a masked step: TRL reads no per-message flag, so the export refuses "
                    "(or, with `--skip-unfit-rows`, skips) trajectories with `train=false` assistant steps; each "
                    "assistant message's `train` flag is true. "]
        out += [TRL_TEMPLATES, "", MAX_LENGTH.format(drops=""), ""]
    elif fmt == "trl-dpo":
        assert trainer is not None
        out += _code(trainer.code())
        out += [MAX_LENGTH.format(drops=" and drops every row whose prompt alone fills it (long agent histories "
                                        "often do)"), ""]
        if settings.get("dpo_level") == "trajectory":
            out += ["**Warning**: trajectory-level rows. `chosen` / `rejected` run through each continuation's last "
                    "assistant message, so the tool results and user turns between assistant messages are part of "
                    "both sequences; DPO has no per-token mask, and the preference is partly learned on that text. "
                    "The default, `--dpo-level step`, compares the next assistant message only.", ""]
        else:
            out += ["Step-level rows: `chosen` and `rejected` are one assistant message each, after the shared history "
                    "(`prompt`), so the preference is learned on the agent's own tokens only.", ""]
    elif fmt == "trl-kto":
        assert trainer is not None
        out += _code(trainer.code())
        out += ["The weights balance this export's desirable / undesirable rows (TRL asks for a weighted ratio in "
                "[1, 4/3]). " + MAX_LENGTH.format(drops=" and drops rows whose prompt alone fills it"), ""]
        if settings.get("kto_mode") == "trajectory":
            out += ["**Warning**: trajectory rows. A completion runs from the first trainable assistant message "
                    "through the last one, with the tool results and user turns between them; KTO has no per-token "
                    "mask, so they carry the label too. The default (`--kto-mode auto`) labels one assistant message "
                    "per row.", ""]
    elif fmt == "tokenized":
        tok = data.get("tokenizer") or {}
        assert trainer is not None
        out += _code(trainer.code())
        out += ["The rows are already tokenized: TRL uses `input_ids` as they are and turns `assistant_masks` into "
                "labels whatever `assistant_only_loss` says (leave it unset: it only applies to conversational rows). "
                f"Tokenizer: `{tok.get('path', '-')}`; message spans from {tok.get('method', '-')}. Every exported row "
                "was checked against that template: each trainable assistant message renders its text and tool calls, "
                "and the row's tools render where it has them (rows that did not were refused, or skipped with "
                "`--skip-unfit-rows`: see Counts). Rows of model calls that recorded their token ids hold those ids "
                "under `--tokens recorded` (`token_source`; see Token truth).", ""]
    elif fmt == "rl":
        out += ["Each row is one rollout as an RL trainer holds it: the token ids the model was fed and produced, "
                "recorded per model call (`llm.token_ids`), never a re-tokenization. Turns whose prompt extends the "
                "previous prompt and completion share a row; a turn whose prompt does not (a history window that "
                "dropped turns) starts one (`segment`). Columns by the names of verifiers' `RolloutOutput` and "
                "SkyRL's `GeneratorOutput`:", "",
                "| column | verifiers | SkyRL | holds |", "|---|---|---|---|",
                *[f"| `{c}` | `{v}` | `{k}` | {what} |" for c, v, k, what in RL_FIELDS], ""]
    elif fmt == "openai":
        out += ["Upload the JSONL files as they are: OpenAI trains assistant messages with `weight` 1 only.", ""]
    elif fmt == "sharegpt":
        out += ["In LLaMA-Factory: `dataset_dir: <this folder>`, `dataset: trajforge` (declared in "
                "`dataset_info.json`), and the `template` of your model. It trains every `gpt` / `function_call` turn "
                "and no `human` / `observation` turn.", ""]
    for note, n in data.get("notes", {}).items():
        out += [f"- {note}: {n:,}"]
    if data.get("notes"):
        out.append("")
    return out
