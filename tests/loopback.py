"""A scriptable HTTP server on loopback for tests: real sockets, real HTTP/1.1 (and TLS,
given a context); and a forwarding / ``CONNECT`` proxy to reach it through."""

from __future__ import annotations

import select
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Responder = Callable[["Request"], tuple[int, dict[str, str], bytes]]


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    at: float


class _Server(ThreadingHTTPServer):
    # The standard library listens with a backlog of 5: several worker processes
    # connecting at once on a busy machine overflow it, their SYNs are dropped and
    # retried a second later, and a test meets a connect timeout that no real API
    # would cause.
    request_queue_size = 128


@dataclass
class LoopbackServer:
    """Serves ``responder(request) -> (status, headers, body)`` and records every request."""

    responder: Responder
    requests: list[Request] = field(default_factory=list)
    #: Serve HTTPS with this server-side context (None: plain HTTP).
    tls: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                # The body is read before answering: left in the stream, it would be
                # read as the start of the connection's next request.
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                req = Request(self.command, self.path, dict(self.headers), time.time())
                owner.requests.append(req)
                status, headers, body = owner.responder(req)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _serve

            def log_message(self, *args: object) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            # The handshake runs in the request's thread, on its first read: a client
            # that refuses the certificate does not stall the accepting loop.
            self._server.socket = self.tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self.tls is not None else 'http'}://{host}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def times(self, path_prefix: str = "") -> list[float]:
        return sorted(r.at for r in list(self.requests) if r.path.startswith(path_prefix))


class LoopbackProxy:
    """An HTTP proxy on loopback: ``CONNECT host:port`` tunnels (HTTPS through it), an
    absolute-form request (``GET http://host/path``) is forwarded. ``seen`` holds each
    request line it was sent, in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline().decode("latin-1").strip()
                head: list[str] = []
                while (h := self.rfile.readline().decode("latin-1")) not in ("\r\n", "\n", ""):
                    head.append(h.strip())
                owner.seen.append(line)
                method, target, _ = line.split(" ", 2)
                if method == "CONNECT":
                    host, port = target.rsplit(":", 1)
                    upstream = socket.create_connection((host, int(port)))
                    self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    self.wfile.flush()
                    _pipe(self.connection, upstream)
                    return
                rest = target.split("://", 1)[1]
                hostport, _, path = rest.partition("/")
                host, port = hostport.rsplit(":", 1)
                length = 0
                kept = []
                for h in head:
                    name = h.split(":", 1)[0].lower()
                    if name == "content-length":
                        length = int(h.split(":", 1)[1])
                    if name not in ("connection", "proxy-connection", "keep-alive"):
                        kept.append(h)
                body = self.rfile.read(length) if length else b""
                upstream = socket.create_connection((host, int(port)))
                request = [f"{method} /{path} HTTP/1.1", *kept, "Connection: close", "", ""]
                upstream.sendall("\r\n".join(request).encode("latin-1") + body)
                self.wfile.flush()
                _pipe(self.connection, upstream)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _pipe(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    with upstream:
        peers = {client: upstream, upstream: client}
        while True:
            ready, _, _ = select.select(list(peers), [], [])
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                peers[sock].sendall(data)
