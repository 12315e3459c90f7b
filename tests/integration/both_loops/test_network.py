"""ctx.http's transport (synckit.runtime.http.http1, and the httpcore one of
synckit.runtime.http.network it falls back to under a mock) against httpx's own, over real
sockets: every test runs on each and expects the same answers and the same exceptions,
on asyncio's own event loop and on uvloop's (whose transports are not asyncio's classes
and whose create_connection takes no happy_eyeballs_delay)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from synckit.runtime.http.http1 import new_transport
from synckit.runtime.http.network import new_httpcore_transport
from synckit.testing import FakeAPI, Fault, Reply

TIMEOUT = httpx.Timeout(2.0, read=0.3)
BIG = 3 * 1024 * 1024  # past the backend's read buffer limit (it pauses reading)


@pytest.fixture(params=["httpx", "synckit", "synckit-httpcore"])
def make_transport(
    request: pytest.FixtureRequest,
) -> Callable[[ssl.SSLContext], httpx.AsyncBaseTransport]:
    """httpx's own transport, synckit's (h11, :mod:`synckit.runtime.http.http1`), and the
    httpcore one synckit falls back to under a mock: one contract."""
    if request.param == "httpx":
        return lambda tls: httpx.AsyncHTTPTransport(verify=tls)
    if request.param == "synckit-httpcore":
        return new_httpcore_transport
    return new_transport


@pytest.fixture
def api() -> FakeAPI:
    api = FakeAPI()
    api.route("GET", "/items", {"items": [1, 2, 3]})
    api.route("GET", "/big", lambda r: Reply(200, b"x" * BIG))
    api.route("POST", "/echo", lambda r: Reply.json({"length": len(r.body)}))
    return api


@pytest.fixture
async def http(
    api: FakeAPI, make_transport: Callable[[ssl.SSLContext], httpx.AsyncBaseTransport]
) -> AsyncIterator[httpx.AsyncClient]:
    transport = make_transport(ssl.create_default_context())
    async with (
        api.serve() as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT, transport=transport) as c,
    ):
        yield c


async def test_answers_and_bodies_both_ways(http: httpx.AsyncClient) -> None:
    """Requests on one kept-alive connection; a body larger than the read buffer arrives
    whole, and one larger than the write buffer is sent whole."""
    assert (await http.get("/items")).json() == {"items": [1, 2, 3]}
    assert len((await http.get("/big")).content) == BIG
    assert (await http.post("/echo", content=b"y" * BIG)).json() == {"length": BIG}
    assert (await http.get("/items")).status_code == 200


async def test_a_stalled_answer_is_a_read_timeout(api: FakeAPI, http: httpx.AsyncClient) -> None:
    api.script("GET", "/items", [Fault.timeout(delay=5)])
    with pytest.raises(httpx.ReadTimeout):
        await http.get("/items")
    assert (await http.get("/items")).status_code == 200


async def test_a_reset_is_a_read_error(api: FakeAPI, http: httpx.AsyncClient) -> None:
    api.script("GET", "/items", [Fault.connection_reset()])
    with pytest.raises(httpx.ReadError):
        await http.get("/items")
    assert (await http.get("/items")).status_code == 200


async def test_a_close_without_an_answer_is_a_protocol_error(
    api: FakeAPI, http: httpx.AsyncClient
) -> None:
    api.script("GET", "/items", [Fault.disconnect()])
    with pytest.raises(httpx.RemoteProtocolError):
        await http.get("/items")
    assert (await http.get("/items")).status_code == 200


async def test_nothing_listening_is_a_connect_error(
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncBaseTransport],
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    transport = make_transport(ssl.create_default_context())
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"http://127.0.0.1:{port}/")


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncBaseTransport],
) -> None:
    """A keep-alive connection the server closed between requests is noticed (its end of
    stream), so the next request goes on a new connection instead of failing."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive by the headers, closed all the same

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = make_transport(ssl.create_default_context())
    try:
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as c:
            for _ in range(3):
                assert (await c.get(f"http://127.0.0.1:{port}/")).text == "ok"
                await asyncio.sleep(0.05)
    finally:
        server.close()
        await server.wait_closed()
    assert connections == 3


# --- TLS ------------------------------------------------------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(pem)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path, pem


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, bytes]]:
    cert_path, key_path, pem = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert_path, key_path)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls)
    try:
        yield server.sockets[0].getsockname()[1], pem
    finally:
        server.close()
        await server.wait_closed()


async def test_tls_to_a_trusted_server(
    tls_server: tuple[int, bytes],
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncBaseTransport],
) -> None:
    port, pem = tls_server
    trusting = ssl.create_default_context(cadata=pem.decode())
    async with httpx.AsyncClient(transport=make_transport(trusting), timeout=TIMEOUT) as c:
        for _ in range(2):
            assert (await c.get(f"https://localhost:{port}/")).text == "secret"


async def test_tls_to_an_untrusted_server_is_a_connect_error(
    tls_server: tuple[int, bytes],
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncBaseTransport],
) -> None:
    port, _ = tls_server
    default = ssl.create_default_context()  # does not trust the test's certificate
    async with httpx.AsyncClient(transport=make_transport(default), timeout=TIMEOUT) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"https://localhost:{port}/")


# --- synckit's own transport (synckit.runtime.http.http1) ---------------------------------------


async def _serve(handler: Callable[..., object]) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    return server, server.sockets[0].getsockname()[1]


async def test_a_kept_alive_connection_dropped_without_an_answer_resends_a_get_not_a_post() -> None:
    """The server drops a kept-alive connection just as a request arrives on it, with no
    answer: a GET is sent once more on a new connection, a POST is not (the server may
    have acted on it), and a request on a new connection is never sent twice."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the next request on it: dropped
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server, port = await _serve(serve)
    url = f"http://127.0.0.1:{port}/"
    try:
        async with httpx.AsyncClient(
            transport=new_transport(ssl.create_default_context()), timeout=TIMEOUT
        ) as c:
            assert (await c.get(url)).text == "ok"
            assert (await c.get(url)).text == "ok"  # dropped on the first, sent again
            assert connections == 2
            with pytest.raises(httpx.RemoteProtocolError):
                await c.post(url, content=b"x")  # dropped on the second: not again
            assert connections == 2
    finally:
        server.close()
        await server.wait_closed()


async def test_a_full_pool_waits_for_a_connection_then_times_out(api: FakeAPI) -> None:
    from synckit.runtime.http.http1 import Http11Transport

    transport = Http11Transport(ssl.create_default_context(), max_connections=1)
    async with (
        api.serve() as base_url,
        httpx.AsyncClient(
            base_url=base_url, timeout=httpx.Timeout(2.0, pool=0.2), transport=transport
        ) as c,
    ):
        held = await c.send(c.build_request("GET", "/items"), stream=True)
        assert not transport.all_idle()
        with pytest.raises(httpx.PoolTimeout):
            await c.get("/items")
        waiting = asyncio.create_task(c.get("/items", timeout=2.0))
        await asyncio.sleep(0.05)
        await held.aread()
        await held.aclose()  # its connection goes to the waiting request
        assert (await waiting).json() == {"items": [1, 2, 3]}
        assert transport.all_idle()


async def test_an_answer_sent_while_the_body_is_still_going_out_is_read() -> None:
    """A server refusing a large upload answers at once (413) and closes: the answer is
    what the client sees, not the failed write."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()

    server, port = await _serve(serve)
    try:
        async with httpx.AsyncClient(
            transport=new_transport(ssl.create_default_context()), timeout=TIMEOUT
        ) as c:
            response = await c.post(f"http://127.0.0.1:{port}/", content=b"y" * (16 * BIG))
            assert (response.status_code, response.text) == (413, "big")
    finally:
        server.close()
        await server.wait_closed()


async def test_a_mock_router_sees_the_requests_of_synckits_transport(api: FakeAPI) -> None:
    """respx patches httpx's and httpcore's transports: while it does, synckit's sends its
    requests through httpcore, so the mock answers them (no server listens here)."""
    base = "https://api.invalid"
    transport = new_transport(ssl.create_default_context())
    with api.mock_router(base_url=base):
        async with httpx.AsyncClient(transport=transport, base_url=base, timeout=TIMEOUT) as c:
            assert (await c.get("/items")).json() == {"items": [1, 2, 3]}
