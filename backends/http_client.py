"""A lean HTTP/1.1 client for JSON POSTs to one URL: keep-alive connections, one request on each.

The openai backend's hot path. On small machines the client's CPU, not the server, bounds how
many requests per second a job completes, and a general-purpose client spends most of that on
features an OpenAI-compatible endpoint never needs. This one is an asyncio Protocol per
connection: the request goes out in one write, the answer is parsed from the bytes as they arrive
(Content-Length, chunked, or read-until-close bodies). Proxies are not used. Answers it does not
handle (redirects, compressed bodies, 1xx) raise `Unsupported`, so the caller can resend them
through a full client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

_MAX_HEAD = 64 * 1024  # a status line and headers longer than this are not an API answer
_NO_BODY = frozenset({204, 304})


class Unsupported(Exception):
    """The server answered with something this client does not handle (redirect, encoding, 1xx)."""


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; `request` sends one message and resolves with its Response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = False
        self._waiter: asyncio.Future[Response] | None = None
        self._buf = bytearray()
        self._status = 0
        self._headers: dict[str, str] | None = None
        self._length: int | None = None  # body length; None with _chunked False = until close
        self._chunked = False
        self._parts: list[bytes] = []  # chunked body so far

    # ---- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection's state is unknown
            return
        self._buf += data
        try:
            self._parse()
        except (ValueError, IndexError, Unsupported) as exc:
            failure = exc if isinstance(exc, Unsupported) else ConnectionError(f"invalid HTTP response: {exc}")
            self._fail(failure)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        if self._headers is not None and self._length is None and not self._chunked:
            self._finish(bytes(self._buf))  # read-until-close body: the close is its end
            return
        reason = f": {exc}" if exc else ""
        self._waiter.set_exception(ConnectionError(f"connection closed before the answer was complete{reason}"))

    # ---- request ------------------------------------------------------------------------------

    async def request(self, message: bytes) -> Response:
        assert self.transport is not None
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._buf.clear()
        self._headers = None
        self.transport.write(message)
        try:
            return await waiter
        except BaseException:
            self.close()  # cancelled or failed mid-answer: what is still in transit is unknown
            raise
        finally:
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # ---- parsing ------------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        if self._headers is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise ValueError("header section too long")
                return
            self._parse_head(bytes(buf[:end]))
            del buf[: end + 4]
        if self._chunked:
            self._parse_chunks()
        elif self._length is not None and len(buf) >= self._length:
            if len(buf) > self._length:
                self.keep_alive = False  # more bytes than announced: do not trust the connection
            self._finish(bytes(buf[: self._length]))

    def _parse_head(self, head: bytes) -> None:
        status_line, _, rest = head.decode("latin-1").partition("\r\n")
        version, status_text = status_line.split(" ", 2)[:2]
        status = int(status_text)
        if not version.startswith("HTTP/1."):
            raise ValueError(f"unexpected status line {status_line[:80]!r}")
        headers: dict[str, str] = {}
        for line in rest.split("\r\n"):
            name, _, value = line.partition(":")  # no space may precede the colon (RFC 9112)
            headers[name.lower()] = value.strip()
        if status < 200 or 300 <= status < 400:
            raise Unsupported(f"HTTP {status}")
        if headers.get("content-encoding", "identity").lower() != "identity":
            raise Unsupported(f"content-encoding {headers['content-encoding']}")
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        self._status = status
        self._headers = headers
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if self._chunked:
            self._parts = []
            self._length = None
        elif status in _NO_BODY:
            self._length = 0
        elif "content-length" in headers:
            self._length = int(headers["content-length"])
        else:
            self._length = None
            self.keep_alive = False  # the body ends when the server closes the connection

    def _parse_chunks(self) -> None:
        buf = self._buf
        pos = 0
        while True:
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                break
            size = int(bytes(buf[pos:line_end]).split(b";", 1)[0], 16)
            if size == 0:
                # Optional trailers, then an empty line.
                end = buf.find(b"\r\n\r\n", line_end) if buf[line_end + 2 : line_end + 4] != b"\r\n" else line_end
                if end < 0:
                    break
                self.keep_alive = self.keep_alive and end + 4 == len(buf)
                self._finish(b"".join(self._parts))
                return
            if len(buf) < line_end + 2 + size + 2:
                break
            self._parts.append(bytes(buf[line_end + 2 : line_end + 2 + size]))
            pos = line_end + 2 + size + 2
        del buf[:pos]

    def _finish(self, body: bytes) -> None:
        assert self._waiter is not None and self._headers is not None
        if not self._waiter.done():
            self._waiter.set_result(Response(self._status, self._headers, body))

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()


class HTTPClient:
    """POSTs to one http(s) URL over a pool of keep-alive connections.

    The pool has no size limit of its own: the caller already bounds requests in flight, and each
    one holds its own connection. A client is bound to the event loop it first ran in; under a
    new loop it starts a fresh pool.
    """

    def __init__(self, url: str, headers: dict[str, str]):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = parts.scheme == "https"
        self._ssl: ssl.SSLContext | None = None
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # identity: a compressed answer would only be resent through the SDK, after it was paid for.
        lines = [f"POST {target} HTTP/1.1", f"Host: {host_header}", "User-Agent: trajforge", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        # Everything but the length is the same for every request: built once, as bytes.
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def post(self, body: bytes) -> Response:
        """Send `body`; raises ConnectionError/OSError on transport failures, Unsupported as above."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._drop_idle()
            self._loop = loop
        message = b"%s%d\r\n\r\n%s" % (self._head, len(body), body)
        # A connection the server closed while idle is dropped here. One that closes just as a
        # request goes out fails that request like any cut connection: a POST is never resent
        # behind the caller's back, whose retry layer counts and spaces the attempts.
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return await self._send(conn, message)
        return await self._send(await self._connect(loop), message)

    async def _send(self, conn: _Connection, message: bytes) -> Response:
        response = await conn.request(message)
        if conn.keep_alive and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
        return response

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        if self._tls and self._ssl is None:
            self._ssl = ssl.create_default_context()  # loads the CA bundle: once per client
        _, conn = await loop.create_connection(
            _Connection, self.host, self.port, ssl=self._ssl if self._tls else None,
            server_hostname=self.host if self._tls else None,
        )
        return conn

    def _drop_idle(self) -> None:
        for conn in self._idle:
            # A previous loop's transports cannot be closed once that loop is closed.
            with contextlib.suppress(RuntimeError):
                conn.close()
        self._idle.clear()

    async def close(self) -> None:
        self._drop_idle()
        await asyncio.sleep(0)  # let the transports' close callbacks run before the loop ends
