"""Fixtures of the viewer tests: the dataset (built once), an export of it, a small tokenizer, and a
running `trajforge view` over them (the command users run, in its own process)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from converters.export import ExportConfig, export
from tests.viewer import _data

REPO = Path(__file__).resolve().parents[2]
# Chat template with generation markers: assistant turns are what `return_assistant_tokens_mask` marks.
# Tool-call arguments are mappings in the exports (as chat templates expect): printed with `tojson`.
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}{% generation %}"
    "{% if m.content %}{{ m.content }}{% endif %}{% if m.tool_calls %}{% for c in m.tool_calls %}<|call|>"
    "{{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}{% endif %}<|end|>{% endgeneration %}"
    "{% else %}{{ m.content }}<|end|>{% endif %}{% endfor %}{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|call|>", "<|end|>"]


@pytest.fixture(scope="session")
def viewer_dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("viewer") / "generate" / "mcts"
    _data.build(path)
    return path


@pytest.fixture(scope="session")
def viewer_export(viewer_dataset) -> Path:
    out = viewer_dataset.parent.parent / "export" / "sft"
    export(viewer_dataset, out, ExportConfig(format="trl-sft"))
    return out


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path | None:
    """A byte-level BPE tokenizer (any text tokenizes) saved as a directory, as users pass one; None without transformers."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Please cancel my pending order because I no longer need it", "the order was cancelled by mistake"]
    tok.train_from_iterator(corpus * 5, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)
    return path


class Served:
    """A `trajforge view` process: its base URL and everything it printed."""

    def __init__(self, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "view", *args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self.url: str | None = None
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if line.startswith("serving "):
                    self.url = line.split()[1].rstrip("/")
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        ready.wait(timeout=120)
        if self.url is None:
            self.stop()
            raise RuntimeError("trajforge view did not start:\n" + "".join(self.output))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def served(viewer_dataset, viewer_export, tokenizer_dir) -> Iterator[Served]:
    """`trajforge view` over the pipeline-like root holding the dataset and the export."""
    root = viewer_dataset.parent.parent
    args = [str(root), "--port", "0"] + (["--tokenizer", str(tokenizer_dir)] if tokenizer_dir else [])
    server = Served(args)
    yield server
    server.stop()
    assert server.proc.returncode is not None
