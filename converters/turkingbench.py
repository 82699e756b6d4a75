"""TurkingBench crowdsourcing web forms (JHU-CLSP/turking-bench) -> interlingua.

Raw format (one object per worker submission; learned from ADP's `datasets/turkingbench/extract_raw.py`,
`schema_raw.py`, `raw_to_standardized.py` and sample_raw.json; ADP builds it from each task's
`template.html` and one `batch.csv` row):
- `_id`: "<Task>__<row index>", e.g. "Dialog Human Evaluation__0".
- `Task`: the task's folder name in turking-bench.
- `Title`, `Description`, `Keywords`: the HIT's Mechanical Turk listing.
- `Template`: the task's HTML form, with `${column}` placeholders.
- `Answer`: {input field name: value} the worker submitted (batch.csv `Answer.*` columns, strings).
- any other key: an input column (a string) that fills the `${key}` placeholder.

Produces ADP's layout: the user asks to go to the task's page
(`https://turkingbench.github.io/tasks/<quoted _id>`) and follow its instructions, a `goto` to it,
the filled page (a web observation with that url and the page's html); then, for each form field in
document order whose name has an answer (hidden inputs and buttons skipped), the action that puts the
answer there and the whole page after it (re-serialized, as ADP does): `click` a radio / checkbox to
check it (or to uncheck one that starts checked when the answer is empty; "a|b" answers check each
listed checkbox), `select` a dropdown option, `modify_range` a slider, `type` into a text input /
textarea (only when the answer differs from what the field holds; numbers compare by value, "1" ==
"1.0"). Actions name the field by ADP's XPath (tag, name, then type and value where they apply);
a field whose XPath does not find exactly that field is skipped, as ADP does. The page is parsed and
serialized with lxml (libxml2), as ADP does, so observations are byte-identical to ADP's. Details keep
ADP's task / title / task_description / keywords.

Differs from ADP:
- ADP caches each task's parsed page across records and keeps mutating it, so a task's second record
  starts from the first one's answers; here every record starts from its own page.
- 11 templates build their fields with scripts; ADP renders those in a headless browser. `render`
  (html -> rendered html) does the same; the convert pipeline passes one that renders in Chromium
  with every network request refused (`pipelines.convert_render`: inline scripts run, scripts from
  a CDN do not). Without it those pages are parsed as shipped, their script-built fields are
  missing, and `details["dynamic_template"]` says "not rendered".
- A field name with both quote kinds (no valid XPath literal in ADP's form) or a select without
  options (ADP fails) is skipped instead of failing the record; skipped answers are listed in
  `details["skipped_fields"]`.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Callable

from lxml import etree

from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "turkingbench"
DATASET = "JHU-CLSP/turking-bench"
TASK_URL = "https://turkingbench.github.io/tasks/"
_XPATH = {"type": "string", "description": "XPath of the form field."}
TOOLS = [
    py_tool("goto", "Navigate to a URL.", {"url": "string"}),
    py_tool("click", "Click a radio button or checkbox.", {"xpath": _XPATH}),
    py_tool("type", "Type text into a text input or textarea, replacing its content.",
            {"xpath": _XPATH, "value": {"type": "string", "description": "The text to type."}}),
    py_tool("select", "Select an option of a dropdown.",
            {"xpath": _XPATH, "value": {"type": "string", "description": "The option's value."}}),
    py_tool("modify_range", "Set a slider (range input) to a value.",
            {"xpath": _XPATH, "value": {"type": "string", "description": "The value to set."}}),
]

RESERVED = frozenset({"_id", "Task", "Title", "Description", "Keywords", "Template", "Answer"})
# Tasks whose inputs are created by the template's scripts (ADP renders these in a browser).
DYNAMIC_TASKS = frozenset({
    "Gun violence structured extraction", "Scalar Adjective Ordering",
    "Passive voice Parents 1st-2nd Person Persuasiveness Comparison", "TrecQA", "Simplicity rating",
    "Sentence Compression", "Scalar Adjectives Identification", "HTER", "HTER - longer sentences",
    "neural-pop (PLAN evaluation) t5-human-test b", "Paraphrase Clustering with Merge",
})
_FIELDS_XPATH = " | ".join(f"//{tag}" for tag in
                           ("input", "textarea", "select", "crowd-checkbox", "crowd-slider", "crowd-input"))
_INPUT_TYPES = frozenset({"radio", "checkbox", "range", "hidden", "submit", "reset", "button"})
_NOT_ANSWERED = frozenset({"hidden", "submit", "reset", "button"})
_CHECKABLE = frozenset({"radio", "checkbox", "crowd-checkbox"})
_RANGES = frozenset({"range", "crowd-slider"})
Render = Callable[[str], str]


def numeric_equal(a: str, b: str) -> bool:
    """Equal as numbers when both parse ("1" == "1.0", as upstream answers vary), else as stripped text."""
    a, b = a.strip(), b.strip()
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def field_kind(el: Any) -> str:
    """ADP's element type: an input's type for radio/checkbox/range/hidden/buttons, else text; the tag otherwise."""
    tag = el.tag
    if tag == "input":
        typ = el.get("type")
        return typ if typ in _INPUT_TYPES else "text"
    if tag in ("select", "textarea") or tag.startswith("crowd-"):
        return tag
    return "text"


def field_xpath(el: Any, *, with_value: bool) -> str:
    """ADP's XPath for a field, spaces and all: `//tag[@name="n" and @type="t" and @value="v"]`."""
    name = el.get("name")
    if el.tag == "select":
        return f'//select[@name="{name}"]'
    typ = f'and @type="{el.get("type")}"' if el.get("type") else ""
    if not with_value:
        return f'//{el.tag}[@name="{name}" {typ}]'
    value = f'and @value="{el.get("value")}"' if el.get("value") else ""
    return f'//{el.tag}[@name="{name}" {typ} {value}]'


def fill(ctx: Ctx, record: dict[str, Any], template: str) -> str:
    """The template with each `${column}` replaced by the record's column value (ADP's order: record order)."""
    for key, value in record.items():
        if key in RESERVED:
            continue
        if not isinstance(value, str):
            ctx.fail(f"`{key}` is {type(value).__name__}, expected string")
        template = template.replace(f"${{{key}}}", value)
    return template


class _Form:
    """The parsed page and the trajectory being built from its fields."""

    def __init__(self, b: Builder, tree: Any) -> None:
        self.b = b
        self.tree = tree
        self.skipped: list[str] = []

    def finds_only(self, el: Any, xpath: str) -> bool:
        try:
            found = self.tree.xpath(xpath)
        except etree.XPathError:  # a name holding a quote of the literal's kind
            found = []
        if len(found) == 1 and found[0] is el:
            return True
        self.skipped.append(el.get("name"))
        return False

    def act(self, function: str, arguments: dict[str, Any]) -> None:
        self.b.api(function, arguments, thought=None)
        self.b.web(html=etree.tostring(self.tree).decode())

    def answer(self, el: Any, v: str) -> None:
        kind = field_kind(el)
        if kind in _CHECKABLE:
            self._check(el, kind, v)
        elif kind in _RANGES:
            if v and not numeric_equal(v, el.get("value", "")):
                xpath = field_xpath(el, with_value=False)
                if self.finds_only(el, xpath):
                    el.set("value", v)
                    self.act("modify_range", {"xpath": xpath, "value": v})
        elif kind == "select":
            self._select(el, v)
        else:  # text inputs, textareas, crowd-input and unknown controls holding text in `value`
            xpath = field_xpath(el, with_value=False)
            if not self.finds_only(el, xpath):
                return
            current = (el.text or "") if el.tag == "textarea" else el.get("value", "")
            if numeric_equal(current, v):
                return
            if el.tag == "textarea":
                el.text = v
            else:
                el.set("value", v)
            self.act("type", {"xpath": xpath, "value": v})

    def _check(self, el: Any, kind: str, v: str) -> None:
        xpath = field_xpath(el, with_value=True)
        if not self.finds_only(el, xpath):
            return
        # `checked` counts when its value is non-empty, as ADP reads it.
        if not v and el.get("checked"):
            del el.attrib["checked"]
            self.act("click", {"xpath": xpath})
        own = el.get("value", "on")
        wanted = numeric_equal(v, own)
        if not wanted and kind != "radio" and "|" in v:  # several checkboxes of one name: "a|b"
            wanted = any(numeric_equal(part, own) for part in v.split("|"))
        if v and not el.get("checked") and wanted:
            if kind == "radio":
                for other in self.tree.xpath("//input[@name=$name and @type='radio']", name=el.get("name")):
                    if other.get("checked"):
                        del other.attrib["checked"]
            el.set("checked", "checked")
            self.act("click", {"xpath": xpath})

    def _select(self, el: Any, v: str) -> None:
        xpath = field_xpath(el, with_value=False)
        if not self.finds_only(el, xpath):
            return
        options = el.xpath("./option")
        if not options:
            self.skipped.append(el.get("name"))
            return

        def value(o: Any) -> str:
            return o.get("value", o.text or "")

        if any(o.get("selected") is not None and numeric_equal(value(o), v) for o in options):
            return
        if all(o.get("selected") is None for o in options) and numeric_equal(value(options[0]), v):
            return  # the first option is selected by default
        if not any(numeric_equal(value(o), v) for o in options):
            return
        for o in options:
            if numeric_equal(value(o), v):
                o.set("selected", "selected")
            elif o.get("selected"):
                del o.attrib["selected"]
        self.act("select", {"xpath": xpath, "value": v})


@register(NAME, sources=[DATASET])
@guarded(("_id",))
def convert(record: Any, render: Render | None = None) -> Trajectory:
    ctx = Ctx(record, ("_id",), require_id=True)
    task = ctx.str_(record, "Task")
    title, description = ctx.str_(record, "Title"), ctx.str_(record, "Description")
    keywords = ctx.str_(record, "Keywords")
    answers = ctx.get(record, "Answer", dict)
    for name, value in answers.items():
        if not isinstance(value, str):
            ctx.fail(f"`Answer.{name}` is {type(value).__name__}, expected string")
    html = fill(ctx, record, ctx.str_(record, "Template"))
    dynamic = task in DYNAMIC_TASKS
    if dynamic and render is not None:
        html = render(html)
    tree = etree.HTML(html) if html.strip() else None
    if tree is None:
        ctx.fail("`Template` is empty")

    url = TASK_URL + urllib.parse.quote(str(record["_id"]))
    b = Builder(ctx, NAME, DATASET)
    b.text(f"Go to {url} and follow the instructions on the page", "user")
    b.api("goto", {"url": url}, thought=None)
    b.web(url=url, html=html)
    form = _Form(b, tree)
    for el in tree.xpath(_FIELDS_XPATH):
        name = el.get("name")
        if field_kind(el) in _NOT_ANSWERED or not name or answers.get(name) is None:
            continue
        form.answer(el, answers[name].strip())

    details: dict[str, Any] = {"task": task, "title": title, "task_description": description, "keywords": keywords}
    if dynamic:
        details["dynamic_template"] = "rendered" if render is not None else "not rendered"
    if form.skipped:
        details["skipped_fields"] = sorted(set(form.skipped))
    return b.build(tools=TOOLS, details=details, task_id=task)
