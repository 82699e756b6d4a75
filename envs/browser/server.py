"""Static folders served over HTTP on 127.0.0.1 (a free port), one server per folder per process.

MiniWoB++'s pages and a site shipped as files (`env_config.site_dir`) are served this way; the
server runs in a daemon thread, so it needs no event loop and ends with the process.

Episodes open them at a stable origin, `http://NAME.localhost/` (`stable_base`), which the browser
environment's request route sends on to the server (`served_target`). The port changes from run
to run; the page's URL is in what the model reads, so with the port in it the same task would be a
different prompt each run: a greedy eval would not repeat itself and no response cache would answer.

Text is sent with the charset it is in: the one a file declares (a byte-order mark, an HTML
`<meta charset>` in its first 1024 bytes, a CSS `@charset`, an XML declaration), else UTF-8. Without
one, browsers decode a page as windows-1252 and every non-ASCII character comes out wrong
('ÖK' reads 'Ã–K').
"""

from __future__ import annotations

import codecs
import functools
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_SERVERS: dict[Path, ThreadingHTTPServer] = {}
_STABLE: dict[str, str] = {}  # stable base -> the base of the server behind it
_LOCK = threading.Lock()
_TEXT_TYPES = ("application/javascript", "application/json", "application/xml", "image/svg+xml",
               "application/xhtml+xml")
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16le"), (codecs.BOM_UTF16_BE, "utf-16be"))
# Where a file names its own encoding, in the first bytes the browser's own pre-scan reads.
_DECLARED = {
    "text/html": re.compile(rb"<meta[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9._:-]+)", re.IGNORECASE),
    "text/css": re.compile(rb'\A@charset\s+"([A-Za-z0-9._:-]+)"'),
    "xml": re.compile(rb"\A<\?xml[^>]*encoding\s*=\s*[\"']([A-Za-z0-9._:-]+)", re.IGNORECASE),
}


def declared_charset(path: str | Path, content_type: str) -> str | None:
    """The encoding a text file declares for itself (byte-order mark first), or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1024)
    except OSError:
        return None
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    pattern = _DECLARED.get("xml" if content_type.endswith("xml") else content_type)
    found = pattern.search(head) if pattern is not None else None
    if found is None:
        return None
    # Passed on as written: the browser, not Python, decides which names it knows.
    return found.group(1).decode("ascii").lower()


def content_type(path: str | Path, guessed: str) -> str:
    """`guessed` with the charset a text file is in: the one it declares, else UTF-8."""
    if not (guessed.startswith("text/") or guessed in _TEXT_TYPES) or "charset=" in guessed:
        return guessed
    return f"{guessed}; charset={declared_charset(path, guessed) or 'utf-8'}"


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves files without a log line per request, over kept-alive connections (a page loads many files)."""

    protocol_version = "HTTP/1.1"

    def guess_type(self, path: str | Path) -> str:  # type: ignore[override]
        return content_type(path, super().guess_type(path))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def serve_directory(directory: str | Path) -> str:
    """The base URL (ending in '/') of a server for `directory`, started on first use."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ValueError(f"{directory}: not a directory to serve")
    with _LOCK:
        server = _SERVERS.get(root)
        if server is None:
            server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name=f"serve {root.name}", daemon=True).start()
            _SERVERS[root] = server
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


def stable_base(directory: str | Path, name: str | None = None) -> str:
    """The base URL episodes open `directory` at: `http://NAME.localhost/`, the same in every run.

    NAME defaults to the folder's name as a host label; another folder under the same name in this
    process gets `NAME-2`, and so on."""
    real = serve_directory(directory)
    label = re.sub(r"[^a-z0-9-]+", "-", (name or Path(directory).resolve().name).lower()).strip("-")[:50] or "site"
    with _LOCK:
        base, n = f"http://{label}.localhost/", 2
        while _STABLE.get(base, real) != real:
            base, n = f"http://{label}-{n}.localhost/", n + 1
        _STABLE[base] = real
    return base


def served_target(url: str) -> str | None:
    """The URL on the local server behind `url` when it is under a stable base, else None."""
    for base, real in _STABLE.items():
        if url.startswith(base):
            return real + url[len(base):]
    return None
