"""HTTP/1.1 under ``ctx.http``: h11 on asyncio's own transports, with no httpcore between.

httpx's default transport goes through httpcore, whose pool takes three anyio locks per
request (each a cancel-shielded trip round the event loop), opens a trace context per step
and scans its connections twice per request. Measured on loopback, one sequential GET cost
~570 us of CPU in httpcore and httpx's wrapper around it, against ~120 us for h11's own
parsing and ~90 us for the socket: most of a trivial poll's HTTP time.
:class:`Http11Transport` does the same work directly: a connection per origin is taken
from an idle list, the request is written with h11, the answer's head read, and its body
streamed until the connection goes back to the list (read to the end) or is closed (not).

What it keeps of httpcore's contract, which synckit's classification relies on:
httpx's exceptions (``ConnectError`` / ``ConnectTimeout`` when connecting or in the TLS
handshake, ``ReadTimeout`` / ``WriteTimeout``, ``ReadError`` / ``WriteError`` on a reset,
``RemoteProtocolError`` for a peer that closes without an answer or breaks HTTP,
``PoolTimeout``); an idle connection the server closed (or wrote to) is never reused;
httpx's limits (100 connections, 20 kept alive for 5 s). A server that answers while the
request body is still being sent (a 413) has its answer read.

A request whose origin goes through a proxy (:class:`~synckit.runtime.http.network.Network`:
the App's, or the environment's less ``NO_PROXY``) goes through httpx's own transport for
that proxy (httpcore's: a ``CONNECT`` tunnel for ``https://``, forwarding for ``http://``).
A server whose certificate is not trusted is refused with one line naming it and the
verifier's reason.

When something has patched httpx's or httpcore's transports (respx's mock router does), the
request goes through :func:`synckit.runtime.http.network.new_httpcore_transport` instead, so a
mock sees it as it would see any httpx client's.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import h11
import httpcore
import httpx

from synckit.runtime.http.network import (
    _happy_eyeballs,
    _Protocol,
    _reason,
    new_httpcore_transport,
    proxy_for,
)

__all__ = ["Http11Transport", "new_transport", "untrusted"]

_DEFAULT_PORTS = {b"http": 80, b"https": 443}
# The functions respx (or any mock) replaces; compared before each request.
_POOL_HANDLE = httpcore.AsyncConnectionPool.__dict__["handle_async_request"]
_HTTPX_HANDLE = httpx.AsyncHTTPTransport.__dict__["handle_async_request"]
_BODY_ENDS = (h11.EndOfMessage, h11.ConnectionClosed)
_RESENDABLE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
_READ_ERRORS = (httpx.ReadError, httpx.ReadTimeout)
_WRITE_ERRORS = (httpx.WriteError, httpx.WriteTimeout)
#: Methods RFC 9110 calls idempotent: safe to send twice (ctx.http's inline resend
#: after a rate limit uses it too).
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


def _patched() -> bool:
    return (
        httpcore.AsyncConnectionPool.__dict__.get("handle_async_request") is not _POOL_HANDLE
        or httpx.AsyncHTTPTransport.__dict__.get("handle_async_request") is not _HTTPX_HANDLE
    )


class _Conn:
    """One connection: its protocol (the bytes received), transport and h11 state."""

    __slots__ = ("h11", "idle_since", "origin", "protocol", "transport", "used")

    def __init__(self, origin: tuple[bytes, str, int], protocol: _Protocol) -> None:
        self.origin = origin
        self.protocol = protocol
        self.transport = cast(asyncio.Transport, protocol.transport)
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        self.used = False  # has answered a request before

    def reusable(self, now: float, expiry: float) -> bool:
        """Idle, within its keep-alive, and nothing heard from the server meanwhile (an end
        of stream, or bytes no request asked for)."""
        p = self.protocol
        return (
            now - self.idle_since < expiry
            and not p.buffer
            and not p.eof
            and not self.transport.is_closing()
            and self.h11.our_state is h11.IDLE
        )

    def close(self) -> None:
        self.transport.close()

    async def write(self, data: bytes | None, timeout: float | None) -> None:  # noqa: ASYNC109
        if data:
            await self.protocol.send(data, timeout, _WRITE_ERRORS)

    async def next_event(self, timeout: float | None) -> Any:  # noqa: ASYNC109
        """The next h11 event from the server, reading as needed."""
        h = self.h11
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is not h11.NEED_DATA:
                return event
            data = await self.protocol.receive(None, timeout, _READ_ERRORS)
            if not data and h.their_state is h11.SEND_RESPONSE:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            h.receive_data(data)


class _Body(httpx.AsyncByteStream):
    """An answer's body, read from its connection; closing it releases the connection."""

    def __init__(self, owner: Http11Transport, conn: _Conn, timeout: float | None) -> None:
        self._owner = owner
        self._conn: _Conn | None = conn
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        try:
            while True:
                event = await conn.next_event(self._timeout)
                if type(event) is h11.Data:
                    yield bytes(event.data)
                elif type(event) in _BODY_ENDS or event is h11.PAUSED:
                    return
        except BaseException:
            self._owner._release(conn, reuse=False)
            self._conn = None
            raise

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._owner._release(conn, reuse=True)


class Http11Transport(httpx.AsyncBaseTransport):
    """An httpx transport speaking HTTP/1.1 through h11 (see the module docstring)."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        *,
        proxies: Mapping[str, str] | None = None,
        max_connections: int = 100,
        max_keepalive_connections: int = 20,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self._ssl = ssl_context
        self._max = max_connections
        self._max_idle = max_keepalive_connections
        self._expiry = keepalive_expiry
        self._idle: list[_Conn] = []
        self._active: set[_Conn] = set()  # handed to a request and not released
        self._connecting = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._fallback: httpx.AsyncHTTPTransport | None = None
        self._closed = False
        #: By scheme, the proxies to go through (``Network.proxies``); empty: none.
        self._proxies = dict(proxies or {})
        #: Each origin's proxy, once looked up (None: direct).
        self._via: dict[tuple[bytes, str, int], str | None] = {}
        #: httpx's own transport per proxy URL.
        self._proxied: dict[str, httpx.AsyncHTTPTransport] = {}

    # -- what synckit's lending asks ---------------------------------------------------

    def all_idle(self) -> bool:
        """No connection is serving a request (an answer nobody closed holds one)."""
        others = list(self._proxied.values())
        if self._fallback is not None:
            others.append(self._fallback)
        for other in others:
            connections = getattr(getattr(other, "_pool", None), "connections", None)
            if connections is None or not all(c.is_idle() or c.is_closed() for c in connections):
                return False
        return not self._active and not self._connecting

    # -- httpx's transport interface --------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if _patched():
            if self._fallback is None:
                self._fallback = new_httpcore_transport(self._ssl)
            return await self._fallback.handle_async_request(request)
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{scheme.decode()}://'."
            )
        if not url.raw_host:
            raise httpx.UnsupportedProtocol("Request URL is missing a host.")
        origin = (scheme, url.raw_host.decode("ascii"), url.port or _DEFAULT_PORTS[scheme])
        if self._proxies:
            proxied = self._proxied_transport(origin)
            if proxied is not None:
                return await proxied.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        retried = False
        while True:
            conn = await self._acquire(origin, request, timeouts)
            reused = conn.used
            try:
                return await self._exchange(conn, request, timeouts)
            except httpx.TransportError as exc:
                self._release(conn, reuse=False)
                # A kept-alive connection the server dropped just as the request left: one
                # more try on a new connection, for a request safe to send twice.
                if (
                    reused
                    and not retried
                    and isinstance(exc, _RESENDABLE)
                    and conn.h11.their_state is h11.SEND_RESPONSE
                    and not conn.protocol.received_any
                    and request.method in IDEMPOTENT
                    and isinstance(request.stream, httpx.ByteStream)
                ):
                    retried = True
                    continue
                raise
            except BaseException:
                self._release(conn, reuse=False)
                raise

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in [*idle, *self._active]:
            conn.close()
        if self._fallback is not None:
            await self._fallback.aclose()
        proxied, self._proxied = self._proxied, {}
        for transport in proxied.values():
            await transport.aclose()

    def _proxied_transport(self, origin: tuple[bytes, str, int]) -> httpx.AsyncBaseTransport | None:
        """httpx's transport through the proxy ``origin`` goes through, or None (direct)."""
        try:
            via = self._via[origin]
        except KeyError:
            scheme, host, port = origin
            via = self._via[origin] = proxy_for(self._proxies, scheme.decode(), host, port)
        if via is None:
            return None
        transport = self._proxied.get(via)
        if transport is None:
            transport = self._proxied[via] = httpx.AsyncHTTPTransport(
                verify=self._ssl, proxy=httpx.Proxy(via)
            )
        return transport

    # -- connections ------------------------------------------------------------------

    async def _acquire(
        self, origin: tuple[bytes, str, int], request: httpx.Request, timeouts: dict[str, Any]
    ) -> _Conn:
        now = time.monotonic()
        idle = self._idle
        # Newest first; anything expired, closed or spoken to meanwhile is closed.
        for i in range(len(idle) - 1, -1, -1):
            conn = idle[i]
            if conn.origin != origin:
                continue
            del idle[i]
            if conn.reusable(now, self._expiry):
                self._active.add(conn)
                conn.protocol.received_any = False
                return conn
            conn.close()
        while len(self._active) + self._connecting + len(self._idle) >= self._max:
            if self._idle:
                self._idle.pop(0).close()  # the oldest idle one of another origin
                continue
            room = asyncio.get_running_loop().create_future()
            self._waiting.append(room)
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await room
            except TimeoutError as exc:
                raise httpx.PoolTimeout("timed out waiting for a connection") from exc
            finally:
                if room in self._waiting:
                    self._waiting.remove(room)
        self._connecting += 1
        try:
            conn = await self._connect(origin, request, timeouts.get("connect"))
        except BaseException:
            self._connecting -= 1
            self._notify()
            raise
        self._connecting -= 1
        if self._closed:
            conn.close()
            self._notify()
            raise httpx.ConnectError("the transport was closed")
        self._active.add(conn)
        return conn

    async def _connect(
        self,
        origin: tuple[bytes, str, int],
        request: httpx.Request,
        timeout: float | None,  # noqa: ASYNC109
    ) -> _Conn:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if scheme == b"https":
            sni = request.extensions.get("sni_hostname")
            tls = {"ssl": self._ssl, "server_hostname": sni or host}
        try:
            async with asyncio.timeout(timeout):
                _, protocol = await loop.create_connection(
                    _Protocol, host, port, **tls, **_happy_eyeballs(loop)
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}") from exc
        except ssl.SSLCertVerificationError as exc:
            raise httpx.ConnectError(untrusted(host, port, exc)) from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(_reason(exc)) from exc
        return _Conn(origin, protocol)

    def _release(self, conn: _Conn, *, reuse: bool) -> None:
        if conn not in self._active:
            conn.close()
            return
        self._active.discard(conn)
        h = conn.h11
        if (
            reuse
            and not self._closed
            and h.our_state is h11.DONE
            and h.their_state is h11.DONE
            and len(self._idle) < self._max_idle
        ):
            try:
                h.start_next_cycle()
            except h11.LocalProtocolError:
                conn.close()
            else:
                conn.used = True
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
        else:
            conn.close()
        self._notify()

    def _notify(self) -> None:
        while self._waiting:
            room = self._waiting.popleft()
            if not room.done():
                room.set_result(None)
                return

    # -- one request ------------------------------------------------------------------

    async def _exchange(
        self, conn: _Conn, request: httpx.Request, timeouts: dict[str, Any]
    ) -> httpx.Response:
        h = conn.h11
        write_timeout, read_timeout = timeouts.get("write"), timeouts.get("read")
        try:
            head = h11.Request(
                method=request.method, target=request.url.raw_path, headers=request.headers.raw
            )
            await conn.write(h.send(head), write_timeout)
            try:
                async for chunk in cast(httpx.AsyncByteStream, request.stream):
                    await conn.write(h.send(h11.Data(data=chunk)), write_timeout)
                await conn.write(h.send(h11.EndOfMessage()), write_timeout)
            except httpx.WriteError:
                # The server may have answered (a 413) and closed before reading it all:
                # its answer, if one came, says more than the failed write.
                if not conn.protocol.buffer:
                    raise
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc)) from exc
        while True:
            event = await conn.next_event(read_timeout)
            if type(event) is h11.Response:
                break
            if type(event) is not h11.InformationalResponse:
                what = type(event).__name__
                raise httpx.RemoteProtocolError(f"unexpected {what} from the server")
        return httpx.Response(
            event.status_code,
            headers=event.headers.raw_items(),
            stream=_Body(self, conn, read_timeout),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": event.reason},
        )


def untrusted(host: str, port: int, exc: ssl.SSLCertVerificationError) -> str:
    """One line: the server whose certificate was refused, why, and what to do."""
    why = exc.verify_message or _reason(exc)
    return (
        f"TLS certificate of {host}:{port} not trusted ({why}); if its CA is one you "
        "trust, give it to App(ca_bundle=...)"
    )


def new_transport(
    ssl_context: ssl.SSLContext, proxies: Mapping[str, str] | None = None
) -> Http11Transport:
    """The transport of a connector's client: HTTP/1.1 with httpx's default limits (100
    connections, 20 kept alive for 5 s), through ``proxies`` (``Network.proxies()``)."""
    return Http11Transport(ssl_context, proxies=proxies)
