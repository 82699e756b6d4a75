"""The viewer's web server: the page and its assets, a JSON API over the sources, screenshots.

Starlette (installed with Prefect) serves `static/` (plain HTML, CSS and JS: nothing comes from a
CDN) and the API; uvicorn runs it on a socket the caller binds. Handlers are plain functions, run
in Starlette's thread pool, each with its own DuckDB cursor. The server only reads: shards through
DuckDB, images under a dataset directory (never outside it, never other files).

API (every answer JSON; an expected problem is `{"error": "<one line>"}` with status 400 or 404):

- `GET /api/sources`                    the datasets and exports shown, with their counts
- `GET /api/{i}/facets`                 `trajforge stats` of source i (cached per manifest version)
- `GET /api/{i}/list/{table}?q=&...`    a page of trajectories / filtered / pairs / quarantine / rows
- `GET /api/{i}/count/{table}?q=&...`   how many rows match (apart: a search counts by a full scan)
- `GET /api/{i}/trajectory?id=&table=`  one trajectory (or filtered record) and the pairs it is in
- `GET /api/{i}/pair?id=`               a pair with its chosen and rejected trajectories
- `GET /api/{i}/quarantined?id=`        the quarantined records with that id
- `GET /api/{i}/row?n=`                 row n of an export
- `GET /api/{i}/preview?format=&id=&table=` or `?format=&pair=`   export preview (+ loss tokens)
- `GET /api/locate?id=`                 which sources hold a trajectory id (parent links)
- `GET /media/{i}/{path}`               an image file under source i's directory
- `GET /api/reports`                    the eval and improve outputs shown
- `GET /api/report/{r}`                 one of them: an eval's tasks (pass@k, failures, episodes) or an
                                        improve run's before / after, rounds and lineage, linked to sources
- `GET /report-media/{r}/{path}`        an image (a plot) under report r's directory
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.staticfiles import StaticFiles

from viewer.api import NotFound, Viewer
from viewer.records import jsonable
from viewer.reports import Report
from viewer.sources import Source, ViewError

STATIC = Path(__file__).with_name("static")
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
               ".webp": "image/webp", ".bmp": "image/bmp"}


# ---- HTTP -------------------------------------------------------------------------------------------


def _answer(make: Callable[[], Any]) -> Response:
    try:
        return JSONResponse(jsonable(make()))
    except NotFound as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)
    except ViewError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)


def _index(request: Request) -> Any:
    try:
        return int(request.path_params["i"])
    except (KeyError, ValueError):
        raise ViewError("bad source index") from None


def media(viewer: Viewer, request: Request) -> Response:
    """An image under the source's directory: never a path outside it, never a file that is not an image."""
    try:
        source = viewer.store.source(_index(request))
    except ViewError as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)
    return image_under(source.path, request.path_params["path"])


def report_media(viewer: Viewer, request: Request) -> Response:
    try:
        report = viewer.report_at(_index(request))
    except ViewError as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)
    return image_under(report.path, request.path_params["path"])


def image_under(directory: Path, path: str) -> Response:
    """The image file `path` under `directory`, or a 4xx answer: never a file outside it or not an image."""
    root = directory.resolve()
    try:
        target = (root / path).resolve()
    except (ValueError, OSError, RuntimeError):  # a null byte, a name too long, a symlink loop
        return JSONResponse({"error": "not a valid file path"}, status_code=400)
    kind = IMAGE_TYPES.get(target.suffix.lower())
    if not target.is_relative_to(root) or kind is None:
        return JSONResponse({"error": "only images inside the dataset directory are served"}, status_code=403)
    if not target.is_file():
        return JSONResponse({"error": f"no image {path} in {directory}"}, status_code=404)
    return FileResponse(target, media_type=kind)


def host_name(header: str) -> str:
    """The host of a Host header without its port, normalised: `[::1]:8765` and `[0:0::1]` -> `::1`,
    `LocalHost:80` -> `localhost`."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal: [address] or [address]:port
        end = header.find("]")
        name = header[1:end] if end > 0 else header
    else:
        name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.rstrip(".")


class HostCheck:
    """Answers 400 to a request whose Host header names none of `allowed` (IPv4, IPv6 literals and
    names alike): a page elsewhere that rebinds its DNS name to loopback still sends its own name."""

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.allowed = {host_name(h) for h in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            header = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
            if host_name(header) not in self.allowed:
                response = JSONResponse({"error": f"Host {header!r} is not served here"}, status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(sources: list[Source], *, tokenizer: Path | None = None, allowed_hosts: list[str] | None = None,
               reports: list[Report] | None = None) -> Starlette:
    """The app over `sources` (and eval / improve `reports`). `allowed_hosts`: Host headers accepted (None: any),
    against DNS rebinding."""
    viewer = Viewer(sources, tokenizer, reports or [])

    def api(make: Callable[[Request], Any]) -> Callable[[Request], Response]:
        return lambda request: _answer(lambda: make(request))

    def q(request: Request) -> dict[str, str]:
        return dict(request.query_params)

    routes = [
        Route("/", lambda request: FileResponse(STATIC / "index.html")),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        Route("/api/sources", api(lambda r: viewer.sources())),
        Route("/api/locate", api(lambda r: viewer.locate(r.query_params.get("id", "")))),
        Route("/api/{i}/facets", api(lambda r: viewer.facets(_index(r)))),
        Route("/api/{i}/list/{table}", api(lambda r: viewer.page(_index(r), r.path_params["table"], q(r)))),
        Route("/api/{i}/count/{table}", api(lambda r: viewer.count(_index(r), r.path_params["table"], q(r)))),
        Route("/api/{i}/trajectory", api(lambda r: viewer.trajectory(
            _index(r), r.query_params.get("id", ""), r.query_params.get("table", "trajectories")))),
        Route("/api/{i}/pair", api(lambda r: viewer.pair(_index(r), r.query_params.get("id", "")))),
        Route("/api/{i}/quarantined", api(lambda r: viewer.quarantined(_index(r), r.query_params.get("id", "")))),
        Route("/api/{i}/row", api(lambda r: viewer.export_row(_index(r), _int_param(r, "n")))),
        Route("/api/{i}/preview", api(lambda r: viewer.preview(_index(r), r.query_params.get("format", ""), q(r)))),
        Route("/media/{i}/{path:path}", lambda r: media(viewer, r)),
        Route("/api/reports", api(lambda r: viewer.reports())),
        Route("/api/report/{i}", api(lambda r: viewer.report(_index(r)))),
        Route("/report-media/{i}/{path:path}", lambda r: report_media(viewer, r)),
    ]
    middleware = [Middleware(HostCheck, allowed=allowed_hosts)] if allowed_hosts else []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        viewer.warm()
        yield
        viewer.store.close()

    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.viewer = viewer
    return app


def _int_param(request: Request, name: str) -> int:
    try:
        return int(request.query_params.get(name, ""))
    except ValueError:
        raise ViewError(f"{name} must be an integer") from None


# ---- binding ----------------------------------------------------------------------------------------


def resolve_host(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """(family, address) to bind `host` to; ViewError when the name does not resolve."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ViewError(f"--host {host}: cannot resolve it ({exc})") from None
    return family, address


def is_loopback(address: tuple[Any, ...]) -> bool:
    return ipaddress.ip_address(address[0]).is_loopback


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port); ViewError when it cannot be had."""
    family, address = resolve_host(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ViewError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port") from None
    sock.listen(128)
    return sock


def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM); the socket is closed on the way out."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
