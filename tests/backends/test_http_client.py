"""The lean HTTP/1.1 client: body framings, keep-alive reuse, dropped connections, TLS, fallbacks."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import ssl
from collections.abc import Awaitable, Callable

import orjson
import pytest

from backends import LLMRequestError
from backends.fake_server import Fault, Rule
from backends.http_client import HTTPClient, Unsupported

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]
OK_BODY = orjson.dumps(
    {"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
     "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
)


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head and Content-Length body), or None once the client closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


async def serve(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> tuple[asyncio.Server, list[bytes], list[int]]:
    """A raw server answering each request with `handler`; returns it, the requests, and connection ids."""
    requests: list[bytes] = []
    connections: list[int] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn_id = id(writer)
        try:
            while (request := await read_request(reader)) is not None:
                requests.append(request)
                connections.append(conn_id)
                await handler(request, writer)
                if writer.is_closing():
                    return
        finally:
            writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=ssl_context)
    return server, requests, connections


def url_of(server: asyncio.Server, scheme: str = "http", host: str = "127.0.0.1") -> str:
    return f"{scheme}://{host}:{server.sockets[0].getsockname()[1]}/v1/chat/completions"


def run(coro: Awaitable[object]) -> object:
    return asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_content_length_answers_reuse_one_connection():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        body = request.split(b"\r\n\r\n", 1)[1]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Req: %d\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), len(body), body))

    async def go():
        server, requests, connections = await serve(handler)
        client = HTTPClient(url_of(server), {"Content-Type": "application/json", "Authorization": "Bearer k-123"})
        answers = [await client.post(b'{"n": %d}' % i) for i in range(5)]
        await client.close()
        server.close()
        return answers, requests, connections

    answers, requests, connections = run(go())
    assert [a.body for a in answers] == [b'{"n": %d}' % i for i in range(5)]
    assert all(a.status == 200 and a.headers["x-req"] == "8" for a in answers)
    assert len(set(connections)) == 1, "sequential requests must share one keep-alive connection"
    head = requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert b"Authorization: Bearer k-123" in head and b"Content-Length: 8" in head
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in head)


def test_chunked_answer_split_across_writes_with_trailer():
    chunks = [b'{"choices": ', b"[]", b', "ok": true}']

    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for chunk in chunks:
            # Sizes, data and line ends arrive in separate packets, the way a streaming proxy sends them.
            writer.write(b"%x;ext=1\r\n" % len(chunk))
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(chunk + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\nX-Trailer: yes\r\n\r\n")

    async def go():
        server, _, connections = await serve(handler)
        client = HTTPClient(url_of(server), {})
        first = await client.post(b"{}")
        second = await client.post(b"{}")
        await client.close()
        server.close()
        return first, second, connections

    first, second, connections = run(go())
    assert first.body == second.body == b"".join(chunks)
    assert len(set(connections)) == 1


def test_close_delimited_answer_and_connection_close():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        if b'"close"' in request:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        else:  # no length at all: the body is whatever comes before the close
            writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async def go():
        server, _, connections = await serve(handler)
        client = HTTPClient(url_of(server), {})
        answers = [await client.post(b'"close"'), await client.post(b'"eof"'), await client.post(b'"close"')]
        await client.close()
        server.close()
        return answers, connections

    answers, connections = run(go())
    assert [a.body for a in answers] == [b"ok", b"until the end", b"ok"]
    assert len(set(connections)) == 3, "a connection the server closes is never reused"


def test_keep_alive_connection_dropped_while_idle_is_replaced():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        if b"drop" in request:
            writer.transport.abort()  # the server's keep-alive timeout, without a Connection: close

    async def go():
        server, requests, connections = await serve(handler)
        client = HTTPClient(url_of(server), {})
        first = await client.post(b'"drop"')
        await asyncio.sleep(0.1)  # idle time, in which the close arrives
        second = await client.post(b'"again"')
        await client.close()
        server.close()
        return first, second, requests, connections

    first, second, requests, connections = run(go())
    assert first.body == second.body == b"ok"
    assert len(requests) == 2 and len(set(connections)) == 2


def post_expecting(handler: Handler, error: type[Exception], match: str | None = None) -> list[bytes]:
    """POST once to a server answering with `handler`; the post must raise `error`. Returns the requests."""

    async def go() -> list[bytes]:
        server, requests, _ = await serve(handler)
        client = HTTPClient(url_of(server), {})
        try:
            with pytest.raises(error, match=match):
                await client.post(b"{}")
        finally:
            await client.close()
            server.close()
        return requests

    return run(go())


def test_connection_cut_mid_answer_is_a_connection_error():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"choices\"")
        await writer.drain()
        writer.transport.abort()

    post_expecting(handler, ConnectionError, "before the answer was complete")


def test_garbage_status_line_is_a_connection_error():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    post_expecting(handler, ConnectionError, "invalid HTTP response")


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v2/chat/completions\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n\x1f\x8b",
])
def test_redirects_and_encodings_are_unsupported(answer):
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(answer)

    requests = post_expecting(handler, Unsupported)
    assert b"Accept-Encoding: identity" in requests[0]


def test_cancelled_request_closes_its_connection():
    """A timed-out request's connection is closed at once: its late answer can never be misread."""

    async def go():
        closed = asyncio.Event()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await read_request(reader)
            if request is not None and b"slow" in request:
                await reader.read()  # never answers; returns once the client hangs up
                closed.set()
            elif request is not None:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfast")
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        client = HTTPClient(url_of(server), {})
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await client.post(b'"slow"')
        await asyncio.wait_for(closed.wait(), 2)
        answer = await client.post(b'"fast"')
        await client.close()
        server.close()
        return answer

    assert run(go()).body == b"fast"


def test_refused_connection_raises_oserror():
    async def go():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        url = url_of(server)
        server.close()
        await server.wait_closed()
        client = HTTPClient(url, {})
        with pytest.raises(OSError):
            await client.post(b"{}")

    run(go())


def test_one_client_under_two_event_loops(fake_server):
    srv = fake_server()
    client = HTTPClient(srv.base_url + "/chat/completions", {})
    body = orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})

    async def go() -> int:
        return (await client.post(body)).status  # the first loop's idle connection is left behind

    assert run(go()) == 200
    assert run(go()) == 200
    assert len(srv.log) == 2


def _self_signed(tmp_path) -> tuple[str, str]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_https_verifies_the_server_certificate(tmp_path, monkeypatch):
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)

    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsecured")

    async def go():
        server, requests, connections = await serve(handler, server_ctx)
        try:
            untrusted = HTTPClient(url_of(server, "https", "localhost"), {})
            with pytest.raises(ssl.SSLCertVerificationError):
                await untrusted.post(b"{}")
            monkeypatch.setenv("SSL_CERT_FILE", cert)  # read when the client builds its context
            trusted = HTTPClient(url_of(server, "https", "localhost"), {})
            answers = [await trusted.post(b"{}") for _ in range(2)]
            await trusted.close()
            return answers, connections
        finally:
            server.close()

    answers, connections = run(go())
    assert [a.body for a in answers] == [b"secured", b"secured"]
    assert len(set(connections)) == 1


# ---- through the openai backend --------------------------------------------------------------


def test_backend_falls_back_to_the_sdk_on_a_redirect(client, fake_server, caplog):
    """A proxy in front of the server redirects; the SDK follows redirects, so it takes over."""
    srv = fake_server()

    async def handler(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s/chat/completions\r\nContent-Length: 0\r\n\r\n"
                     % srv.base_url.encode())

    async def go():
        server, requests, _ = await serve(handler)
        proxy = srv.base_url.replace(str(srv.port), str(server.sockets[0].getsockname()[1]))
        async with client(srv, base_url=proxy) as llm:
            first = await llm.chat([{"role": "user", "content": "one"}])
            second = await llm.chat([{"role": "user", "content": "two"}])
            stats = llm.stats
        server.close()
        return first, second, stats, requests

    caplog.set_level(logging.INFO, "trajforge.backends")
    first, second, stats, requests = run(go())
    assert first[0].text == "echo[0]: one" and second[0].text == "echo[0]: two"
    assert stats.retries == 0 and stats.failures == 0
    lean = [r for r in requests if b"User-Agent: trajforge" in r]
    assert len(lean) == 1 and len(requests) == 3, "after the first redirect every request goes through the SDK"
    assert srv.asked() == ["one", "two"]
    assert "using the openai SDK transport" in caplog.text


def test_backend_answers_framing_and_errors_like_the_sdk(client, fake_server):
    """Same answers, statuses and error kinds from both transports for one scripted server."""
    srv = fake_server(rules=[Rule(match="bad", answer=Fault("404", message="no such model")),
                             Rule(match="json", answer={"a": [1, 2]})])

    async def go(transport: str):
        async with client(srv, transport=transport, max_retries=0) as llm:
            ok = await llm.chat([{"role": "user", "content": "json"}], n=2)
            with pytest.raises(LLMRequestError) as info:
                await llm.chat([{"role": "user", "content": "bad"}])
            return [(c.text, c.finish_reason, c.usage) for c in ok], info.value.kind, "no such model" in str(info.value)

    lean = run(go("http"))
    assert lean == run(go("openai"))
    assert lean[1:] == ("client", True)


def test_disconnect_on_a_reused_connection_is_a_counted_retry(client, fake_server):
    srv = fake_server(rules=[Rule(match="cut", answer=Fault("disconnect"), times=1)])

    async def go():
        async with client(srv) as llm:
            await llm.chat([{"role": "user", "content": "warm"}])  # leaves a keep-alive connection
            out = await llm.chat([{"role": "user", "content": "cut"}])
            return out, llm.stats

    out, stats = run(go())
    assert out[0].text == "echo[0]: cut"
    assert stats.retries == 1 and stats.calls == 3
    assert [e["outcome"] for e in srv.log] == ["ok", "disconnect", "ok"]
