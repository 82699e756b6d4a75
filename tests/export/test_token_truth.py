"""Exports train the tokens the model was fed and produced: rollouts generated through the CLI against the fake
server (vLLM's token ids over real HTTP) carry the server's ids per model call; `--format rl` rows hold them with a
mask on exactly the model's tokens; `--format tokenized` takes them or the template's render and counts, in the card,
the rows where the two differ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule
from converters.export.options import FormatOptions
from converters.export.records import Record
from converters.export.render import Unrenderable
from converters.export.tokenized import ChatTokenizer
from converters.export.tokens import first_difference, rl_rows
from flows.cli import app
from schemas.models import ApiAction, MessageAction, TextObservation, Tokens, Trajectory, Usage
from schemas.store import Dataset
from tests.export import _data, _tiny
from tests.generators.test_rollout import RetailScript, _retail_tasks


def _logprobs(n: int) -> list[float]:
    return [-((k % 8) + 1) / 16 for k in range(n)]


def _generate(tmp: Path, **server: Any) -> tuple[Path, list[dict], list]:
    """Rollouts of 3 retail tasks (solved; failed; one unreadable answer then solved), and the server's log."""
    tasks = _retail_tasks(3)
    with FakeServer(rules=[Rule(fn=RetailScript(tasks))], **server) as fake:
        config = {"method": "rollout", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": 3}, "max_steps": 6,
                  "max_parse_failures": 2, "concurrency": 1, "unit_tasks": 3,
                  "llm": {"backend": "openai", "base_url": fake.base_url, "model": "fake-model", "api_key_env": None,
                          "max_retries": 0}}
        (tmp / "c.yaml").write_text(yaml.safe_dump(config))
        result = CliRunner().invoke(app, ["generate", "--method", "rollout", "--config", str(tmp / "c.yaml"),
                                          "--output", str(tmp / "data")])
        log = [e for e in fake.log if "token_ids" in e]
    assert result.exit_code == 0, result.output
    return tmp / "data", log, tasks


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Rollouts whose ids are the fake server's own (one hashed id per word or whitespace run)."""
    return _generate(tmp_path_factory.mktemp("token-truth"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return str(_tiny.shared_model_dir(tmp_path_factory))


@pytest.fixture(scope="module")
def generated_tiny(tmp_path_factory, tokenizer):
    """Rollouts whose ids are the tiny tokenizer's: the fake server tokenizes each of its pieces with it."""
    tok = ChatTokenizer.load(tokenizer).tokenizer
    return _generate(tmp_path_factory.mktemp("token-truth-tiny"),
                     tokenize=lambda piece: tok(piece, add_special_tokens=False)["input_ids"])


def _export(data: Path, out: Path, *args: str) -> list[dict]:
    result = CliRunner().invoke(app, ["export", str(data), "--output", str(out), *args])
    assert result.exit_code == 0, result.output
    return pq.read_table(out / "data").to_pylist()


def test_each_model_step_records_the_ids_and_logprobs_the_server_returned(generated):
    data, log, tasks = generated
    records = list(Dataset.open(data).iter_records())
    assert sorted(t.id for t in records) == [f"rollout/{task.id}#0" for task in tasks]
    calls = 0
    for t in records:
        for step in t.steps:
            if step.usage is None:
                continue
            tokens = step.usage.tokens
            assert tokens is not None and tokens.tokenizer == "fake-model"
            [entry] = [e for e in log if e["prompt_token_ids"] == tokens.prompt_ids]
            assert tokens.completion_ids == entry["token_ids"][0]
            assert tokens.logprobs == _logprobs(len(tokens.completion_ids))
            calls += 1
    assert calls >= len(records) * 3


def test_rl_rows_mask_exactly_the_model_tokens_of_multi_turn_rollouts(generated, tmp_path):
    data, log, tasks = generated
    rows = _export(data, tmp_path / "rl", "--format", "rl")
    records = {t.id: t for t in Dataset.open(data).iter_records()}
    assert {r["id"] for r in rows} == set(records)
    for row in rows:
        t = records[row["id"]]
        steps = [j for j, s in enumerate(t.steps) if s.usage is not None]
        assert row["steps"] == steps and row["segment"] == 0  # every prompt extends the one before: one row
        mask, ids, logprobs = row["completion_mask"], row["completion_ids"], row["completion_logprobs"]
        assert len(mask) == len(ids) == len(logprobs)
        # The tokens under mask 1 are, in order, exactly the completions of the trained model steps; the rest
        # (tool results, the user's turns, the template's headers, an untrained answer) are 0.
        trained = [t.steps[j].usage.tokens for j in steps if t.steps[j].train]
        assert [i for i, m in zip(ids, mask) if m] == [i for tok in trained for i in tok.completion_ids]
        assert [lp for lp, m in zip(logprobs, mask) if m] == [lp for tok in trained for lp in tok.logprobs]
        # The whole row is the last request the model answered, then its answer.
        last = t.steps[steps[-1]].usage.tokens
        assert row["prompt_ids"] + ids == last.prompt_ids + last.completion_ids
        assert row["prompt_ids"] == t.steps[steps[0]].usage.tokens.prompt_ids
        assert row["reward"] == t.reward and len(row["step_rewards"]) == len(steps)
        env_tokens = len(mask) - sum(mask) - sum(len(t.steps[j].usage.tokens.completion_ids)
                                                  for j in steps if not t.steps[j].train)
        assert env_tokens > 0 and len(steps) >= 2
        # Only the environment's tokens have logprob 0 (the server's are never 0): an untrained answer keeps its own.
        assert sum(1 for lp in logprobs if lp == 0.0) == env_tokens
    # The unreadable answer (task 2) is in its row, untrained.
    retried = next(r for r in rows if r["id"] == f"rollout/{tasks[2].id}#0")
    bad = next(j for j in retried["steps"] if not records[retried["id"]].steps[j].train)
    assert records[retried["id"]].steps[bad].extra.get("parse_error")
    card = json.loads((tmp_path / "rl" / "card.json").read_text())
    readme = (tmp_path / "rl" / "README.md").read_text()
    assert card["format"] == "rl" and "`completion_mask` | `completion_mask` | `loss_masks`" in readme
    assert "`response_ids`" in readme and "`rollout_logprobs`" in readme
    scope: dict = {}
    exec(card["load"], scope)  # the card's load line (tests/export/test_card_plots.py: every other format)
    assert card["load"] in readme and len(scope["ds"]) == len(rows)


def test_tokenized_takes_the_recorded_ids_or_the_render_and_counts_where_they_differ(generated_tiny, tokenizer,
                                                                                      tmp_path):
    data, _, _ = generated_tiny
    recorded = _export(data, tmp_path / "rec", "--format", "tokenized", "--tokenizer", tokenizer)
    rendered = _export(data, tmp_path / "ren", "--format", "tokenized", "--tokenizer", tokenizer,
                       "--tokens", "rendered")
    assert len(recorded) == len(rendered) > 4
    calls: dict[str, list] = {}
    for t in Dataset.open(data).iter_records():
        for s in t.steps:
            if s.usage is not None and s.train:
                calls.setdefault(t.id, []).append(s.usage.tokens)
    tok = ChatTokenizer.load(tokenizer).tokenizer
    differ = []
    for rec, ren in zip(recorded, rendered):
        assert rec["id"] == ren["id"] and rec["token_source"] == "recorded" and ren["token_source"] == "rendered"
        tokens = calls[rec["id"]].pop(0)
        assert rec["input_ids"] == tokens.prompt_ids + tokens.completion_ids
        assert rec["assistant_masks"] == [0] * len(tokens.prompt_ids) + [1] * len(tokens.completion_ids)
        assert tok.decode(tokens.prompt_ids).startswith("<|im_start|>system\n")
        position = first_difference(rec["input_ids"], ren["input_ids"])
        assert rec["drift_at"] == ren["drift_at"] == position
        differ += [position] if position is not None else []
    # The fake server tokenizes word by word: where the template's whole-text tokenization merges a space into the
    # next word, the render departs from what the model was fed.
    assert differ
    for out in ("rec", "ren"):
        truth = json.loads((tmp_path / out / "card.json").read_text())["token_truth"]
        assert truth["compared"] == len(recorded) and truth["differ"] == len(differ) and truth["foreign"] == 0
        assert truth["first_difference"]["min"] == min(differ) and truth["first_difference"]["max"] == max(differ)
        assert truth["recorded_by"] == {"fake-model, the server's chat template": len(recorded)}
        readme = (tmp_path / out / "README.md").read_text()
        assert f"**{len(differ)} of {len(recorded)} rows** render to other tokens" in readme


def test_tokenized_never_takes_ids_of_another_tokenizer(generated, tokenizer, tmp_path):
    data, _, _ = generated  # the fake server's hashed ids: not the tiny tokenizer's
    rows = _export(data, tmp_path / "x", "--format", "tokenized", "--tokenizer", tokenizer)
    tok = ChatTokenizer.load(tokenizer).tokenizer
    assert rows and all(r["token_source"] == "rendered" and r["drift_at"] is None for r in rows)
    assert all(tok.decode(r["input_ids"]).startswith("<|im_start|>system") for r in rows)
    truth = json.loads((tmp_path / "x" / "card.json").read_text())["token_truth"]
    assert truth["foreign"] == len(rows) and truth["compared"] == 0 and truth["rows"] == {"rendered": len(rows)}
    assert f"**{len(rows)} rows** recorded ids of another tokenizer" in (tmp_path / "x" / "README.md").read_text()


def test_tokens_is_refused_outside_tokenized_and_rl_needs_recorded_ids(generated, tmp_path):
    data, _, _ = generated
    result = CliRunner().invoke(app, ["export", str(data), "--output", str(tmp_path / "x"), "--format", "trl-sft",
                                      "--tokens", "rendered"])
    assert result.exit_code != 0 and "--tokens applies to --format tokenized only" in result.output


def test_a_rewritten_step_is_rendered_never_trained_on_its_old_ids(generated_tiny, tokenizer, tmp_path):
    data, _, _ = generated_tiny
    records = list(Dataset.open(data).iter_records())
    t = next(r for r in records if r.success)
    model_steps = [j for j, s in enumerate(t.steps) if s.usage is not None]
    t.details["rewrites"] = [{"steps": [model_steps[-1]], "kind": "context", "reason": "relabelled instruction"}]
    _data.store(tmp_path / "src", [t])
    rows = _export(tmp_path / "src", tmp_path / "out", "--format", "tokenized", "--tokenizer", tokenizer)
    rows_rl = _export(tmp_path / "src", tmp_path / "rl", "--format", "rl")
    # Every trained call but the rewritten one holds its recorded ids.
    assert [r["token_source"] for r in rows] == ["recorded"] * (len(rows) - 1) + ["rendered"]
    # In the rollout its tokens are context: the mask leaves them out.
    [row] = rows_rl
    last = t.steps[model_steps[-1]].usage.tokens.completion_ids
    assert row["completion_ids"][-len(last):] == last and set(row["completion_mask"][-len(last):]) == {0}


def _call(prompt: list[int], completion: list[int], logprobs: list[float] | None = None) -> Usage:
    return Usage(model="m", tokens=Tokens(prompt_ids=prompt, completion_ids=completion, logprobs=logprobs,
                                          tokenizer="tok"))


def test_a_prompt_that_does_not_extend_the_history_starts_a_row_and_missing_logprobs_are_null():
    t = Trajectory(id="t", source="s", reward=0.5, steps=[
        TextObservation(content="task", source="user"),
        ApiAction(function="f", usage=_call([1, 2], [3, 4], [-0.5, -0.25]), reward=1.0),
        TextObservation(content="result", source="environment"),
        # Extends [1, 2, 3, 4]: one row, the tool result's tokens 7 8 between, mask 0.
        ApiAction(function="g", usage=_call([1, 2, 3, 4, 7, 8], [9], [-1.0])),
        TextObservation(content="result", source="environment"),
        # A history window dropped the first turn: a new row.
        MessageAction(content="done", usage=_call([1, 7, 8, 9, 5], [6], None)),
    ])
    first, second = rl_rows(Record.of(t), FormatOptions())
    assert first["steps"] == [1, 3] and first["prompt_ids"] == [1, 2]
    assert first["completion_ids"] == [3, 4, 7, 8, 9] and first["completion_mask"] == [1, 1, 0, 0, 1]
    assert first["completion_logprobs"] == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert first["step_rewards"] == [1.0, None] and first["reward"] == 0.5 and first["tokenizer"] == "tok"
    assert second["segment"] == 1 and second["prompt_ids"] == [1, 7, 8, 9, 5] and second["completion_ids"] == [6]
    assert second["completion_mask"] == [1] and second["completion_logprobs"] is None
    with pytest.raises(Unrenderable, match="no recorded token ids"):
        rl_rows(Record.of(Trajectory(id="u", source="s", steps=[MessageAction(content="hi")])), FormatOptions())
