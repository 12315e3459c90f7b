"""A scriptable HTTP server on loopback for tests: real sockets, real HTTP/1.1."""

from __future__ import annotations

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


@dataclass
class LoopbackServer:
    """Serves ``responder(request) -> (status, headers, body)`` and records every request."""

    responder: Responder
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def times(self, path_prefix: str = "") -> list[float]:
        return sorted(r.at for r in list(self.requests) if r.path.startswith(path_prefix))
