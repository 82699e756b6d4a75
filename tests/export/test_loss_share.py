"""The share of loss tokens on environment text is 0% for every default export of demo-like data.

The data is what `make demo` makes, without its LLM: the shipped ADP samples, retail rollouts from
a scripted agent on the fake OpenAI-compatible server (with unreadable answers kept as masked
steps and failed runs kept, as the demo keeps them), and MCTS splicing with the scripted retail
agent (masked bad prefixes, preference pairs) labelled by step verification. Each TRL format
goes through its real trainer's data preparation and collator (TRL's `qwen3_training` template;
`test_trl_trainers` runs the optimizer steps); `tokenized` through its masks;
`openai` and `sharegpt` through what their trainers train (weight-1 assistant messages;
LLaMA-Factory's gpt/function_call turns). The shares are printed per format.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from backends.fake_server import FakeServer, Rule
from converters.export import ExportConfig, export, preview
from converters.export.tokenized import ChatTokenizer
from generators.runner import generate, load_config
from generators.scripted import ScriptedRetailLLM, cancel_tasks
from schemas.store import Dataset
from tests.export import _data, _tiny
from tests.export.test_sharegpt_llamafactory import convert
from tests.export.test_trl_trainers import _load
from tests.generators.test_rollout import RetailScript, _config, _retail_tasks
from tests.generators.test_step_verify import make_verified_output

pytestmark = [
    pytest.mark.trl,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install -e .[train])"),
]
TEMPLATE = "qwen3_training"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, adp_dir: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("demo")
    adp = _data.adp_trajectories(adp_dir)
    tasks = _retail_tasks(4)
    with FakeServer(rules=[Rule(fn=RetailScript(tasks))]) as server:
        cfg = load_config(_config(server.base_url, tasks={"n": 4}, keep_failed=True, concurrency=2))
        asyncio.run(generate(cfg, root / "rollout"))
    rollouts = list(Dataset.open(root / "rollout").iter_records())
    assert any(not s.train for t in rollouts for s in t.steps) and any(t.success is False for t in rollouts)
    search, verified, _ = make_verified_output(root, ScriptedRetailLLM(cancel_tasks(1)), search={"iterations": 2},
                                               max_pairs_per_task=2)
    trajectories = [*adp, *rollouts, *Dataset.open(verified).iter_records()]
    src = _data.store(root / "src", trajectories)
    out: dict[str, Any] = {"root": root, "trajectories": {t.id: t for t in trajectories}}
    for fmt in ("trl-sft", "trl-kto", "openai", "sharegpt"):
        out[fmt] = export(src, root / fmt, ExportConfig(format=fmt))
    out["trl-dpo"] = export(search, root / "trl-dpo", ExportConfig(format="trl-dpo"))
    corpus = [t for fmt in ("trl-sft", "trl-kto", "trl-dpo") for row in _load(root / fmt) for t in _tiny.texts(row)]
    out["tokenizer_dir"] = _tiny.tokenizer_dir(root / "tok", TEMPLATE, corpus)
    out["tokenized"] = export(src, root / "tokenized", ExportConfig(format="tokenized", tokenizer=str(out["tokenizer_dir"])))
    return out


def _sft(demo: dict[str, Any], tok: Any, tmp: Path) -> _tiny.LossCount:
    from trl import SFTConfig, SFTTrainer

    data = _load(demo["root"] / "trl-sft")
    trainer = SFTTrainer(model=_tiny.model(tok), args=SFTConfig(**_tiny.train_args(tmp, "sft"), assistant_only_loss=True),
                         train_dataset=data, processing_class=tok)
    total = _tiny.LossCount()
    for _, count in _tiny.sft_counts(trainer, tok, data):
        total += count
    return total


def _preference(demo: dict[str, Any], tok: Any, tmp: Path, fmt: str) -> _tiny.LossCount:
    data = _load(demo["root"] / fmt)
    total = _tiny.LossCount()
    for _, _, count in _tiny.preference_counts(_tiny.preference_trainer(fmt, tok, data, tmp), tok, data):
        total += count
    return total


def _tokenized(demo: dict[str, Any], tok: Any) -> _tiny.LossCount:
    total = _tiny.LossCount()
    requests: dict[str, list[dict[str, Any]]] = {}
    for row in _load(demo["root"] / "tokenized"):
        traj = demo["trajectories"][row["id"]]
        if "render" in traj.details:  # one row per trained message: its request, then it (the trl-sft rows' order)
            pending = requests.setdefault(row["id"], preview(traj, "trl-sft").rows)
            conv = pending.pop(0)
            messages, trained_from = conv["prompt"] + conv["completion"], len(conv["prompt"])
        else:
            (conv,) = preview(traj, "trl-sft", sft_layout="messages").rows
            messages, trained_from = conv["messages"], 0
        total += _tiny.loss_tokens(tok, messages, _tiny.tools_of(conv), row["input_ids"],
                                   [bool(m) for m in row["assistant_masks"]], trained_from=trained_from)
    assert not any(requests.values())
    return total


def _openai(demo: dict[str, Any], tok: Any) -> _tiny.LossCount:
    """OpenAI trains the assistant messages of weight 1: their tokens, from the chat template."""
    chat = ChatTokenizer(tok)
    total = _tiny.LossCount()
    for line in demo["openai"].files[0].read_text().splitlines():
        row = json.loads(line)
        messages = [{k: v for k, v in m.items() if k != "weight"} for m in row["messages"]]
        for m, original in zip(messages, row["messages"]):
            if m["role"] == "assistant":
                m["train"] = original["weight"] == 1
            for call in m.get("tool_calls") or ():
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        enc = chat.encode(messages, [m["train"] for m in messages if m["role"] == "assistant"], row.get("tools"))
        total += _tiny.loss_tokens(tok, messages, row.get("tools"), enc.input_ids, [bool(x) for x in enc.mask])
    return total


def _sharegpt(demo: dict[str, Any], tok: Any) -> _tiny.LossCount:
    """LLaMA-Factory trains the gpt/function_call turns and nothing else: every system, user and
    tool message of the trajectory must land in the system column or a human/observation turn."""
    total = _tiny.LossCount()
    for row in pq.read_table(demo["root"] / "sharegpt" / "data").to_pylist():
        converted = convert(row)
        untrained = [converted["_system"], *(m["content"] for m in converted["_prompt"]
                                             if m["role"] in ("user", "observation"))]
        trained = [m["content"] for m in converted["_prompt"] + converted["_response"]
                   if m["role"] in ("assistant", "function")]
        total.loss += sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in trained)
        (conv,) = preview(demo["trajectories"][row["id"]], "trl-sft", sft_layout="messages").rows
        for m in conv["messages"]:
            text = (m.get("content") or "").strip()
            if m["role"] != "assistant" and text and not any(text in u for u in untrained):
                total.environment += len(tok(text, add_special_tokens=False)["input_ids"])
    total.trainable = total.loss - total.environment
    return total


def test_no_loss_on_environment_text_in_any_default_export(demo, tmp_path, capsys):
    tok = _tiny.load_tokenizer(demo["tokenizer_dir"])
    shares = {"trl-sft": _sft(demo, tok, tmp_path), "trl-dpo": _preference(demo, tok, tmp_path, "trl-dpo"),
              "trl-kto": _preference(demo, tok, tmp_path, "trl-kto"), "tokenized": _tokenized(demo, tok),
              "openai": _openai(demo, tok), "sharegpt": _sharegpt(demo, tok)}
    with capsys.disabled():
        print(f"\nloss tokens on demo-like data ({TEMPLATE}):")
        for fmt, c in shares.items():
            print(f"  {fmt:10s} loss tokens {c.loss:7,d}  environment text {c.environment_share:6.1%}  "
                  f"masked/prompt assistant text {c.context / max(c.loss, 1):6.1%}")
    for fmt, c in shares.items():
        assert c.loss > 0 and c.environment == 0 and c.context == 0, (fmt, c)
