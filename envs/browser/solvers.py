"""Scripted reference solutions for MiniWoB++ tasks: code that reads the page and returns actions.

A solver sees what an agent sees, the instruction and the accessibility tree with element ids,
and returns the next actions (an empty list when it has nothing more to do); the environment
calls it again on the page those actions led to, so multi-step tasks read their next page.
`BrowserEnv.reference_solution` runs them, which is what `trajforge envs check` replays to
validate the environment before an expensive run; they ship with the environment for that reason.

`SOLVERS` maps a MiniWoB page name to its solver. A run can add solvers for other pages with
`env_config.solvers: [my_package.my_solvers]`: modules with a `SOLVERS` dict of their own, which
take precedence.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from schemas.models import Action, ApiAction

Solver = Callable[[str, str], list[Action]]

_LINE = re.compile(r"""^(\t*)(?:\[([^\]]+)\] )?(\S+)(?: ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"))?(.*)$""")
_VALUE = re.compile(r"""^ value=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


@dataclass(frozen=True)
class Node:
    """One line of the accessibility tree text."""

    depth: int
    bid: str | None
    role: str
    name: str
    value: str | None
    props: str

    @property
    def checked(self) -> bool:
        return bool(re.search(r"(^|, )checked(,|$)", self.props))


def parse_axtree(text: str) -> list[Node]:
    """The lines of `envs.browser.page.flatten_axtree`'s text as nodes, in page order."""
    nodes = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        tabs, bid, role, quoted, rest = m.groups()
        value = None
        v = _VALUE.match(rest)
        if v is not None:
            value = ast.literal_eval(v.group(1))
            rest = rest[v.end():]
        nodes.append(Node(len(tabs), bid, role, ast.literal_eval(quoted) if quoted else "", value,
                          rest.lstrip(", ")))
    return nodes


def found(pattern: str, text: str) -> str:
    """The first group of `pattern` in `text`; LookupError when the page says something else."""
    m = re.search(pattern, text)
    if m is None:
        raise LookupError(f"{pattern!r} not in {text!r}")
    return m.group(1)


def quoted(instruction: str) -> list[str]:
    return re.findall(r'"([^"]*)"', instruction)


def click(bid: str | None) -> ApiAction:
    return ApiAction(function="click", arguments={"bid": bid})


def type_text(bid: str | None, text: str) -> ApiAction:
    return ApiAction(function="type", arguments={"bid": bid, "text": text})


def first(nodes: list[Node], role: str, name: str | None = None) -> Node:
    for n in nodes:
        if n.role == role and n.bid is not None and (name is None or n.name == name):
            return n
    raise LookupError(f"no {role} {name!r} on the page")


def all_of(nodes: list[Node], role: str) -> list[Node]:
    return [n for n in nodes if n.role == role and n.bid is not None]


# ---- the solvers ----------------------------------------------------------------------------------


def click_button(instruction: str, axtree: str) -> list[Action]:
    return [click(first(parse_axtree(axtree), "button", quoted(instruction)[0]).bid)]








def click_link(instruction: str, axtree: str) -> list[Action]:
    return [click(first(parse_axtree(axtree), "StaticText", quoted(instruction)[0]).bid)]


def click_dialog(instruction: str, axtree: str) -> list[Action]:
    return [click(first(parse_axtree(axtree), "button", "Close").bid)]


def click_tab(instruction: str, axtree: str) -> list[Action]:
    return [click(first(parse_axtree(axtree), "link", found(r"(Tab #\d+)", instruction)).bid)]


def _selected_names(instruction: str) -> list[str]:
    """'Select A, B and click Submit.' -> [A, B]; 'Select nothing and click Submit.' -> []."""
    what = found(r"^Select (.*?) and click Submit", instruction)
    return [] if what == "nothing" else [w.strip() for w in what.split(",") if w.strip()]


def click_checkboxes(instruction: str, axtree: str) -> list[Action]:
    nodes = parse_axtree(axtree)
    wanted = set(_selected_names(instruction))
    actions: list[Action] = [click(n.bid) for n in all_of(nodes, "checkbox") if (n.name in wanted) != n.checked]
    return actions + [click(first(nodes, "button", "Submit").bid)]


def click_option(instruction: str, axtree: str) -> list[Action]:
    nodes = parse_axtree(axtree)
    name = _selected_names(instruction)[0]
    return [click(first(nodes, "radio", name).bid), click(first(nodes, "button", "Submit").bid)]


def click_widget(instruction: str, axtree: str) -> list[Action]:
    kind = quoted(instruction)[0]
    nodes = parse_axtree(axtree)
    if kind in ("text", "textarea"):
        multiline = kind == "textarea"
        return [click(next(n.bid for n in all_of(nodes, "textbox") if ("multiline" in n.props) == multiline))]
    return [click(first(nodes, kind).bid)]


def choose_list(instruction: str, axtree: str) -> list[Action]:
    nodes = parse_axtree(axtree)
    option = found(r"^Select (.*) from the list", instruction)
    return [ApiAction(function="select_option", arguments={"bid": first(nodes, "combobox").bid, "options": option}),
            click(first(nodes, "button", "Submit").bid)]


def enter_text(instruction: str, axtree: str) -> list[Action]:
    nodes = parse_axtree(axtree)
    return [type_text(first(nodes, "textbox").bid, quoted(instruction)[0]), click(first(nodes, "button", "Submit").bid)]




def enter_password(instruction: str, axtree: str) -> list[Action]:
    nodes = parse_axtree(axtree)
    password = quoted(instruction)[0]
    return [type_text(n.bid, password) for n in all_of(nodes, "textbox")] + [click(first(nodes, "button", "Submit").bid)]


def login_user(instruction: str, axtree: str) -> list[Action]:
    nodes = parse_axtree(axtree)
    username, password = quoted(instruction)[:2]
    user_box, password_box = all_of(nodes, "textbox")[:2]
    return [type_text(user_box.bid, username), type_text(password_box.bid, password),
            click(first(nodes, "button", "Login").bid)]


def focus_text(instruction: str, axtree: str) -> list[Action]:
    return [click(first(parse_axtree(axtree), "textbox").bid)]




def use_autocomplete(instruction: str, axtree: str) -> list[Action]:
    """Type the prefix key by key; once the suggestions show, pick the one with the right ending."""
    nodes = parse_axtree(axtree)
    start, end = quoted(instruction)[:2]
    box = first(nodes, "textbox")
    if box.value and box.value.startswith(start) and box.value.endswith(end):
        return [click(first(nodes, "button", "Submit").bid)]
    for item in all_of(nodes, "StaticText"):
        if item.name.startswith(start) and item.name.endswith(end) and item.name != box.value:
            return [click(item.bid)]
    # The widget shows its suggestions after a delay: wait until they settle, then read them.
    wait = ApiAction(function="wait", arguments={"seconds": 0.5})
    if box.value != start:
        return [ApiAction(function="type", arguments={"bid": box.bid, "text": start, "keystrokes": True}), wait]
    return [wait]


SOLVERS: dict[str, Solver] = {
    "click-button": click_button,
    "click-checkboxes": click_checkboxes,
    "click-dialog": click_dialog,
    "click-link": click_link,
    "click-option": click_option,
    "click-tab": click_tab,
    "click-widget": click_widget,
    "choose-list": choose_list,
    "enter-password": enter_password,
    "enter-text": enter_text,
    "focus-text": focus_text,
    "login-user": login_user,
    "use-autocomplete": use_autocomplete,
    "use-autocomplete-nodelay": use_autocomplete,
}


def find_solver(page: str, modules: Sequence[str] = ()) -> Solver | None:
    """The solver for MiniWoB page `page`: from the named modules first (last wins), then the shipped ones."""
    for module in reversed(modules):
        try:
            extra = getattr(importlib.import_module(module), "SOLVERS")
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"env_config.solvers: {module!r} is not a module with a SOLVERS dict ({exc})") from None
        if page in extra:
            return extra[page]
    return SOLVERS.get(page)
