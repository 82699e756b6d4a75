"""Pages rendered in a headless Chromium, for converters that take a `render` function.

TurkingBench builds the form fields of 11 task templates with scripts; ADP renders those pages in
a browser before reading the fields, and so does the convert pipeline: a converter whose
function accepts `render` gets a `PageRenderer`, which starts Chromium on the first page it is
asked to render (most records need none) and closes it with the worker. Requests the page makes
are refused: the page's own scripts run, nothing is fetched from the network.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import shutil
from typing import Any

from converters.registry import ConverterInfo

_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 15_000


class PageRenderer:
    """html -> the page's html after its scripts ran (Chromium via Playwright, started lazily)."""

    def __init__(self, timeout_ms: int = TIMEOUT_MS) -> None:
        self.timeout_ms = timeout_ms
        self._playwright: Any = None
        self._browser: Any = None
        self._page: Any = None
        self.rendered = 0

    def __call__(self, html: str) -> str:
        if self._page is None:
            self._start()
        self._page.set_content(html, wait_until="load", timeout=self.timeout_ms)
        self.rendered += 1
        return self._page.content()

    def _start(self) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=shutil.which("chromium"), args=_ARGS)
        self._page = self._browser.new_page()
        self._page.route("**/*", lambda route: route.abort())  # the page's scripts run; nothing is fetched

    def close(self) -> None:
        if self._playwright is not None:
            self._browser.close()
            self._playwright.stop()
        self._playwright = self._browser = self._page = None


def with_renderer(info: ConverterInfo) -> tuple[ConverterInfo, PageRenderer | None]:
    """`info` with a renderer bound to its function if the function takes `render`."""
    if "render" not in inspect.signature(info.fn).parameters:
        return info, None
    renderer = PageRenderer()
    return dataclasses.replace(info, fn=functools.partial(info.fn, render=renderer)), renderer
