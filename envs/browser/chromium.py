"""The system Chromium, one per process (per event loop), shared by every browser environment.

Playwright's own browser download is often unreachable (offline machines, CI without egress), so
the environment drives the system Chromium through Playwright's async API with `executable_path`.
`SharedBrowser` keeps one browser per event loop: environments `acquire()` it in `start()` and
`release()` it in `close()`; each episode opens its own isolated context, at most `limit` at once
(callers past the limit wait). The last release closes the browser, or, with `idle_s` > 0, leaves
it up that long for the next episode (runs that open one environment at a time then pay for one
launch, not one per episode); `close_idle_browsers()` closes such a browser at once (EnvFactory
calls it when a run ends).

No Chromium outlives the process: Chromium is a child of Playwright's driver, which kills the
browsers it launched when its pipe to this process closes (also after a kill -9 of this process).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import weakref
from pathlib import Path
from typing import Any

from envs.base import EnvError

LAUNCH_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    # WebRTC's STUN/UDP traffic does not pass the context's routes, so it would bypass the egress allowlist
    # (envs/browser/egress.py): only proxied routes, and there is no proxy, so a page gathers no ICE candidate
    # and sends no UDP. This is the switch of the `webrtc.ip_handling_policy` pref (Chromium and Chrome);
    # `--force-webrtc-ip-handling-policy` is gone from current builds (the system Chromium ignores it).
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
ENV_VAR = "TRAJFORGE_CHROMIUM"
INSTALL_HINT = "install it with 'apt-get install -y chromium' (or 'make system-deps'), or name it with " \
               f"env_config.chromium or ${ENV_VAR}"
CLOSE_TIMEOUT_S = 10.0


class ChromiumNotFound(EnvError):
    """No Chromium to drive; the message says how to get one."""


def find_chromium(configured: str | None = None) -> str:
    """The Chromium executable: the configured path, then $TRAJFORGE_CHROMIUM, then PATH."""
    for where, value in (("env_config.chromium", configured), (f"${ENV_VAR}", os.environ.get(ENV_VAR))):
        if value:
            path = shutil.which(value) or (value if Path(value).is_file() else None)
            if path is None or not os.access(path, os.X_OK):
                raise ChromiumNotFound(f"Chromium not found at {value!r} ({where}); {INSTALL_HINT}")
            return path
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise ChromiumNotFound(f"Chromium not found (looked for {', '.join(CANDIDATES)} on PATH); {INSTALL_HINT}")


class SharedBrowser:
    """One Chromium for the environments of one event loop, with a bounded number of open contexts."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.limit = 1
        self.users = 0
        self.open_contexts = 0
        self._playwright: Any = None
        self._browser: Any = None
        self._launch_lock = asyncio.Lock()
        self._slots = asyncio.Condition()
        self._closer: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    async def acquire(self, limit: int) -> None:
        """Count one more user and make sure the browser runs; `limit` raises the context bound."""
        self.users += 1
        self.limit = max(self.limit, limit)
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        try:
            await self._launch()
        except BaseException:
            await self.release(0)
            raise

    async def release(self, idle_s: float) -> None:
        """One user fewer; the last one closes the browser now (`idle_s` <= 0) or after `idle_s`."""
        self.users = max(0, self.users - 1)
        if self.users:
            return
        if idle_s <= 0:
            await self.shutdown()
        elif self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self._close_later(idle_s))

    async def _close_later(self, idle_s: float) -> None:
        try:
            await asyncio.sleep(idle_s)
        except asyncio.CancelledError:
            if self.users:
                raise  # a new user came: keep the browser
            if self._closer is None:
                return  # closed by close_idle_browsers()
            # Cancelled with no user left: the event loop is shutting down, and Playwright's own tasks
            # with it, so the browser cannot be asked to close. Stopping the driver closes its pipe, and
            # the driver then kills the browsers it launched; where Playwright's reader was cancelled
            # first, that happens when the driver is collected or the process exits.
            self._closer, self._browser = None, None
            await self._stop_driver(timeout_s=1.0)
            return
        self._closer = None
        await self.shutdown()

    async def _launch(self) -> None:
        async with self._launch_lock:
            if self.running:
                return
            await self._stop_driver()
            from playwright.async_api import Error as PlaywrightError
            from playwright.async_api import async_playwright

            self._playwright = await async_playwright().start()
            try:
                self._browser = await self._playwright.chromium.launch(
                    executable_path=self.executable, args=list(LAUNCH_ARGS), headless=True)
            except PlaywrightError as exc:
                await self._stop_driver()
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise EnvError(f"Chromium ({self.executable}) did not start: {first}") from None

    async def new_context(self, **options: Any) -> Any:
        """A fresh isolated context; waits while `limit` contexts are open. Close it with `close_context`."""
        async with self._slots:
            await self._slots.wait_for(lambda: self.open_contexts < self.limit)
            self.open_contexts += 1
        try:
            await self._launch()  # relaunch after a browser crash
            return await self._browser.new_context(**options)
        except BaseException:
            await self._free_slot()
            raise

    async def close_context(self, context: Any) -> None:
        try:
            await _quietly(context.close(), CLOSE_TIMEOUT_S)
        finally:
            await self._free_slot()

    async def _free_slot(self) -> None:
        async with self._slots:
            self.open_contexts -= 1
            self._slots.notify()

    async def shutdown(self) -> None:
        """Close the browser and Playwright's driver (idempotent)."""
        browser, self._browser = self._browser, None
        if browser is not None:
            await _quietly(browser.close(), CLOSE_TIMEOUT_S)  # stopping the driver kills one that would not close
        await self._stop_driver()

    async def _stop_driver(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        playwright, self._playwright = self._playwright, None
        if playwright is not None:
            await _quietly(playwright.stop(), timeout_s)


async def _quietly(closing: Any, timeout_s: float) -> None:
    """Await a close, bounded; its failure is fine: what it closes is dead already, or dies with its process."""
    try:
        await asyncio.wait_for(closing, timeout_s)
    except Exception:  # noqa: BLE001 - see above
        pass


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SharedBrowser]] = weakref.WeakKeyDictionary()


async def close_idle_browsers() -> None:
    """Close this event loop's browsers that no environment uses (those kept up for `idle_s`)."""
    for shared in list(_SHARED.get(asyncio.get_running_loop(), {}).values()):
        if shared.users == 0:
            if shared._closer is not None:
                shared._closer.cancel()
                shared._closer = None
            await shared.shutdown()


def shared_browser(executable: str) -> SharedBrowser:
    """The browser of this event loop for `executable` (Playwright objects belong to one loop)."""
    per_loop = _SHARED.setdefault(asyncio.get_running_loop(), {})
    if executable not in per_loop:
        per_loop[executable] = SharedBrowser(executable)
    return per_loop[executable]
