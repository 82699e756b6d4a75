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

Follows ADP: the placeholders are filled; the filled page is a web observation (its html); then, for
each form field in document order whose name has an answer (hidden inputs and buttons skipped),
the action that puts the answer there, as ADP decides it: `click` a radio / checkbox to check it
(or to uncheck one that starts checked when the answer is empty), `select` a dropdown option,
`modify_range` a slider, `type` into a text input / textarea (only when the answer differs from what
the field holds; numbers compare by value, "1" == "1.0"). Actions name the field by an XPath built
from its tag, name, type and value, as ADP does; fields whose XPath is not unique are skipped, as
ADP does. Details keep ADP's task / title / task_description / keywords.

Differs from ADP, which parses with lxml, re-serializes the whole page after every action and renders
11 script-built templates in a headless browser (Playwright):
- Parsed offline with the standard library's html.parser; no scripts run. For those 11 tasks
  (`details["dynamic_template"]`) the fields their scripts create are missing, so their answers land
  in `details["unmatched_answers"]` instead of becoming actions.
- The first observation also carries `axtree`: a compact text rendering of the page (visible text,
  each form field on its own line as `[kind] xpath state`), so the XPaths in the actions appear in
  what the agent sees. After each action the observation is that field's new line only, not the
  whole page again: the same information at a small fraction of ADP's size.
- A user text step states the task (title and description) first, and the run ends with `submit`.
- `checked` / `selected` count as set when present (HTML semantics; ADP reads an empty `checked=""`
  as unchecked); predicates are joined with " and " without ADP's stray spaces, and quotes in names
  are escaped rather than breaking the XPath; a select without options is skipped (ADP fails); a
  clicked radio stays checked in later observations (ADP's group reset also unchecks it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "turkingbench"
DATASET = "JHU-CLSP/turking-bench"
_XPATH = {"type": "string", "description": "XPath of the form field, as shown in the page observation."}
TOOLS = [
    py_tool("click", "Click a radio button or checkbox (checks it; unchecks a checked checkbox).",
            {"xpath": _XPATH}),
    py_tool("type", "Type text into a text input or textarea, replacing its content.",
            {"xpath": _XPATH, "value": {"type": "string", "description": "The text to type."}}),
    py_tool("select", "Select an option of a dropdown.",
            {"xpath": _XPATH, "value": {"type": "string", "description": "The option's value."}}),
    py_tool("modify_range", "Set a slider (range input) to a value.",
            {"xpath": _XPATH, "value": {"type": "string", "description": "The value to set."}}),
    py_tool("submit", "Submit the form."),
]

RESERVED = frozenset({"_id", "Task", "Title", "Description", "Keywords", "Template", "Answer"})
# Tasks whose inputs are created by the template's scripts (ADP renders these in a browser).
DYNAMIC_TASKS = frozenset({
    "Gun violence structured extraction", "Scalar Adjective Ordering",
    "Passive voice Parents 1st-2nd Person Persuasiveness Comparison", "TrecQA", "Simplicity rating",
    "Sentence Compression", "Scalar Adjectives Identification", "HTER", "HTER - longer sentences",
    "neural-pop (PLAN evaluation) t5-human-test b", "Paraphrase Clustering with Merge",
})
_FIELD_TAGS = frozenset({"input", "textarea", "select", "crowd-checkbox", "crowd-slider", "crowd-input"})
_INVISIBLE = frozenset({"script", "style", "head", "title", "noscript", "template"})
_BLOCKS = frozenset({
    "address", "article", "aside", "blockquote", "br", "center", "dd", "details", "div", "dl", "dt",
    "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
    "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table", "tbody", "thead", "tfoot",
    "tr", "ul",
})
_CHECKABLE = frozenset({"radio", "checkbox", "crowd-checkbox"})
_RANGES = frozenset({"range", "crowd-slider"})
_NOT_ANSWERED = frozenset({"hidden", "submit", "reset", "button"})
_SPACE = re.compile(r"\s+")


@dataclass
class Option:
    value: str
    selected: bool


@dataclass
class Field:
    """One form control of the page and its current state."""

    tag: str
    attrs: dict[str, str]
    text: str = ""  # a textarea's content
    options: list[Option] = field(default_factory=list)
    xpath: str = ""

    @property
    def kind(self) -> str:
        """ADP's element type: the input type for radio/checkbox/range/hidden/buttons, else text / the tag."""
        if self.tag == "input":
            typ = self.attrs.get("type", "")
            return typ if typ in ("radio", "checkbox", "range") or typ in _NOT_ANSWERED else "text"
        return self.tag

    @property
    def value(self) -> str:
        return self.text if self.tag == "textarea" else self.attrs.get("value", "")


class _Page(HTMLParser):
    """The page as a sequence of text runs, line breaks (None) and form fields, in document order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str | Field | None] = []
        self.fields: list[Field] = []
        self._skip = 0
        self._textarea: Field | None = None
        self._select: Field | None = None
        self._option: list[str] | None = None
        self._option_attrs: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _INVISIBLE:
            self._skip += 1
            return
        if tag in _BLOCKS:
            self.parts.append(None)
        amap = {k: v or "" for k, v in attrs}
        if tag == "option" and self._select is not None:
            self._close_option()
            self._option, self._option_attrs = [], amap
        elif tag in _FIELD_TAGS and self._skip == 0:
            f = Field(tag, amap)
            self.fields.append(f)
            self.parts += [None, f, None]
            self._textarea = f if tag == "textarea" else None
            self._select = f if tag == "select" else self._select

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag in _INVISIBLE:
            self._skip -= 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _INVISIBLE:
            self._skip = max(0, self._skip - 1)
        elif tag == "textarea":
            self._textarea = None
        elif tag == "option":
            self._close_option()
        elif tag == "select":
            self._close_option()
            self._select = None
        elif tag in _BLOCKS:
            self.parts.append(None)

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._textarea is not None:
            self._textarea.text += data
        elif self._option is not None:
            self._option.append(data)
        elif self._select is None:
            self.parts.append(data)

    def _close_option(self) -> None:
        if self._option is None or self._select is None:
            return
        text = "".join(self._option)
        self._select.options.append(Option(self._option_attrs.get("value", text), "selected" in self._option_attrs))
        self._option = None

    def close(self) -> None:
        super().close()
        self._close_option()


def numeric_equal(a: str, b: str) -> bool:
    """Equal as numbers when both parse ("1" == "1.0", as upstream answers vary), else as stripped text."""
    a, b = a.strip(), b.strip()
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def _literal(s: str) -> str:
    if '"' not in s:
        return f'"{s}"'
    if "'" not in s:
        return f"'{s}'"
    return "concat(" + ", '\"', ".join(f'"{p}"' for p in s.split('"')) + ")"


def _predicates(f: Field) -> list[tuple[str, str]]:
    """The attributes ADP's XPath for this field pins (name, then type and value where they apply)."""
    preds = [("name", f.attrs.get("name", ""))]
    if f.kind != "select" and f.attrs.get("type"):
        preds.append(("type", f.attrs["type"]))
    if f.kind in _CHECKABLE and f.attrs.get("value"):
        preds.append(("value", f.attrs["value"]))
    return preds


def _xpath(f: Field) -> str:
    return f"//{f.tag}[" + " and ".join(f"@{k}={_literal(v)}" for k, v in _predicates(f)) + "]"


def _line(f: Field) -> str:
    """One field as the agent sees it: `[kind] xpath state`."""
    head = f"[{f.kind}] {f.xpath}" if f.xpath else f"[{f.kind}]"
    if f.kind in _CHECKABLE:
        return f"{head} {'checked' if 'checked' in f.attrs else 'unchecked'}"
    if f.kind == "select":
        chosen = next((o.value for o in f.options if o.selected), f.options[0].value if f.options else "")
        values = json.dumps([o.value for o in f.options], ensure_ascii=False)
        return f"{head} options={values} selected={json.dumps(chosen, ensure_ascii=False)}"
    if f.kind in ("submit", "reset", "button"):
        return f"{head} {json.dumps(f.attrs.get('value', f.kind), ensure_ascii=False)}"
    return f"{head} value={json.dumps(f.value, ensure_ascii=False)}"


def render(parts: list[str | Field | None]) -> str:
    """The page as compact text: whitespace collapsed, one line per block, one per visible field."""
    lines: list[str] = []
    run: list[str] = []
    for part in parts + [None]:
        if isinstance(part, str):
            run.append(part)
        else:
            text = _SPACE.sub(" ", "".join(run)).strip()
            if text:
                lines.append(text)
            run = []
            if isinstance(part, Field) and part.kind != "hidden":
                lines.append(_line(part))
    return "\n".join(lines)


def fill(ctx: Ctx, record: dict[str, Any], template: str) -> str:
    """The template with each `${column}` replaced by the record's column value (ADP's order: record order)."""
    for key, value in record.items():
        if key in RESERVED:
            continue
        if not isinstance(value, str):
            ctx.fail(f"`{key}` is {type(value).__name__}, expected string")
        template = template.replace(f"${{{key}}}", value)
    return template


def _unique(f: Field, same_tag: list[Field]) -> bool:
    preds = _predicates(f)
    return sum(all(g.attrs.get(k) == v for k, v in preds) for g in same_tag) == 1


def _act(b: Builder, f: Field, v: str, fields: list[Field]) -> None:
    """Emit the action (and its observation) that sets field `f` to answer `v`, if it does not hold it yet."""
    kind = f.kind
    if kind in _CHECKABLE:
        checked = "checked" in f.attrs
        if not v and checked:
            del f.attrs["checked"]
        elif v and not checked and numeric_equal(v, f.attrs.get("value", "on")):
            f.attrs["checked"] = "checked"
            if kind == "radio":
                for g in fields:
                    if g is not f and g.tag == "input" and g.kind == "radio" and g.attrs.get("name") == f.attrs["name"]:
                        g.attrs.pop("checked", None)
        else:
            return
        b.api("click", {"xpath": f.xpath}, thought=None)
    elif kind in _RANGES:
        if not v or numeric_equal(v, f.attrs.get("value", "")):
            return
        f.attrs["value"] = v
        b.api("modify_range", {"xpath": f.xpath, "value": v}, thought=None)
    elif kind == "select":
        if not f.options or not any(numeric_equal(o.value, v) for o in f.options):
            return
        current = [o for o in f.options if o.selected] or f.options[:1]
        if any(numeric_equal(o.value, v) for o in current):
            return
        for o in f.options:
            o.selected = numeric_equal(o.value, v)
        b.api("select", {"xpath": f.xpath, "value": v}, thought=None)
    else:  # text inputs, textareas and unknown controls that hold their text in `value`
        if numeric_equal(f.value, v):
            return
        if f.tag == "textarea":
            f.text = v
        else:
            f.attrs["value"] = v
        b.api("type", {"xpath": f.xpath, "value": v}, thought=None)
    b.web(axtree=_line(f))


@register(NAME, sources=[DATASET])
@guarded(("_id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("_id",), require_id=True)
    task = ctx.str_(record, "Task")
    title, description = ctx.str_(record, "Title"), ctx.str_(record, "Description")
    keywords = ctx.str_(record, "Keywords")
    answers = ctx.get(record, "Answer", dict)
    for name, value in answers.items():
        if not isinstance(value, str):
            ctx.fail(f"`Answer.{name}` is {type(value).__name__}, expected string")
    html = fill(ctx, record, ctx.str_(record, "Template"))

    page = _Page()
    try:
        page.feed(html)
        page.close()
    except AssertionError:  # html.parser's reaction to some malformed markup declarations
        ctx.fail("`Template` is not parseable HTML")
    by_tag: dict[str, list[Field]] = {}
    for f in page.fields:
        by_tag.setdefault(f.tag, []).append(f)
        if f.attrs.get("name"):
            f.xpath = _xpath(f)

    b = Builder(ctx, NAME, DATASET)
    b.text(f"{title}\n{description}".strip(), "user")
    b.web(html=html, axtree=render(page.parts))
    ambiguous: set[str] = set()
    for f in page.fields:
        name = f.attrs.get("name")
        if f.kind in _NOT_ANSWERED or not name or name not in answers:
            continue
        if not _unique(f, by_tag[f.tag]):
            ambiguous.add(name)
            continue
        _act(b, f, answers[name].strip(), page.fields)
    b.api("submit", {}, thought=None)

    named = {f.attrs.get("name") for f in page.fields}
    details = {
        "task": task, "title": title, "task_description": description, "keywords": keywords,
        "dynamic_template": task in DYNAMIC_TASKS,
        "unmatched_answers": sorted(n for n in answers if n not in named),
        "ambiguous_fields": sorted(ambiguous),
    }
    return b.build(tools=TOOLS, details=details, task_id=task)
