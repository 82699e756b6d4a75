"""A seeded random walk over web pages: the next exploring action, with no model call.

The walk reads the page's elements (`envs.pages`: JSON pages of the `web` shop and the simulated
env, text pages of the real browser) and acts on one with the world's own tools: clicks links,
buttons, check boxes and tabs; types plausible text into text boxes (an address into an email
field, a word the page shows into a search box, which it then submits); picks an option of a
select list. Elements not acted on yet are preferred, so a short walk reaches more pages.
"""

from __future__ import annotations

import random
import re
from typing import Any, Sequence

from envs.pages import PageElement, page_elements
from schemas.models import ApiAction, Step, Tool, WebObservation

THOUGHT = "(exploring)"
CLICK_ROLES = frozenset({"link", "button", "checkbox", "radio", "tab", "menuitem", "menuitemcheckbox",
                         "menuitemradio", "switch", "treeitem"})
TEXT_ROLES = frozenset({"textbox", "searchbox", "spinbutton"})
NUMBER_ROLES = frozenset({"spinbutton", "slider"})
# Text for a text box, by the words of its name (the first row that matches wins: "username" is a
# user, not a name). Search boxes get a word the page shows instead.
PLAUSIBLE: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("email", "e-mail"), ("ada.lovelace@example.com", "grace.hopper@example.org")),
    (("password", "passcode"), ("correct-horse-42", "Tr0ub4dor&3")),
    (("phone", "tel", "mobile"), ("+1 555 0100", "555-0142")),
    (("zip", "postal", "postcode"), ("94110", "10001")),
    (("city", "town"), ("Springfield", "Lyon")),
    (("address", "street"), ("12 Main Street", "221B Baker Street")),
    (("date", "birthday"), ("2024-05-01", "2023-11-17")),
    (("quantity", "qty", "amount", "number", "count", "age"), ("2", "3")),
    (("first name", "firstname", "given"), ("Ada", "Grace")),
    (("last name", "lastname", "surname", "family"), ("Lovelace", "Hopper")),
    (("user", "login", "account"), ("ada", "ghopper")),
    (("name",), ("Ada Lovelace", "Grace Hopper")),
    (("subject", "title", "topic"), ("Question about my order", "Feedback")),
    (("message", "comment", "question", "feedback", "description", "review", "note", "text"),
     ("Hello, could you tell me when my order will arrive?", "Thanks for the quick delivery!")),
)
SEARCH_WORDS = ("search", "query", "find", "look up")
_WORD = re.compile(r"[A-Za-z][A-Za-z-]{2,}")
_SKIP_WORDS = frozenset({"search", "the", "and", "for", "with", "your", "back", "shop", "home", "cart", "go", "to"})


def _tool(tools: Sequence[Tool], name: str) -> Tool | None:
    return next((t for t in tools if t.name == name), None)


def _properties(tool: Tool | None) -> dict[str, Any]:
    return dict((tool.parameters or {}).get("properties", {})) if tool is not None else {}


def _id_argument(tool: Tool) -> str | None:
    """The argument that names the element (`bid` in the browser and the shops)."""
    props = _properties(tool)
    required = (tool.parameters or {}).get("required") or list(props)
    return "bid" if "bid" in props else (required[0] if required else None)


def _id_value(tool: Tool, arg: str, bid: str) -> Any:
    return int(bid) if _properties(tool).get(arg, {}).get("type") == "integer" and bid.isdigit() else bid


def is_search(element: PageElement) -> bool:
    name = element.name.lower()
    return element.role == "searchbox" or element.in_search or any(w in name for w in SEARCH_WORDS)


def plausible_text(element: PageElement, elements: Sequence[PageElement], rng: random.Random) -> str:
    """What a person might type into `element`: by its name, or (a search box) a word the page shows."""
    name = element.name.lower()
    if element.role in NUMBER_ROLES:
        return rng.choice(("1", "2", "3"))
    if not is_search(element):
        for words, values in PLAUSIBLE:
            # A word of the name starts with the key: "username" is a user, a "message" is not an "age".
            if any(re.search(rf"\b{re.escape(w)}", name) for w in words):
                return rng.choice(values)
        if "multiline" in element.props:
            return rng.choice(PLAUSIBLE[-1][1])
    shown = [w for e in elements if e is not element and e.role not in TEXT_ROLES
             for w in _WORD.findall(e.name) if w.lower() not in _SKIP_WORDS]
    return rng.choice(shown).lower() if shown else "help"


def exploring_actions(page: Step, tools: Sequence[Tool], rng: random.Random) -> list[tuple[PageElement, ApiAction]]:
    """One exploring action per element of `page` that the world's tools can act on, in page order."""
    if not isinstance(page, WebObservation):
        return []
    elements = page_elements(page.axtree)
    click, typing, select = _tool(tools, "click"), _tool(tools, "type"), _tool(tools, "select_option")
    out: list[tuple[PageElement, ApiAction]] = []
    for e in elements:
        if "disabled" in e.props:
            continue
        if e.options and select is not None and "options" in _properties(select):
            tool, extra = select, {"options": rng.choice(e.options)}
        elif (e.role in TEXT_ROLES or (e.role == "combobox" and not e.options)) and typing is not None \
                and "text" in _properties(typing):
            tool, extra = typing, {"text": plausible_text(e, elements, rng)}
            if is_search(e) and "press_enter" in _properties(typing):
                extra["press_enter"] = True  # a search shows its results on a page of their own
        elif (e.role in CLICK_ROLES or (e.clickable and e.role not in TEXT_ROLES)) and click is not None:
            tool, extra = click, {}
        else:
            continue
        arg = _id_argument(tool)
        if arg is not None:
            out.append((e, ApiAction(function=tool.name, arguments={arg: _id_value(tool, arg, e.bid), **extra},
                                     thought=THOUGHT)))
    return out


def random_action(page: Step, tools: Sequence[Tool], rng: random.Random,
                  tried: set[tuple[str, ...]] | None = None) -> ApiAction | None:
    """A random exploring action on `page`, or None when nothing there can be acted on.

    `tried` holds what the walk did already (url, tool, role, name): elements not acted on yet are
    chosen first, and the choice is added to it.
    """
    candidates = exploring_actions(page, tools, rng)
    if not candidates:
        return None
    url = page.url if isinstance(page, WebObservation) else None

    def key(element: PageElement, action: ApiAction) -> tuple[str, ...]:
        return (url or "", action.function, element.role, element.name)

    seen = tried if tried is not None else set()
    fresh = [c for c in candidates if key(*c) not in seen]
    element, action = rng.choice(fresh or candidates)
    seen.add(key(element, action))
    return action
