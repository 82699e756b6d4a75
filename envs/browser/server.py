"""Static folders served over HTTP on 127.0.0.1 (a free port), one server per folder per process.

MiniWoB++'s pages and a site shipped as files (`env_config.site_dir`) are served this way; the
server runs in a daemon thread, so it needs no event loop and ends with the process.
"""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_SERVERS: dict[Path, ThreadingHTTPServer] = {}
_LOCK = threading.Lock()


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves files without a log line per request, over kept-alive connections (a page loads many files)."""

    protocol_version = "HTTP/1.1"

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
