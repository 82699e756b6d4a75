"""`tokenized` with templates TRL does not know: message spans by rendering, or one clear refusal."""

from __future__ import annotations

import importlib.util

import pytest

from converters.export import ExportConfig, export
from converters.export.run import ExportError
from tests.export import _data, _tiny
from tests.export.test_trl_trainers import _load

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

# A ChatML-like template of our own (no TRL training template matches it), with and without
# generation markers around what an assistant message writes.
_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\ntools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endgeneration %}"
    "{% else %}{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MARKED = _TEMPLATE
UNMARKED = _TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# Renders the last assistant message differently from earlier ones: spans cannot be found by rendering.
UNSTABLE = UNMARKED.replace("{{ m.content or '' }}", "{{ (m.content or '') if loop.last else '[earlier]' }}")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenized")
    trajectories = [_data.tool_traj(), _data.masked_traj(), _data.interleaved_traj(), _data.masked_observation_traj()]
    return _data.store(root / "src", trajectories), [t for traj in trajectories for s in traj.steps
                                                      for t in _tiny.texts(s.model_dump())]


def _twin(path, tokenizer_dir, chat: str):
    """The same tokenizer (same vocabulary) with another chat template."""
    tok = _tiny.load_tokenizer(tokenizer_dir)
    tok.chat_template = chat
    tok.save_pretrained(path)
    return path


def test_a_template_without_markers_gives_the_masks_its_marked_twin_gives(source, tmp_path):
    src, corpus = source
    marked = _tiny.tokenizer_dir(tmp_path / "marked", "", corpus, chat=MARKED)
    unmarked = _twin(tmp_path / "unmarked", marked, UNMARKED)
    a = export(src, tmp_path / "a", ExportConfig(format="tokenized", tokenizer=str(marked)))
    b = export(src, tmp_path / "b", ExportConfig(format="tokenized", tokenizer=str(unmarked)))
    assert "generation markers" in a.tokenizer["method"] and "prefix rendering" in b.tokenizer["method"]
    rows_a, rows_b = _load(tmp_path / "a"), _load(tmp_path / "b")
    assert rows_a["input_ids"] == rows_b["input_ids"] and rows_a["assistant_masks"] == rows_b["assistant_masks"]
    assert all(0 < sum(m) < len(m) for m in rows_b["assistant_masks"])


def test_a_template_that_renders_history_differently_is_refused_in_one_line(source, tmp_path):
    src, corpus = source
    unstable = _twin(tmp_path / "unstable", _tiny.tokenizer_dir(tmp_path / "marked", "", corpus, chat=MARKED), UNSTABLE)
    with pytest.raises(ExportError, match="renders earlier messages differently"):
        export(src, tmp_path / "c", ExportConfig(format="tokenized", tokenizer=str(unstable)))
    assert not list((tmp_path / "c" / "data").glob("train-*"))
