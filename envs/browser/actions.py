"""The browser's tools: JSON Schemas the agent sees, and what each does to a Playwright page.

Elements are addressed by the `bid` of the current observation. An action that cannot be done
(no such element, a hidden or disabled one, text typed into a button, nothing to go back to)
returns the reason as a string, which the environment turns into an `Error:` observation; the
page stays as it was. Only a page that stops answering is the world's failure (the environment
raises EnvError for it).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin, urlsplit

from envs.browser.page import BID_ATTR
from envs.toolspec import ToolSpec, obj

FINAL_ANSWER = "send_msg_to_user"
NAVIGATIONS = frozenset({"goto", "go_back"})  # given the navigation timeout, not the action timeout
SCROLL_FRACTION = 0.8  # one scroll moves this much of the viewport, so some context stays in view
ALLOWED_SCHEMES = ("http", "https")
MAX_WAIT_S = 10

_BID = {"type": "string", "pattern": r"^[A-Za-z0-9_-]+$",
        "description": "The id of an element: the number in brackets in the accessibility tree (the bid attribute)."}


class ActionFailed(Exception):
    """The action could not be done; the message is what the agent reads after 'Error: '."""


# One round trip instead of Playwright's count / is_visible / is_enabled (three).
_STATE_JS = """(bid) => {
  const el = document.querySelector(`[%s="${bid}"]`);
  if (el === null) return 'missing';
  if (!el.checkVisibility({visibilityProperty: true}) || el.getClientRects().length === 0) return 'hidden';
  return el.matches(':disabled') || el.getAttribute('aria-disabled') === 'true' ? 'disabled' : 'ok';
}""" % BID_ATTR


async def _element(page: Any, bid: str, *, enabled: bool = False) -> Any:
    state = await page.evaluate(_STATE_JS, bid)
    if state == "missing":
        raise ActionFailed(f"no element with bid '{bid}' on this page")
    if state == "hidden":
        raise ActionFailed(f"element [{bid}] is not visible")
    if enabled and state == "disabled":
        raise ActionFailed(f"element [{bid}] is disabled")
    return page.locator(f'[{BID_ATTR}="{bid}"]').first


async def click(page: Any, timeout_ms: float, bid: str) -> None:
    await (await _element(page, bid, enabled=True)).click(timeout=timeout_ms)


async def type_text(page: Any, timeout_ms: float, bid: str, text: str, press_enter: bool = False,
                    keystrokes: bool = False) -> None:
    element = await _element(page, bid, enabled=True)
    if keystrokes:
        await element.fill("", timeout=timeout_ms)
        await element.press_sequentially(text, timeout=timeout_ms)
    else:
        await element.fill(text, timeout=timeout_ms)
    if press_enter:
        await element.press("Enter", timeout=timeout_ms)


async def select_option(page: Any, timeout_ms: float, bid: str, options: str | list[str]) -> None:
    element = await _element(page, bid, enabled=True)
    chosen = await element.select_option(options, timeout=timeout_ms)
    if not chosen:
        raise ActionFailed(f"no option of [{bid}] matches {options!r}")


async def press(page: Any, timeout_ms: float, key: str, bid: str | None = None) -> None:
    if bid is None:
        await page.keyboard.press(key)
    else:
        await (await _element(page, bid)).press(key, timeout=timeout_ms)


async def scroll(page: Any, timeout_ms: float, direction: str, bid: str | None = None, pixels: int | None = None) -> None:
    script = "([dx, dy]) => window.scrollBy(dx, dy)"
    target = page
    if bid is not None:
        target = await _element(page, bid)
        script = "(el, [dx, dy]) => el.scrollBy(dx, dy)"
    if pixels is None:
        size = page.viewport_size or {"width": 800, "height": 600}
        pixels = int(SCROLL_FRACTION * (size["height"] if direction in ("up", "down") else size["width"]))
    dx, dy = {"up": (0, -pixels), "down": (0, pixels), "left": (-pixels, 0), "right": (pixels, 0)}[direction]
    await target.evaluate(script, [dx, dy])


async def hover(page: Any, timeout_ms: float, bid: str) -> None:
    await (await _element(page, bid)).hover(timeout=timeout_ms)


async def goto(page: Any, timeout_ms: float, url: str) -> None:
    target = urljoin(page.url, url.strip())
    if urlsplit(target).scheme not in ALLOWED_SCHEMES:
        raise ActionFailed(f"cannot open {url!r}: only http and https pages can be opened")
    await page.goto(target, timeout=timeout_ms)


async def wait(page: Any, timeout_ms: float, seconds: float) -> None:
    await page.wait_for_timeout(1000 * seconds)


async def go_back(page: Any, timeout_ms: float) -> None:
    if await page.go_back(timeout=timeout_ms) is None or page.url == "about:blank":
        if page.url == "about:blank":  # the blank page every tab starts on is not the agent's
            await page.go_forward(timeout=timeout_ms)
        raise ActionFailed("there is no previous page to go back to")


TOOL_SPECS: dict[str, ToolSpec] = {s.name: s for s in [
    ToolSpec("click", "Click an element.", obj({"bid": _BID}), click),
    ToolSpec("type", "Replace the text of a text field (or other editable element). press_enter presses Enter "
             "afterwards (submits most forms); keystrokes types key by key, for widgets that react to each key "
             "(autocomplete).",
             obj({"bid": _BID, "text": {"type": "string"}, "press_enter": {"type": "boolean"},
                  "keystrokes": {"type": "boolean"}}, required=["bid", "text"]), type_text),
    ToolSpec("select_option", "Choose option(s) of a <select> list, by their visible text or value.",
             obj({"bid": _BID, "options": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                                           "minItems": 1}]}}),
             select_option),
    ToolSpec("press", "Press a key or key combination (Enter, Tab, ArrowDown, Control+a), on an element if "
             "bid is given, else on whatever has the focus.",
             obj({"key": {"type": "string", "minLength": 1}, "bid": _BID}, required=["key"]), press),
    ToolSpec("scroll", "Scroll the page (or the element bid) up, down, left or right, by most of a screen unless "
             "pixels is given.",
             obj({"direction": {"type": "string", "enum": ["up", "down", "left", "right"]}, "bid": _BID,
                  "pixels": {"type": "integer", "minimum": 1}}, required=["direction"]), scroll),
    ToolSpec("hover", "Move the mouse over an element (opens hover menus, shows tooltips).", obj({"bid": _BID}), hover),
    ToolSpec("goto", "Open a URL (http or https; relative to the current page if relative).",
             obj({"url": {"type": "string", "minLength": 1}}), goto),
    ToolSpec("go_back", "Go back to the previous page.", obj({}), go_back),
    ToolSpec("wait", "Wait for the page to change (suggestions, animations, loading), then look again.",
             obj({"seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WAIT_S}}), wait),
    ToolSpec(FINAL_ANSWER, "Send the final answer (or a report of what was done) to the user; ends the episode.",
             obj({"text": {"type": "string"}}), lambda: None),
]}


def describe_failure(function: str, arguments: dict[str, Any], exc: Exception, timeout_ms: float) -> str:
    """One line on why Playwright refused an action, without its call log."""
    target = f" [{arguments['bid']}]" if "bid" in arguments else ""
    if type(exc).__name__ == "TimeoutError":
        if function in NAVIGATIONS:
            return f"{function}: the page did not load within {timeout_ms / 1000:g} s"
        return (f"{function}{target} did not finish within {timeout_ms / 1000:g} s (the element may be covered by "
                "another one, or still moving)")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{function}{target} failed: {first.split(': ', 1)[-1]}"
