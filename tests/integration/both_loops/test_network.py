"""ctx.http's network backend (synckit.runtime.network) against httpx's own, over real
sockets: every test runs on both and expects the same answers and the same exceptions,
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

from synckit.runtime.network import new_transport
from synckit.testing import FakeAPI, Fault, Reply

TIMEOUT = httpx.Timeout(2.0, read=0.3)
BIG = 3 * 1024 * 1024  # past the backend's read buffer limit (it pauses reading)


@pytest.fixture(params=["httpx", "synckit"])
def make_transport(
    request: pytest.FixtureRequest,
) -> Callable[[ssl.SSLContext], httpx.AsyncHTTPTransport]:
    if request.param == "httpx":
        return lambda tls: httpx.AsyncHTTPTransport(verify=tls)
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
    api: FakeAPI, make_transport: Callable[[ssl.SSLContext], httpx.AsyncHTTPTransport]
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
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncHTTPTransport],
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    transport = make_transport(ssl.create_default_context())
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"http://127.0.0.1:{port}/")


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncHTTPTransport],
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
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncHTTPTransport],
) -> None:
    port, pem = tls_server
    trusting = ssl.create_default_context(cadata=pem.decode())
    async with httpx.AsyncClient(transport=make_transport(trusting), timeout=TIMEOUT) as c:
        for _ in range(2):
            assert (await c.get(f"https://localhost:{port}/")).text == "secret"


async def test_tls_to_an_untrusted_server_is_a_connect_error(
    tls_server: tuple[int, bytes],
    make_transport: Callable[[ssl.SSLContext], httpx.AsyncHTTPTransport],
) -> None:
    port, _ = tls_server
    default = ssl.create_default_context()  # does not trust the test's certificate
    async with httpx.AsyncClient(transport=make_transport(default), timeout=TIMEOUT) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"https://localhost:{port}/")
