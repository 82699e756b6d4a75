"""Can the chat template show what is trained? TRL 1.16's qwen2_5_training, qwen3_training and llama3_training
(which renders neither tools nor tool calls) against rows with tool calls and tools: per row in `tokenized`
(refused in one line, or skipped by option), and in every TRL export's card."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from converters.export import ExportConfig, export
from converters.export.templates import CALLS_DROPPED, EMPTY_TURN, TOOLS_DROPPED, probe
from flows.cli import app
from tests.export import _data, _tiny
from tests.export.test_trl_trainers import _load

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (train extra)")
CHECKED = ("qwen2_5_training", "qwen3_training", "llama3_training")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    pair, chosen, rejected = _data.branch_pair()
    trajectories = [_data.tool_traj(), _data.masked_traj(), chosen, rejected]
    corpus = [t for traj in trajectories for s in traj.steps for t in _tiny.texts(s.model_dump())]
    return {"src": _data.store(root / "src", trajectories, [pair]), "root": root,
            "tokenizers": {name: _tiny.tokenizer_dir(root / name, name, corpus)
                           for name in ("qwen3_training", "llama3_training")}}


def test_what_each_template_shows_is_probed_by_rendering_it():
    assert [(probe(n).content, probe(n).tool_calls, probe(n).tools) for n in CHECKED] == [
        (True, True, True), (True, True, True), (True, False, False)]


def test_tokenized_checks_every_row_against_its_template(data, tmp_path):
    # qwen2_5_training renders what qwen3_training does (probed above; the cards check both).
    report = export(data["src"], tmp_path / "qwen3", ExportConfig(format="tokenized",
                                                                  tokenizer=str(data["tokenizers"]["qwen3_training"])))
    assert report.rows == 3 and not report.skipped.keys() - {"success = false (--include-failed keeps it)"}

    llama = str(data["tokenizers"]["llama3_training"])
    result = CliRunner().invoke(app, ["export", str(data["src"]), "--format", "tokenized", "--tokenizer", llama,
                                      "--output", str(tmp_path / "refused")])
    assert result.exit_code == 1, result.output
    line = " ".join(result.output.split())
    assert f"record t-tool: {CALLS_DROPPED}" in line and "llama3_training" in line and "--skip-unfit-rows" in line
    assert not list((tmp_path / "refused").glob("data/train-*"))

    report = export(data["src"], tmp_path / "skipped", ExportConfig(format="tokenized", tokenizer=llama,
                                                                    skip_unfit_rows=True))
    # t-tool (a call after a thought) and p1-good (a turn that only calls the calculator) are left out with the
    # reason; the masked code trajectory (no tools, text turns) renders whole.
    assert report.skipped[f"{CALLS_DROPPED} with the chat template"] == 1
    assert report.skipped[f"{EMPTY_TURN} with the chat template"] == 1
    assert _load(tmp_path / "skipped")["id"] == ["t-masked"]


def test_every_trl_card_says_which_bundled_templates_render_its_rows(data, tmp_path):
    for fmt in ("trl-sft", "trl-dpo"):
        out = tmp_path / fmt
        export(data["src"], out, ExportConfig(format=fmt))
        table = {t["template"]: t for t in json.loads((out / "card.json").read_text())["templates"]}
        readme = (out / "README.md").read_text()
        for name in ("qwen2_5_training", "qwen3_training"):
            assert table[name]["whole"] == table[name]["rows"] > 0, table[name]
            assert f"| `{name}` | {table[name]['rows']} of {table[name]['rows']} |" in readme
        llama = table["llama3_training"]
        assert "| `llama3_training` |" in readme and "do not use" in readme
        if fmt == "trl-dpo":  # the rejected side is a call-only turn: under Llama 3 it trains as an empty turn
            assert (llama["rows"], llama["whole"], llama[EMPTY_TURN], llama[CALLS_DROPPED], llama[TOOLS_DROPPED]) == (
                1, 0, 1, 0, 1)
        else:  # t-tool: a call-only turn (empty) and a call after a thought (dropped); p1-good: a call-only turn;
            # both have tools; the masked code trajectory's rows render whole
            assert (llama["rows"] - llama["whole"], llama[EMPTY_TURN], llama[CALLS_DROPPED], llama[TOOLS_DROPPED]) == (
                2, 2, 1, 2)
            assert "Llama 3's renders neither tools nor tool calls" in readme  # no longer listed as fine
