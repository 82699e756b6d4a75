"""Script-built TurkingBench pages are rendered in Chromium by the convert pipeline, as ADP renders them."""

from __future__ import annotations

from pathlib import Path

from converters.turkingbench import convert
from pipelines.convert import run_convert
from pipelines.convert_render import PageRenderer
from schemas.store import Dataset
from tests.pipelines._data import write_jsonl

SCRIPTED = ('<form><div id="slots"></div><script src="https://cdn.invalid/jquery.js"></script>'
            '<script>document.getElementById("slots").innerHTML = \'<input type="text" name="q1">\';</script></form>')


def _record(task: str, template: str) -> dict:
    return {"_id": f"{task}__0", "Task": task, "Title": "T", "Description": "D", "Keywords": "k",
            "Template": template, "Answer": {"q1": "yes"}}


def test_script_built_pages_are_rendered_and_static_ones_are_not(tmp_path: Path) -> None:
    dynamic = _record("TrecQA", SCRIPTED)
    static = _record("Static form", '<form><input type="text" name="q1"></form>')
    source = write_jsonl(tmp_path / "tb.jsonl", [dynamic, static])
    run_convert("turkingbench", [str(source)], str(tmp_path / "out"))
    written = {t.provenance.source_id: t for t in Dataset.open(tmp_path / "out").iter_records()}

    rendered = written["TrecQA__0"]
    actions = [(s.function, s.arguments) for s in rendered.steps if s.kind == "api"]
    assert actions[1:] == [("type", {"xpath": '//input[@name="q1" and @type="text"]', "value": "yes"})]
    assert rendered.details["dynamic_template"] == "rendered"
    assert '<div id="slots"><input type="text" name="q1"></div>' in rendered.steps[2].html
    renderer = PageRenderer()
    try:
        assert rendered == convert(dynamic, render=renderer)  # what the API gives with a renderer
    finally:
        renderer.close()
    assert "dynamic_template" not in written["Static form__0"].details
    assert written["Static form__0"] == convert(static)
