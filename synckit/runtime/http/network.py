"""Connections on asyncio's own transports: the protocol under ``ctx.http``.

:mod:`synckit.runtime.http.http1` speaks HTTP/1.1 over :class:`_Protocol` directly; the
httpcore transport built here (:func:`new_httpcore_transport`) is what it falls back to
while a mock (respx) patches httpx's or httpcore's transports.

httpx reaches the network through httpcore, whose default backend goes through anyio:
every read and every write of a connection opens a cancel scope with a deadline, maps
exceptions through a context manager and checks for cancellation twice. That was a
tenth of a trivial poll cycle's CPU (one GET, one empty page). :class:`AsyncioBackend`
does the same work with a plain :class:`asyncio.Protocol` per connection: bytes the
event loop receives wait in the protocol's buffer, a read that finds some takes them
without awaiting, and a deadline is set only when a read or write must actually wait.

It keeps httpcore's contract: reads return ``b""`` at end of stream; a connection reset
raises :class:`httpcore.ReadError` (or ``WriteError``), a deadline ``ReadTimeout`` /
``WriteTimeout``, a failed connect or TLS handshake ``ConnectError`` / ``ConnectTimeout``
(httpx turns them into its own exceptions, which synckit classifies); an idle connection
reads as ``is_readable`` when its peer has sent anything, an end of stream included, so
the pool does not reuse a connection the server closed.

:class:`Network` is how a connector's client reaches its API: through a proxy (the
``App``'s own, or the environment's ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` less
the hosts ``NO_PROXY`` names) and trusting which certificate authorities.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any, cast

import httpcore
import httpx
from httpcore._backends.base import SOCKET_OPTION, AsyncNetworkBackend, AsyncNetworkStream
from httpcore._utils import is_socket_readable

__all__ = ["AsyncioBackend", "Network", "new_httpcore_transport", "proxy_for"]

# Reading pauses while this much is buffered and not yet read (as asyncio's streams do).
_HIGH_WATER = 256 * 1024
# Happy eyeballs, as anyio's connect_tcp does it.
_HAPPY_EYEBALLS_DELAY = 0.25


#: The proxy URL schemes httpx speaks without an extra package.
PROXY_SCHEMES = ("http", "https")


@dataclasses.dataclass(frozen=True)
class Network:
    """How ``ctx.http`` reaches an API (``App(proxy=..., ca_bundle=...)``).

    ``proxy``: the URL of a proxy every request goes through (``http://`` or
    ``https://``, credentials in the URL if it wants them); ``None``: the environment's
    ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` (either case), less the hosts
    ``NO_PROXY`` names. ``ca_bundle``: a PEM file of the certificate authorities to trust
    instead of the default bundle (a company's own CA, a test server's).
    """

    proxy: str | None = None
    ca_bundle: str | None = None

    def proxies(self) -> dict[str, str]:
        """By scheme (``http``, ``https``, ``all``), the proxy to go through, and under
        ``no`` the hosts to reach directly (the environment's, read now)."""
        if self.proxy is not None:
            return {"all": self.proxy}
        found = urllib.request.getproxies_environment()
        proxies = {k: v for k, v in found.items() if k in ("http", "https", "all", "no") and v}
        for key in ("http", "https", "all"):
            url = proxies.get(key)
            if url is not None and "://" not in url:
                proxies[key] = f"http://{url}"  # ``proxy:3128``, as curl reads it
        return proxies


def proxy_for(proxies: Mapping[str, str], scheme: str, host: str, port: int) -> str | None:
    """The proxy a request to ``scheme://host:port`` goes through, or None (no proxy
    for its scheme, or ``NO_PROXY`` names its host: a suffix, ``*``, with or without the
    port)."""
    url = proxies.get(scheme) or proxies.get("all")
    if url is None:
        return None
    # The environment's NO_PROXY, as urllib reads it (its "no" entry says one is set).
    if "no" in proxies and urllib.request.proxy_bypass(f"{host}:{port}"):
        return None
    return url


#: The (error, timeout) exception classes a read or a write raises.
_Errors = tuple[type[Exception], type[Exception]]
_READ_ERRORS: _Errors = (httpcore.ReadError, httpcore.ReadTimeout)
_WRITE_ERRORS: _Errors = (httpcore.WriteError, httpcore.WriteTimeout)


class _Protocol(asyncio.Protocol):
    """One connection's buffer and the waits of the stream reading and writing it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        #: Whether any byte arrived since this was last cleared (a request's start).
        self.received_any = False
        self.error: BaseException | None = None
        self.reading_paused = False
        self.writing_paused = False
        self._waiters: list[asyncio.Future[None]] = []

    # -- asyncio's callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and not self.reading_paused and self.transport:
            self.transport.pause_reading()
            self.reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None and self.error is None:
            self.error = exc
        self.writing_paused = False
        self._wake()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake()

    # -- waiting -----------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait(self, limit: float | None) -> None:
        """Until the next callback (data, end of stream, room to write); TimeoutError
        after ``limit`` seconds (None: no limit)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            if limit is None:
                await waiter
            else:
                async with asyncio.timeout(limit):
                    await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    # -- reading and writing, with the caller's exception classes (httpcore's, httpx's) --

    async def receive(self, max_bytes: int | None, limit: float | None, errors: _Errors) -> bytes:
        """Up to ``max_bytes`` (None: all) of what arrived, waiting for some; ``b""`` at
        the end of the stream. ``errors``: the (error, timeout) classes to raise."""
        while not self.buffer and not self.eof:
            try:
                await self.wait(limit)
            except TimeoutError as exc:
                raise errors[1]("timed out reading the response") from exc
        if self.buffer:
            if max_bytes is None or max_bytes >= len(self.buffer):
                data = bytes(self.buffer)
                self.buffer.clear()
            else:
                data = bytes(self.buffer[:max_bytes])
                del self.buffer[:max_bytes]
            if self.reading_paused and len(self.buffer) <= _HIGH_WATER // 4 and self.transport:
                self.reading_paused = False
                self.transport.resume_reading()
            return data
        if self.error is not None:
            raise errors[0](_reason(self.error)) from self.error
        return b""

    async def send(self, data: bytes, limit: float | None, errors: _Errors) -> None:
        """Write ``data``, waiting while the transport's buffer is full. ``errors``: the
        (error, timeout) classes to raise."""
        if self.error is not None:
            raise errors[0](_reason(self.error)) from self.error
        transport = self.transport
        if transport is None or transport.is_closing():
            raise errors[0]("the connection is closed")
        transport.write(data)
        while self.writing_paused and not self.eof:
            try:
                await self.wait(limit)
            except TimeoutError as exc:
                raise errors[1]("timed out sending the request") from exc
        if self.error is not None:
            raise errors[0](_reason(self.error)) from self.error


class _Stream(AsyncNetworkStream):
    def __init__(self, protocol: _Protocol, transport: asyncio.Transport) -> None:
        self._protocol = protocol
        self._transport = transport

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 (httpcore's interface)
        return await self._protocol.receive(max_bytes, timeout, _READ_ERRORS)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 (httpcore's interface)
        if buffer:
            await self._protocol.send(buffer, timeout, _WRITE_ERRORS)

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(_reason(exc)) from exc
        if transport is None:  # the connection was lost during the handshake
            raise httpcore.ConnectError("the connection closed during the TLS handshake")
        self._protocol.transport = transport
        return _Stream(self._protocol, transport)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            p = self._protocol
            if p.buffer or p.eof:
                return True
            # What the loop has not read yet (a FIN just in): the socket itself.
            sock = self._transport.get_extra_info("socket")
            return sock is not None and is_socket_readable(sock)
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class AsyncioBackend(AsyncNetworkBackend):
    """httpcore's network backend on asyncio transports (see the module docstring)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Protocol,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                    **_happy_eyeballs(loop),
                )
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}:{port}") from exc
        except OSError as exc:
            raise httpcore.ConnectError(_reason(exc)) from exc
        return _opened(transport, protocol, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_unix_connection(_Protocol, path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"timed out connecting to {path}") from exc
        except OSError as exc:
            raise httpcore.ConnectError(_reason(exc)) from exc
        return _opened(transport, protocol, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _happy_eyeballs(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    # asyncio's own loop races IPv6 and IPv4 addresses; uvloop's create_connection has no
    # such argument (it tries the addresses in turn).
    if isinstance(loop, asyncio.BaseEventLoop):
        return {"happy_eyeballs_delay": _HAPPY_EYEBALLS_DELAY}
    return {}


def _opened(
    transport: asyncio.BaseTransport,
    protocol: _Protocol,
    socket_options: Iterable[SOCKET_OPTION] | None,
) -> _Stream:
    transport = cast(asyncio.Transport, transport)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
        except OSError as exc:
            transport.close()
            raise httpcore.ConnectError(_reason(exc)) from exc
    return _Stream(protocol, transport)


def new_httpcore_transport(ssl_context: ssl.SSLContext) -> httpx.AsyncHTTPTransport:
    """An ``httpx.AsyncHTTPTransport`` (httpx's defaults: 100 connections, 20 kept alive
    for 5 s, HTTP/1.1) whose connections go through :class:`AsyncioBackend`."""
    transport = httpx.AsyncHTTPTransport(verify=ssl_context)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5)
    # httpx takes no network backend, so its pool (httpcore's, kept in ``_pool`` by every
    # httpx since 0.18) is built again with this one and the same settings.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=AsyncioBackend(),
    )
    return transport
