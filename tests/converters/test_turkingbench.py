"""TurkingBench: worker submissions on HTML forms -> form-filling trajectories, parsed offline.

The fixture holds trimmed copies of ADP's sample_raw.json records (provenance in its `_provenance`);
small inline forms cover the controls those records lack (select, checkbox, range, crowd elements).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _compare import FIXTURES, load
from converters.errors import ConversionError
from converters.registry import get_converter
from converters.turkingbench import convert

RECORDS = load(FIXTURES / "turkingbench.json")["records"]


def _record(task_id: str) -> dict[str, Any]:
    return copy.deepcopy(next(r for r in RECORDS if r["_id"] == task_id))


def _actions(t) -> list[tuple[str, dict]]:
    return [(s.function, s.arguments) for s in t.steps if s.kind == "api"]


def _after_actions(t) -> list[str]:
    """The observation following each action (the submit has none)."""
    return [t.steps[i + 1].axtree for i, s in enumerate(t.steps) if s.kind == "api" and i + 1 < len(t.steps)]


def _radio(name: str, value: str) -> str:
    return f'//input[@name="{name}" and @type="radio" and @value="{value}"]'


def _form(body: str, answers: dict[str, str], task: str = "Inline form", **columns: str) -> dict[str, Any]:
    return {"_id": f"{task}__0", "Task": task, "Title": "T", "Description": "D", "Keywords": "k",
            "Template": f"<form>{body}</form>", "Answer": answers, **columns}


def test_registered_under_adp_name() -> None:
    info = get_converter("turkingbench")
    assert info.fn is convert and info.sources == ["JHU-CLSP/turking-bench"]
    assert "html.parser" in info.doc


def test_chatbot_radios_in_document_order() -> None:
    t = convert(_record("Chatbot Response Quality Evaluation__0"))
    assert t.id.startswith("turkingbench/Chatbot Response Quality Evaluation__0~")
    assert t.provenance.source_id == "Chatbot Response Quality Evaluation__0"
    assert t.provenance.task_id == "Chatbot Response Quality Evaluation"
    assert [s.kind for s in t.steps[:2]] == ["text", "web"]
    assert t.steps[0].source == "user"
    assert t.steps[0].content == (
        "Judge the quality of responses to a prompt\n"
        "Given a prompt, your goal is to judge the quality of a set of computer-generated responses.")
    assert _actions(t) == [
        ("click", {"xpath": _radio("grammar11", "Yes")}), ("click", {"xpath": _radio("coherence11", "Yes")}),
        ("click", {"xpath": _radio("interesting11", "Yes")}), ("click", {"xpath": _radio("grammar12", "No")}),
        ("click", {"xpath": _radio("coherence12", "Yes")}), ("click", {"xpath": _radio("interesting12", "Yes")}),
        ("submit", {}),
    ]
    assert _after_actions(t) == [
        f"[radio] {_radio('grammar11', 'Yes')} checked", f"[radio] {_radio('coherence11', 'Yes')} checked",
        f"[radio] {_radio('interesting11', 'Yes')} checked", f"[radio] {_radio('grammar12', 'No')} checked",
        f"[radio] {_radio('coherence12', 'Yes')} checked", f"[radio] {_radio('interesting12', 'Yes')} checked",
    ]
    assert t.steps[-1].kind == "api" and t.steps[-1].function == "submit"
    assert {tool.name for tool in t.tools} == {"click", "type", "select", "modify_range", "submit"}
    assert t.details["task"] == "Chatbot Response Quality Evaluation"
    assert t.details["keywords"] == "research, language, sentence judgements, conversation, NLP"


def test_page_observation_is_filled_html_and_compact_text() -> None:
    raw = _record("Chatbot Response Quality Evaluation__0")
    page = convert(raw).steps[1]
    assert page.html == raw["Template"].replace("${input1}", "See anything you like?").replace(
        "${sys11}", "I'll be right back.").replace("${sys12}", "I'll be right back.")
    lines = page.axtree.split("\n")
    assert lines[:2] == ["Please Note", "You have to be an English Native Speaker."]
    assert "Prompt: See anything you like?" in lines and "System 2: I'll be right back." in lines
    assert f"[radio] {_radio('grammar11', 'No')} unchecked" in lines
    # the untouched feedback box keeps its default text; scripts and styles are not page text
    assert lines[-1] == '[textarea] //textarea[@name="comment"] value="None?"'
    assert "getCheckValue" not in page.axtree and "font-size" not in page.axtree


def test_event_effect_radios_text_inputs_and_textarea() -> None:
    t = convert(_record("Event effect__0"))
    text = '//input[@name="{}" and @type="text"]'.format
    assert _actions(t) == [
        ("click", {"xpath": _radio("xhaseff", "no")}),
        ("type", {"xpath": text("xeff2a"), "value": "{}"}),
        ("type", {"xpath": text("xeff3b"), "value": "{}"}),
        ("click", {"xpath": _radio("ohaseff", "yes")}),
        ("type", {"xpath": text("oeff4a"), "value": "Person Y goes to jail"}),
        ("type", {"xpath": text("oeff4b"), "value": "Person Y is expelled"}),
        ("type", {"xpath": '//textarea[@name="norational"]', "value": "{}"}),
        ("submit", {}),
    ]
    assert _after_actions(t)[4] == f'[text] {text("oeff4a")} value="Person Y goes to jail"'
    lines = t.steps[1].axtree.split("\n")
    assert "PersonX accuses PersonY" in lines
    assert '[submit] "Submit"' in lines  # unnamed button: shown, never acted on
    assert t.details["unmatched_answers"] == [] and t.details["ambiguous_fields"] == []


def test_dialog_radio_and_textarea() -> None:
    t = convert(_record("Dialog Human Evaluation__0"))
    assert _actions(t) == [
        ("click", {"xpath": _radio("q0", "2a")}),
        ("type", {"xpath": '//textarea[@name="q1"]', "value": "Overall, I find dialog a to be more engaging "
                                                              "and overall higher quality compared to dialog b."}),
        ("submit", {}),
    ]
    lines = t.steps[1].axtree.split("\n")
    # <br> inside the substituted column breaks lines as it does on the page
    assert lines[lines.index("Dialog B") + 1] == "Excuse me , sir , Is this the road to the peace Store ?"


def test_same_record_same_id_and_changed_record_new_id() -> None:
    raw = _record("Dialog Human Evaluation__0")
    assert convert(raw).id == convert(copy.deepcopy(raw)).id
    raw["Answer"]["q0"] = "1b"
    changed = convert(raw)
    assert changed.id != convert(_record("Dialog Human Evaluation__0")).id
    assert _actions(changed)[0] == ("click", {"xpath": _radio("q0", "1b")})


def test_select_checkbox_range_and_crowd_elements() -> None:
    body = (
        '<select name="lang"><option value="">--</option><option value="en">English</option>'
        '<option value="fr">French</option></select>'
        '<select name="keep"><option value="a">A</option><option value="b" selected>B</option></select>'
        '<input type="checkbox" name="agree">'
        '<input type="checkbox" name="spam" value="yes" checked>'
        '<input type="range" name="score" value="3">'
        '<input type="range" name="level" value="1">'
        '<crowd-checkbox name="sure"></crowd-checkbox>'
        '<crowd-input name="note"></crowd-input>'
        '<input type="hidden" name="secret" value="">'
        '<input name="plain" value="2">'
    )
    answers = {"lang": "fr", "keep": "b", "agree": "on", "spam": "", "score": "3.0", "level": "4",
               "sure": "on", "note": "fine", "secret": "leaked", "plain": "2.0", "missing": "x"}
    t = convert(_form(body, answers))
    assert _actions(t) == [
        ("select", {"xpath": '//select[@name="lang"]', "value": "fr"}),
        ("click", {"xpath": '//input[@name="agree" and @type="checkbox"]'}),
        ("click", {"xpath": '//input[@name="spam" and @type="checkbox" and @value="yes"]'}),  # uncheck
        ("modify_range", {"xpath": '//input[@name="level" and @type="range"]', "value": "4"}),
        ("click", {"xpath": '//crowd-checkbox[@name="sure"]'}),
        ("type", {"xpath": '//crowd-input[@name="note"]', "value": "fine"}),
        ("submit", {}),
    ]
    assert _after_actions(t) == [
        '[select] //select[@name="lang"] options=["", "en", "fr"] selected="fr"',
        '[checkbox] //input[@name="agree" and @type="checkbox"] checked',
        '[checkbox] //input[@name="spam" and @type="checkbox" and @value="yes"] unchecked',
        '[range] //input[@name="level" and @type="range"] value="4"',
        '[crowd-checkbox] //crowd-checkbox[@name="sure"] checked',
        '[crowd-input] //crowd-input[@name="note"] value="fine"',
    ]
    assert "secret" not in t.steps[1].axtree  # hidden inputs are neither shown nor filled
    assert t.details["unmatched_answers"] == ["missing"]


def test_radio_group_switch_and_ambiguous_fields() -> None:
    body = ('<input type="radio" name="r" value="a" checked><input type="radio" name="r" value="b">'
            '<input type="text" name="dup"><input type="text" name="dup">')
    t = convert(_form(body, {"r": "b", "dup": "x"}))
    assert _actions(t) == [("click", {"xpath": _radio("r", "b")}), ("submit", {})]
    assert t.details["ambiguous_fields"] == ["dup"]


def test_quotes_in_names_make_valid_xpath_literals() -> None:
    body = '<input type="text" name=\'say "hi"\'><input type="text" name="it\'s &quot;x&quot;">'
    t = convert(_form(body, {'say "hi"': "hello", 'it\'s "x"': "y"}))
    assert _actions(t)[:2] == [
        ("type", {"xpath": '//input[@name=\'say "hi"\' and @type="text"]', "value": "hello"}),
        ("type", {"xpath": '//input[@name=concat("it\'s ", \'"\', "x", \'"\', "") and @type="text"]', "value": "y"}),
    ]


def test_script_built_template_is_flagged() -> None:
    body = '<div id="slots"></div><script>document.write(\'<input name="q1">\')</script>'
    t = convert(_form(body, {"q1": "yes"}, task="TrecQA"))
    assert _actions(t) == [("submit", {})]
    assert t.details["dynamic_template"] is True and t.details["unmatched_answers"] == ["q1"]


@pytest.mark.parametrize("mutate, problem", [
    (lambda r: r.pop("Template"), "missing key `Template`"),
    (lambda r: r.update(Answer=["q0"]), "`Answer` is list, expected object"),
    (lambda r: r["Answer"].update(q0=2), "`Answer.q0` is int, expected string"),
    (lambda r: r.update(dialoga=None), "`dialoga` is NoneType, expected string"),
    (lambda r: r.update(Title=7), "`Title` is int, expected string"),
    (lambda r: r.update(Template="<p>''!<![f];C"), "`Template` is not parseable HTML"),
])
def test_malformed_records_name_record_and_problem(mutate, problem: str) -> None:
    raw = _record("Dialog Human Evaluation__0")
    mutate(raw)
    with pytest.raises(ConversionError) as err:
        convert(raw)
    assert str(err.value) == f"record 'Dialog Human Evaluation__0': {problem}"


def test_record_without_id_or_not_an_object() -> None:
    raw = _record("Event effect__0")
    del raw["_id"]
    with pytest.raises(ConversionError, match=r"missing or unreadable id \(`_id`\)"):
        convert(raw)
    with pytest.raises(ConversionError, match="record is list, expected an object"):
        convert([raw])
