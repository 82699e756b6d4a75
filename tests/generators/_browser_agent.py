"""Scripted browser agents for the fake server: read the page the request shows, answer the next action.

A request's last message is the page the agent is on (`URL: ...` and the accessibility tree);
`moves` scripts are lists of functions of that page's nodes, one per action taken so far.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from backends.fake_server import ToolCallAnswer
from envs.browser.solvers import Node, parse_axtree

Move = Callable[[list[Node]], Any]


def text_of(message: dict[str, Any]) -> str:
    """A chat message's text (also of a multi-part message with images)."""
    content = message.get("content") or ""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return str(content)


def first_user(body: dict[str, Any]) -> str:
    return text_of(next(m for m in body["messages"] if m["role"] == "user"))


def call(name: str, **arguments: Any) -> ToolCallAnswer:
    return ToolCallAnswer(name, arguments)


def bid(nodes: list[Node], role: str, name: str = "") -> str:
    """The id of the first element with this role (and name)."""
    for node in nodes:
        if node.role == role and (not name or node.name == name) and node.bid:
            return node.bid
    raise AssertionError(f"no {role} {name!r} among {[(n.role, n.name) for n in nodes]}")


def next_move(body: dict[str, Any], moves: list[Move]) -> Any:
    """The move after the actions already answered, on the page of the request's last message."""
    done = sum(1 for m in body["messages"] if m["role"] == "tool")
    return moves[done](parse_axtree(text_of(body["messages"][-1])))


ORDER_SOCKS: list[Move] = [
    lambda p: call("click", bid=bid(p, "link", "Red socks")),
    lambda p: call("select_option", bid=bid(p, "combobox", "Quantity"), options="2"),
    lambda p: call("click", bid=bid(p, "button", "Add to cart")),
    lambda p: call("click", bid=bid(p, "link", "Go to the cart")),
    lambda p: call("type", bid=bid(p, "textbox", "Name"), text="Ada"),
    lambda p: call("click", bid=bid(p, "checkbox", "I accept the terms")),
    lambda p: call("click", bid=bid(p, "button", "Place order")),
    lambda p: "Your order of two pairs of red socks is placed.",
]


def login_credentials(nodes: list[Node]) -> tuple[str, str]:
    """The username and password MiniWoB's login-user page asks for (its instruction is at the top)."""
    texts = [n for n in nodes if n.role == "StaticText"]
    said = " ".join(n.name for n in texts if n.bid == texts[0].bid)
    found = re.search(r'username "(.+?)" and the password "(.+?)"', said)
    assert found, said
    return found.group(1), found.group(2)


def textboxes(nodes: list[Node]) -> list[str]:
    return [n.bid for n in nodes if n.role == "textbox" and n.bid]


LOGIN: list[Move] = [
    lambda p: call("type", bid=textboxes(p)[0], text=login_credentials(p)[0]),
    lambda p: call("type", bid=textboxes(p)[1], text=login_credentials(p)[1]),
    lambda p: call("click", bid=bid(p, "button", "Login")),
]
