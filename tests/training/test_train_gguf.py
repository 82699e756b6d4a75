"""`trajforge train EXPORT --base smollm2`: the embedded GGUF, dequantized by transformers, trains through the CLI.

One optimizer step on a one-record export: what users run first, and what transformers' quantized-model
checks stopped every time while the GGUF load left a quantized mark on the dequantized model. Loads the
real SmolLM2-135M (about a minute on two cores).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from converters.export import ExportConfig, export
from flows.cli import app
from schemas.models import MessageAction, TextObservation, Trajectory
from tests.export import _data

pytestmark = [pytest.mark.trl, pytest.mark.local_llm]


def test_train_the_embedded_gguf_for_one_step_through_the_cli(tmp_path):
    # A two-message record: the step's cost grows with the row's tokens, and what is tested is the base.
    hello = Trajectory(id="t-hello", source="hand", steps=[TextObservation(content="Hello?", source="user"),
                                                           MessageAction(content="Hello! How can I help?")])
    src = _data.store(tmp_path / "src", [hello])
    export(src, tmp_path / "sft", ExportConfig(format="trl-sft"))
    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "sft"), "--base", "smollm2", "-o", str(out),
                                      "--max-steps", "1", "--batch-size", "1", "--device", "cpu",
                                      "--chat-template", "qwen2_5_training"])
    assert result.exit_code == 0, result.output
    card = json.loads((out / "train.json").read_text())
    assert card["steps"] == 1 and card["base"]["path"].endswith(".gguf") and card["train_loss"] > 0
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config  # saved as the plain model it is after dequantizing
    assert (out / "model.safetensors").is_file()
