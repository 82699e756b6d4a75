"""TurkingBench: worker submissions on HTML forms -> ADP's form-filling trajectories.

ADP's own sample (samples/adp/turkingbench) is compared step by step in test_samples.py and through
the CLI in test_cli_samples.py. Here: the fixture's trimmed ADP records (provenance in its
`_provenance`), and small inline forms for the controls those records lack (select, checkbox,
range, crowd elements).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

sys.path.insert(0, str(Path(__file__).parent))

from _compare import FIXTURES, load
from converters.errors import ConversionError
from converters.registry import get_converter
from converters.turkingbench import TASK_URL, convert

RECORDS = load(FIXTURES / "turkingbench.json")["records"]


def _record(task_id: str) -> dict[str, Any]:
    return copy.deepcopy(next(r for r in RECORDS if r["_id"] == task_id))


def _actions(t) -> list[tuple[str, dict]]:
    return [(s.function, s.arguments) for s in t.steps if s.kind == "api"][1:]  # after the goto


def _radio(name: str, value: str) -> str:
    return f'//input[@name="{name}" and @type="radio" and @value="{value}"]'


def _form(body: str, answers: dict[str, str], task: str = "Inline form", **columns: str) -> dict[str, Any]:
    return {"_id": f"{task}__0", "Task": task, "Title": "T", "Description": "D", "Keywords": "k",
            "Template": f"<form>{body}</form>", "Answer": answers, **columns}


def _page(t, i: int = -1) -> Any:
    return etree.HTML(t.steps[i].html)


def test_registered_under_adp_name() -> None:
    info = get_converter("turkingbench")
    assert info.fn is convert and info.sources == ["JHU-CLSP/turking-bench"]
    assert "lxml" in info.doc


def test_opens_like_adp_goto_task_page_then_page() -> None:
    raw = _record("Chatbot Response Quality Evaluation__0")
    t = convert(raw)
    url = TASK_URL + "Chatbot%20Response%20Quality%20Evaluation__0"
    assert (t.steps[0].kind, t.steps[0].source) == ("text", "user")
    assert t.steps[0].content == f"Go to {url} and follow the instructions on the page"
    assert (t.steps[1].function, t.steps[1].arguments) == ("goto", {"url": url})
    page = t.steps[2]
    assert page.kind == "web" and page.url == url and page.axtree is None
    assert page.html == raw["Template"].replace("${input1}", "See anything you like?").replace(
        "${sys11}", "I'll be right back.").replace("${sys12}", "I'll be right back.")
    assert t.provenance.source_id == "Chatbot Response Quality Evaluation__0"
    assert t.provenance.task_id == "Chatbot Response Quality Evaluation"
    assert t.details == {"task": "Chatbot Response Quality Evaluation", "title": raw["Title"],
                         "task_description": raw["Description"], "keywords": raw["Keywords"]}


def test_fixture_records_fill_their_forms_in_document_order() -> None:
    t = convert(_record("Chatbot Response Quality Evaluation__0"))
    assert _actions(t) == [
        ("click", {"xpath": _radio("grammar11", "Yes")}), ("click", {"xpath": _radio("coherence11", "Yes")}),
        ("click", {"xpath": _radio("interesting11", "Yes")}), ("click", {"xpath": _radio("grammar12", "No")}),
        ("click", {"xpath": _radio("coherence12", "Yes")}), ("click", {"xpath": _radio("interesting12", "Yes")}),
    ]
    # after each action, the whole page again with the field's new state (ADP's observation)
    assert [s.kind for s in t.steps[3:]] == ["api", "web"] * 6
    last = _page(t)
    assert all(last.xpath(a["xpath"])[0].get("checked") == "checked" for _, a in _actions(t))
    text = '//input[@name="{}" and @type="text"]'.format
    assert _actions(convert(_record("Event effect__0"))) == [
        ("click", {"xpath": _radio("xhaseff", "no")}),
        ("type", {"xpath": text("xeff2a"), "value": "{}"}),
        ("type", {"xpath": text("xeff3b"), "value": "{}"}),
        ("click", {"xpath": _radio("ohaseff", "yes")}),
        ("type", {"xpath": text("oeff4a"), "value": "Person Y goes to jail"}),
        ("type", {"xpath": text("oeff4b"), "value": "Person Y is expelled"}),
        ("type", {"xpath": '//textarea[@name="norational" ]', "value": "{}"}),
    ]
    dialog = convert(_record("Dialog Human Evaluation__0"))
    assert _actions(dialog)[1] == ("type", {"xpath": '//textarea[@name="q1" ]', "value": (
        "Overall, I find dialog a to be more engaging and overall higher quality compared to dialog b.")})
    assert _page(dialog).xpath('//textarea[@name="q1"]')[0].text.startswith("Overall, I find dialog a")


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
        '<input type="checkbox" name="multi" value="a"><input type="checkbox" name="multi" value="b">'
        '<input type="range" name="score" value="3">'
        '<input type="range" name="level" value="1">'
        '<crowd-checkbox name="sure"></crowd-checkbox>'
        '<crowd-input name="note"></crowd-input>'
        '<input type="hidden" name="secret" value="">'
        '<input name="plain" value="2">'
    )
    answers = {"lang": "fr", "keep": "b", "agree": "on", "spam": "", "multi": "a|b", "score": "3.0",
               "level": "4", "sure": "on", "note": "fine", "secret": "leaked", "plain": "2.0", "missing": "x"}
    t = convert(_form(body, answers))
    assert _actions(t) == [
        ("select", {"xpath": '//select[@name="lang"]', "value": "fr"}),
        ("click", {"xpath": '//input[@name="agree" and @type="checkbox" ]'}),
        ("click", {"xpath": '//input[@name="spam" and @type="checkbox" and @value="yes"]'}),  # uncheck
        ("click", {"xpath": '//input[@name="multi" and @type="checkbox" and @value="a"]'}),
        ("click", {"xpath": '//input[@name="multi" and @type="checkbox" and @value="b"]'}),
        ("modify_range", {"xpath": '//input[@name="level" and @type="range"]', "value": "4"}),
        ("click", {"xpath": '//crowd-checkbox[@name="sure"  ]'}),
        ("type", {"xpath": '//crowd-input[@name="note" ]', "value": "fine"}),
    ]
    page = _page(t)
    assert page.xpath('//select[@name="lang"]/option[@selected]')[0].get("value") == "fr"
    assert page.xpath('//input[@name="spam"]')[0].get("checked") is None
    assert page.xpath('//input[@name="level"]')[0].get("value") == "4"
    assert page.xpath('//input[@name="secret"]')[0].get("value") == ""  # hidden inputs are never filled


def test_radio_group_switch_and_ambiguous_fields() -> None:
    body = ('<input type="radio" name="r" value="a" checked><input type="radio" name="r" value="b">'
            '<input type="text" name="dup"><input type="text" name="dup">')
    t = convert(_form(body, {"r": "b", "dup": "x"}))
    assert _actions(t) == [("click", {"xpath": _radio("r", "b")})]
    assert [r.get("checked") for r in _page(t).xpath('//input[@name="r"]')] == [None, "checked"]
    assert t.details["skipped_fields"] == ["dup"]


def test_field_names_breaking_the_xpath_are_skipped() -> None:
    body = '<input type="text" name=\'say "hi"\'><input type="text" name="ok"><select name="empty"></select>'
    t = convert(_form(body, {'say "hi"': "hello", "ok": "y", "empty": "z"}))
    assert _actions(t) == [("type", {"xpath": '//input[@name="ok" and @type="text"]', "value": "y"})]
    assert t.details["skipped_fields"] == ["empty", 'say "hi"']


def test_script_built_template_is_rendered_when_a_renderer_is_given() -> None:
    body = '<div id="slots"></div><script>document.write(\'<input name="q1">\')</script>'
    record = _form(body, {"q1": "yes"}, task="TrecQA")
    plain = convert(record)
    assert _actions(plain) == [] and plain.details["dynamic_template"] == "not rendered"
    rendered = convert(record, render=lambda html: html.replace('<div id="slots"></div>', '<input name="q1">'))
    assert _actions(rendered) == [("type", {"xpath": '//input[@name="q1" ]', "value": "yes"})]
    assert rendered.details["dynamic_template"] == "rendered"


@pytest.mark.parametrize("mutate, problem", [
    (lambda r: r.pop("Template"), "missing key `Template`"),
    (lambda r: r.update(Answer=["q0"]), "`Answer` is list, expected object"),
    (lambda r: r["Answer"].update(q0=2), "`Answer.q0` is int, expected string"),
    (lambda r: r.update(dialoga=None), "`dialoga` is NoneType, expected string"),
    (lambda r: r.update(Title=7), "`Title` is int, expected string"),
    (lambda r: r.update(Template=" "), "`Template` is empty"),
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
