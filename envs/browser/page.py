"""What the agent sees of a page: element ids in the DOM, the accessibility tree as text, capped HTML.

Every element of the page gets a stable id in a `bid` attribute (as BrowserGym does): an element
keeps its id for as long as it lives, new elements get the next number, a copy of an element
(cloneNode copies attributes) gets a new one. Actions address elements by these ids, and the same
actions on the same page give the same ids, so replayed episodes line up.

The accessibility tree is Chromium's own (CDP `Accessibility.getFullAXTree`), each node joined to
its element's `bid` through the DOM's backend node ids, printed one node a line:

    RootWebArea 'Shop', focused
    	[12] link 'Cart'
    	[15] textbox 'Search' value='socks', required
    	[17] checkbox 'Gift wrap', checked=false

Unnamed generic containers are left out (their children move up); a static text already said by
its parent's name is not repeated. Only the main frame is read (iframes are not).
"""

from __future__ import annotations

import asyncio
from typing import Any

BID_ATTR = "bid"

# Marks every element with a bid and writes live form state (text typed, boxes checked) into attributes
# so the HTML shows what the page shows (never a password).
MARK_ELEMENTS_JS = """() => {
  const attr = '%s';
  if (!('__bidCounter' in window)) window.__bidCounter = 0;
  const NOT_TEXT = new Set(['checkbox', 'radio', 'button', 'submit', 'reset', 'hidden', 'image', 'file', 'password']);
  const seen = new Set();
  const stack = [document.documentElement];
  while (stack.length) {
    const el = stack.pop();
    if (!el || el.nodeType !== 1) continue;
    let bid = el.getAttribute(attr);
    if (bid === null || seen.has(bid)) {
      bid = String(window.__bidCounter++);
      el.setAttribute(attr, bid);
    }
    seen.add(bid);
    const tag = el.tagName;
    const textual = tag === 'TEXTAREA' || (tag === 'INPUT' && !NOT_TEXT.has(el.type));
    if (textual && el.getAttribute('value') !== String(el.value)) el.setAttribute('value', el.value);
    if (tag === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio')) {
      if (el.checked) el.setAttribute('checked', ''); else el.removeAttribute('checked');
    }
    for (let i = el.children.length - 1; i >= 0; i--) stack.push(el.children[i]);
    if (el.shadowRoot) for (let i = el.shadowRoot.children.length - 1; i >= 0; i--) stack.push(el.shadowRoot.children[i]);
  }
  return window.__bidCounter;
}""" % BID_ATTR

# Runs in every document of an episode: notes when the page opens a new tab (a link with a
# target, window.open), so the environment can wait for the tab and follow it.
WATCH_POPUPS_JS = """(() => {
  window.__openedTab = false;
  const open = window.open;
  window.open = function (...args) { window.__openedTab = true; return open.apply(this, args); };
  document.addEventListener('click', (event) => {
    const link = event.target instanceof Element ? event.target.closest('a[target], area[target]') : null;
    if (link && !['', '_self', '_parent', '_top'].includes(link.target)) window.__openedTab = true;
  }, true);
})();"""
# After an action: whether it opened a tab, and the MiniWoB page's reward state where there is one.
AFTER_ACTION_JS = """() => {
  const opened = window.__openedTab === true;
  window.__openedTab = false;
  const wob = typeof WOB_DONE_GLOBAL === 'undefined' ? null
    : [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_GLOBAL, WOB_REWARD_REASON];
  return {opened, wob};
}"""

SKIPPED_ROLES = frozenset({"InlineTextBox", "LineBreak", "ListMarker"})
CONTAINER_ROLES = frozenset({"generic", "none", "presentation"})
# Properties that say little to an agent (or repeat the line), and relations between nodes.
IGNORED_PROPERTIES = frozenset({
    "editable", "readonly", "level", "settable", "invalid", "focusable", "url", "roledescription",
    "hiddenRoot", "labelledby", "describedby", "controls", "owns", "flowto", "details", "errormessage",
    "activedescendant", "root", "live", "relevant", "atomic", "busy",
})
# Booleans worth printing when false (a collapsed section, an unpressed toggle).
KEEP_FALSE = frozenset({"expanded", "pressed"})


async def mark_elements(page: Any) -> None:
    await page.evaluate(MARK_ELEMENTS_JS)


async def axtree_text(cdp: Any, max_chars: int) -> str:
    """The page's accessibility tree as text with element ids (see the module doc), at most `max_chars`."""
    document, tree = await asyncio.gather(cdp.send("DOM.getDocument", {"depth": -1, "pierce": True}),
                                          cdp.send("Accessibility.getFullAXTree"))
    bids: dict[int, str] = {}
    _collect_bids(document["root"], bids)
    return cap_lines(flatten_axtree(tree["nodes"], bids), max_chars)


def _collect_bids(node: dict[str, Any], bids: dict[int, str]) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        attrs = n.get("attributes") or []
        for i in range(0, len(attrs) - 1, 2):
            if attrs[i] == BID_ATTR:
                bids[n["backendNodeId"]] = attrs[i + 1]
                break
        stack.extend(n.get("children") or [])
        stack.extend(n.get("shadowRoots") or [])


def flatten_axtree(nodes: list[dict[str, Any]], bids: dict[int, str]) -> str:
    """CDP AX nodes -> one line per node, indented by depth, with `[bid]` where the node is an element.

    A text whose element is an unnamed container left out (a clickable <span>) carries that
    element's id, so it can still be clicked.
    """
    if not nodes:
        return ""
    by_id = {n["nodeId"]: n for n in nodes}
    lines: list[str] = []
    # (node, depth, the name printed by the nearest printed ancestor, the bid of a left-out parent)
    stack: list[tuple[dict[str, Any], int, str, str | None]] = [(nodes[0], 0, "", None)]
    while stack:
        node, depth, parent_name, holder = stack.pop()
        role = _value(node.get("role")) or ""
        name = str(_value(node.get("name")) or "").strip()
        bid = bids.get(node.get("backendDOMNodeId", -1))
        printed, child_holder = False, None
        if not node.get("ignored") and role not in SKIPPED_ROLES:
            props = _properties(node)
            if role in CONTAINER_ROLES and not name and not props:
                child_holder = bid
            elif role == "StaticText" and (not name or name in parent_name):
                pass
            else:
                lines.append("\t" * depth + _line(node, role, name, props, bid or (holder if role == "StaticText" else None)))
                printed = True
        value = _value(node.get("value"))
        said = f"{name} {value}" if value not in (None, "") else name
        child_depth, child_parent = (depth + 1, said) if printed else (depth, parent_name)
        for child in reversed(node.get("childIds") or []):
            if child in by_id and child != node["nodeId"]:
                stack.append((by_id[child], child_depth, child_parent, child_holder))
    return "\n".join(lines)


def _line(node: dict[str, Any], role: str, name: str, props: list[str], bid: str | None) -> str:
    text = f"[{bid}] " if bid is not None else ""
    text += f"{role} {name!r}" if name else role
    value = _value(node.get("value"))
    if value not in (None, "") and str(value) != name:
        text += f" value={str(value)!r}"
    return ", ".join([text, *props])


def _properties(node: dict[str, Any]) -> list[str]:
    out = []
    for prop in node.get("properties") or []:
        name = prop.get("name")
        value = _value(prop.get("value"))
        if name in IGNORED_PROPERTIES or value is None or isinstance(value, (list, dict)):
            continue
        if value is True or value == "true":
            out.append(name)
        elif value is False or value == "false":
            if name in KEEP_FALSE or name == "checked":
                out.append(f"{name}=false")
        else:
            out.append(f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}")
    return out


def _value(field: Any) -> Any:
    return field.get("value") if isinstance(field, dict) else None


def cap_lines(text: str, max_chars: int) -> str:
    """`text` cut at a line boundary to at most `max_chars`, saying how many lines were cut."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    kept = text[: cut if cut > 0 else max_chars]
    return f"{kept}\n... ({text.count(chr(10), len(kept)) + (0 if cut > 0 else 1)} more lines cut)"


def cap_html(html: str, max_chars: int) -> str:
    if len(html) <= max_chars:
        return html
    return f"{html[:max_chars]}<!-- truncated: {len(html) - max_chars} more characters -->"
