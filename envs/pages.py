"""The elements of a page observation, whichever world wrote it, and actions described by their target.

Two accessibility-tree formats reach methods: the JSON of the built-in `web` shop and of the
LLM-simulated web env (`{"url", "title", "elements": [{"bid", "role", "name", "clickable"}, ...]}`,
possibly nested under `children`), and the text of the real browser (one node a line, indented by
depth, `[bid] role 'name' value='...', props`; `envs/browser/page.py`). `page_elements` reads
either into the same `PageElement`s, so exploration and retrieval work on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from envs.browser.solvers import parse_axtree
from schemas.models import ApiAction

# Text-format nodes that hold a whole search form (Enter in a text box there submits it).
SEARCH_ROLES = frozenset({"search", "searchbox"})


@dataclass(frozen=True)
class PageElement:
    """One element an action can address (it has a bid)."""

    bid: str
    role: str
    name: str = ""
    value: str | None = None
    props: str = ""
    options: tuple[str, ...] = ()  # the options of a select list
    clickable: bool = False  # JSON pages say so explicitly; text pages by role
    in_search: bool = False  # inside a search landmark

    def describe(self) -> str:
        """`link 'Red socks'` (role and name, as the accessibility tree shows it)."""
        return f"{self.role} {self.name!r}" if self.name else self.role


def page_elements(axtree: str | None) -> list[PageElement]:
    """The addressable elements of a page, in page order, from a JSON or a text accessibility tree."""
    text = (axtree or "").strip()
    if text.startswith(("{", "[")):
        try:
            return _json_elements(orjson.loads(text))
        except orjson.JSONDecodeError:
            pass
    return _text_elements(text)


def page_title(axtree: str | None) -> str:
    """The page's title: the JSON's `title`, or the text tree's root (`RootWebArea 'Title'`)."""
    text = (axtree or "").strip()
    if text.startswith("{"):
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return ""
        return str(data.get("title") or "") if isinstance(data, dict) else ""
    nodes = parse_axtree(text.split("\n", 1)[0])
    return nodes[0].name if nodes and nodes[0].role == "RootWebArea" else ""


def _json_elements(root: Any) -> list[PageElement]:
    out: list[PageElement] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
            continue
        if not isinstance(node, dict):
            continue
        bid = node.get("bid", node.get("id"))
        if "role" in node and bid is not None:
            options = node.get("options")
            out.append(PageElement(
                bid=str(bid), role=str(node["role"]), name=str(node.get("name") or ""),
                value=None if node.get("value") is None else str(node["value"]),
                props="disabled" if node.get("disabled") else "",
                options=tuple(str(o) for o in options) if isinstance(options, list) else (),
                clickable=bool(node.get("clickable"))))
        for key in ("elements", "children"):
            if isinstance(node.get(key), list):
                stack.append(node[key])
    return out


def _text_elements(text: str) -> list[PageElement]:
    nodes = parse_axtree(text)
    out: list[PageElement] = []
    ancestors: list[tuple[int, str]] = []  # (depth, role) of the nodes above the current one
    for i, node in enumerate(nodes):
        while ancestors and ancestors[-1][0] >= node.depth:
            ancestors.pop()
        if node.bid is not None:
            options: tuple[str, ...] = ()
            if node.role in ("combobox", "listbox"):
                below = []
                for child in nodes[i + 1:]:
                    if child.depth <= node.depth:
                        break
                    if child.role == "option":
                        below.append(child.name)
                options = tuple(below)
            out.append(PageElement(bid=node.bid, role=node.role, name=node.name, value=node.value, props=node.props,
                                   options=options, in_search=any(r in SEARCH_ROLES for _, r in ancestors)))
        ancestors.append((node.depth, node.role))
    return out


def describe_action(action: ApiAction, elements: list[PageElement]) -> str:
    """An action in words, naming its target by what the page showed: `click link 'Red socks'`,
    `type 'socks' into textbox 'Search'`, `goto cart.html` (the element's bid where it is not on the page)."""
    args = dict(action.arguments)
    bid = args.pop("bid", None)
    target = ""
    if bid is not None:
        element = next((e for e in elements if e.bid == str(bid)), None)
        target = element.describe() if element is not None else f"[{bid}]"
    if action.function == "type" and "text" in args:
        return f"type {str(args['text'])!r} into {target}".strip()
    if action.function == "select_option" and "options" in args:
        return f"select {args['options']!r} in {target}".strip()
    rest = " ".join(str(v) for k, v in sorted(args.items()) if isinstance(v, (str, int, float)) and k != "press_enter")
    return " ".join(x for x in (action.function, target, rest) if x)
