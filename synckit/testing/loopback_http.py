"""The :class:`~synckit.testing.fakeapi.FakeAPI`'s loopback server: just enough
HTTP/1.1 (keep-alive, chunked bodies, a reset on demand) on asyncio, for clients that
must reach it over a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http
import socket
import struct
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from synckit.testing.replies import Decision, Reply


class Answerer(Protocol):
    """What the server asks of its fake (:class:`~synckit.testing.fakeapi.FakeAPI`)."""

    latency: float

    def answer(
        self, method: str, url: httpx.URL, headers: httpx.Headers, body: bytes
    ) -> Decision: ...

__all__ = ["LoopbackServer"]

# --- the loopback server: just enough HTTP/1.1 -----------------------------------------------


class _BadRequest(Exception):
    pass


@dataclass
class _RawRequest:
    method: str
    target: str
    version: str
    headers: httpx.Headers
    body: bytes


class LoopbackServer:
    """HTTP/1.1 with keep-alive on asyncio streams; answers come from ``FakeAPI.answer``.

    Hand-rolled rather than ``http.server`` because faults need control of the socket
    itself: close without answering, reset, or hold the connection open.
    """

    def __init__(self, api: Answerer, host: str, port: int) -> None:
        self.api = api
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._hostport = f"{host}:{port}"

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._on_connection, self.host, self.port)
        host, port = self._server.sockets[0].getsockname()[:2]
        self._hostport = f"{host}:{port}"
        return f"http://{self._hostport}"

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Only close() cancels these tasks. Ending normally rather than re-raising:
            # Python 3.11's stream callback calls task.exception() on a cancelled task
            # and logs a spurious "Exception in callback".
            pass
        except _BadRequest as exc:
            with contextlib.suppress(ConnectionError):
                writer.write(_encode(Reply.text(f"bad request: {exc}", 400), "GET", False))
                await writer.drain()
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            raw = await _read_request(reader)
            if raw is None:
                return
            if raw.target.startswith(("http://", "https://")):
                url = httpx.URL(raw.target)
            else:
                url = httpx.URL(f"http://{raw.headers.get('host') or self._hostport}{raw.target}")
            decision = self.api.answer(raw.method, url, raw.headers, raw.body)
            delay = decision.delay + (self.api.latency if decision.reply is not None else 0.0)
            if delay > 0:
                await asyncio.sleep(delay)
            if decision.reply is None:
                if decision.drop in ("reset", "connect_error"):
                    _abort_with_reset(writer)
                return  # the finally clause closes the connection without an answer
            keep_alive = (
                raw.version == "HTTP/1.1" and raw.headers.get("connection", "").lower() != "close"
            )
            writer.write(_encode(decision.reply, raw.method, keep_alive))
            await writer.drain()
            if not keep_alive:
                return


async def _read_request(reader: asyncio.StreamReader) -> _RawRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _BadRequest("incomplete request head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise _BadRequest("request head too large") from exc
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError as exc:
        raise _BadRequest(f"bad request line {lines[0]!r}") from exc
    pairs: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(f"bad header line {line!r}")
        pairs.append((name.strip(), value.strip()))
    headers = httpx.Headers(pairs)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise _BadRequest("bad Content-Length") from exc
        body = await reader.readexactly(length) if length > 0 else b""
    return _RawRequest(method.upper(), target, version.strip(), headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError as exc:
            raise _BadRequest("bad chunk size") from exc
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _encode(reply: Reply, method: str, keep_alive: bool) -> bytes:
    try:
        phrase = http.HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {reply.status} {phrase}"]
    skip = {"content-length", "transfer-encoding", "connection"}
    lines += [f"{k}: {v}" for k, v in reply.headers if k.lower() not in skip]
    no_body = reply.status in (204, 304) or 100 <= reply.status < 200
    body = b"" if no_body or method == "HEAD" else reply.body
    if not no_body:
        lines.append(f"Content-Length: {len(reply.body) if method == 'HEAD' else len(body)}")
    lines.append(f"Date: {email.utils.formatdate(usegmt=True)}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _abort_with_reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            # Linger 0: close() sends RST instead of FIN, as a crashed peer or middlebox does.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
