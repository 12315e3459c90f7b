"""A fake HTTP API for connector tests: routes, scripted replies and injected faults.

One :class:`FakeAPI` answers in-process (through :meth:`FakeAPI.transport`, an
``httpx.MockTransport``, or :meth:`FakeAPI.mock_router`, a respx router) and on loopback
(:meth:`FakeAPI.serve`, :meth:`FakeAPI.serve_in_thread`: a real HTTP/1.1 server on
``127.0.0.1``), with the same routes, scripts and faults::

    api = FakeAPI()
    api.route("GET", "/items", {"items": [1, 2]})
    api.script("GET", "/items", [Fault.rate_limited(retry_after=7), PASS])
    async with httpx.AsyncClient(transport=api.transport(), base_url="https://api.test") as c:
        assert (await c.get("/items")).status_code == 429
        assert (await c.get("/items")).json() == {"items": [1, 2]}

How a request is answered; the first rule that applies wins:

1. the next step of a script registered for its method and path (:meth:`FakeAPI.script`):
   a :class:`Reply`, a :class:`Fault`, or :data:`PASS` (go on with the rules below);
2. bearer authentication, on routes that require it (:meth:`FakeAPI.issue_token`): 401
   with ``WWW-Authenticate: Bearer error="invalid_token"`` for an unknown, expired or
   revoked token;
3. random faults (:meth:`FakeAPI.faults`), drawn from a seeded generator;
4. expired cursors (:meth:`FakeAPI.expire_cursor`): 410 Gone;
5. the route's handler, or its static JSON; 405 for a known path with another method,
   404 for an unknown path.

Faults that cannot be an HTTP answer differ by where the fake runs. In-process they raise
what httpx raises against a real server; on loopback the server really does it:

==================  ===================================  ===============================
fault               in-process (transport)               loopback
==================  ===================================  ===============================
timeout             ``httpx.ReadTimeout``                waits ``delay`` s, then closes
disconnect          ``httpx.RemoteProtocolError``        closes without answering
connection_reset    ``httpx.ReadError``                  closes with a TCP RST
connect_error       ``httpx.ConnectError``               closes with a TCP RST
lost_response       handler runs, then as disconnect     handler runs, then closes
                    (as timeout when ``delay`` is set)   (after ``delay`` s if set)
==================  ===================================  ===============================

Every request is recorded in :attr:`FakeAPI.requests`, answered or not. Handlers are plain
(synchronous) functions: they run under the fake's lock, so a handler's state changes are
atomic with respect to concurrent requests and to a test thread inspecting the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import inspect
import json
import math
import random
import re
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import httpx

from synckit.clock import utcnow

if TYPE_CHECKING:
    import respx
from synckit.testing.loopback_http import LoopbackServer
from synckit.testing.replies import (
    JSON_TYPE,
    RETRY_HEADERS,
    Decision,
    DropMode,
    Fault,
    FaultRates,
    Passthrough,
    RecordedRequest,
    Reply,
    RetryAfterForm,
    Step,
    TokenInfo,
    unauthorized_parts,
    with_type,
)

__all__ = ["FakeAPI"]


# --- routing -------------------------------------------------------------------------------


_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(path))?\}")


def _compile(template: str) -> re.Pattern[str]:
    """``/items/{id}`` matches one segment; ``/files/{rest:path}`` matches the rest."""
    out, pos = [], 0
    for m in _PARAM.finditer(template):
        out.append(re.escape(template[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>{'.+' if m.group(2) else '[^/]+'})")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out) + r"\Z")


@dataclass
class _Route:
    method: str
    template: str
    pattern: re.Pattern[str]
    target: Any
    auth: bool | None

    @property
    def literal(self) -> bool:
        return _PARAM.search(self.template) is None


@dataclass
class _Script:
    method: str
    template: str
    pattern: re.Pattern[str]
    steps: deque[Step]


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Z-]+")  # RFC 9110's token, upper-cased


def _json_reply(data: Any, where: str) -> Reply:
    try:
        return Reply.json(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{where}: answers JSON, and {type(data).__name__} is not JSON-serialisable ({exc})"
        ) from None


def _checked_target(target: Any, where: str) -> Any:
    """``target`` as a route stores it (static JSON encoded once); raises naming ``where``."""
    if isinstance(target, Reply):
        _check_reply(target, where)
        return target
    if isinstance(target, Fault):
        return target
    if isinstance(target, type) or getattr(target, "__self__", None) in (Reply, Fault):
        # Reply.json, Fault.gone...: a factory passed without calling it.
        name = getattr(target, "__qualname__", repr(target))
        raise TypeError(f"{where}: {name} is a factory; pass what it returns, e.g. {name}(...)")
    if callable(target):
        if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
            getattr(target, "__call__", None)  # noqa: B004 - an instance with async __call__
        ):
            raise TypeError(
                f"{where}: handlers are plain functions (they run under the fake's lock); "
                f"{getattr(target, '__qualname__', target)!r} is async"
            )
        return target
    return _json_reply(target, where)


def _check_reply(reply: Reply, where: str) -> None:
    if not (isinstance(reply.status, int) and 100 <= reply.status <= 599):
        raise ValueError(f"{where}: Reply status must be an int in 100-599, not {reply.status!r}")
    if not isinstance(reply.body, bytes):
        raise TypeError(
            f"{where}: Reply body must be bytes, not {type(reply.body).__name__} "
            "(use Reply.json(data) or Reply.text(text))"
        )
    if not (
        isinstance(reply.headers, tuple)
        and all(
            isinstance(h, tuple) and len(h) == 2 and all(isinstance(x, str) for x in h)
            for h in reply.headers
        )
    ):
        raise TypeError(f"{where}: Reply headers must be (name, value) pairs of str")


def _seconds(value: timedelta | float) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


class FakeAPI:
    """A scriptable fake HTTP API with fault injection; see the module docstring.

    ``clock`` drives token expiry, HTTP-date waits and request times (plug in a
    :class:`~synckit.testing.clock.FakeClock`). ``seed`` makes random faults and generated
    tokens reproducible. ``require_auth`` makes every route (unless registered with
    ``auth=False``) demand a bearer token issued by :meth:`issue_token`.
    ``unauthorized_body`` replaces the JSON body of 401 answers. ``latency`` (seconds) is
    added before every answer on loopback, as a distant server's would be; requests are
    decided when they arrive (a rate limiter sees arrival times), then answered after it.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        seed: int | None = None,
        require_auth: bool = False,
        unauthorized_body: Any = None,
        latency: float = 0.0,
    ) -> None:
        if not (math.isfinite(latency) and latency >= 0):
            raise ValueError(f"latency must be a finite number of seconds >= 0, not {latency!r}")
        self.clock: Callable[[], datetime] = clock or utcnow
        self.latency = latency
        self.require_auth = require_auth
        self.unauthorized_body = unauthorized_body
        #: Held while a request is dispatched; take it to change a handler's state from
        #: another thread while :meth:`serve_in_thread` serves.
        self.lock = threading.RLock()
        #: Every request received, in order, answered or not.
        self.requests: list[RecordedRequest] = []
        #: Exceptions raised by handlers (each answered as a 500).
        self.handler_errors: list[BaseException] = []
        self._routes: list[_Route] = []
        self._scripts: list[_Script] = []
        self._rates: FaultRates | None = None
        self._rng = random.Random(seed)
        self._ids = random.Random(None if seed is None else f"{seed}:ids")
        self._bursts: dict[str, int] = {}
        self._tokens: dict[str, TokenInfo] = {}
        self._cursors: list[tuple[str, str | None, Reply]] = []

    # --- configuration ---------------------------------------------------------------------

    def route(self, method: str, path: str, target: Any, *, auth: bool | None = None) -> None:
        """Answer ``method path`` with ``target``: a :data:`Handler`, a :class:`Reply` or a
        :class:`Fault` (every request gets it), or static JSON.

        ``path`` may hold ``{name}`` (one segment) and ``{name:path}`` (the rest) parameters;
        ``method`` may be ``"*"``. Registering the same method and path again replaces it.
        ``auth`` overrides the fake's ``require_auth`` for this route.

        ``target`` is checked here, not when a request arrives (static JSON is encoded once,
        here): a value JSON cannot encode, a malformed :class:`Reply`, an ``async def``
        handler or an uncalled factory such as ``Reply.json`` raise ``TypeError`` or
        ``ValueError`` naming the route.
        """
        m = method.upper()
        where = f"route {m} {path}"
        if m != "*" and not _TOKEN.fullmatch(m):
            raise ValueError(f"{where}: {method!r} is not an HTTP method (or '*')")
        if not path.startswith("/"):
            raise ValueError(f"{where}: the path must start with '/'")
        target = _checked_target(target, where)
        with self.lock:
            self._routes = [r for r in self._routes if (r.method, r.template) != (m, path)]
            self._routes.append(_Route(m, path, _compile(path), target, auth))

    def script(self, method: str, path: str, steps: Iterable[Step]) -> None:
        """Queue steps that answer the next requests to ``method path``, one each, before
        anything else; then requests fall back to the normal rules. A fault with
        ``repeat=n`` stands for n steps. Calling again appends to that path's script.
        ``path`` may be a route template or a concrete path."""
        expanded: deque[Step] = deque()
        for step in steps:
            if not isinstance(step, Reply | Fault | Passthrough):
                raise TypeError(f"a script step is a Reply, a Fault or PASS, not {step!r}")
            count = step.repeat if isinstance(step, Fault) else 1
            expanded.extend([step] * count)
        m = method.upper()
        with self.lock:
            for s in self._scripts:
                if (s.method, s.template) == (m, path):
                    s.steps.extend(expanded)
                    return
            self._scripts.append(_Script(m, path, _compile(path), expanded))

    def clear_scripts(self) -> None:
        with self.lock:
            self._scripts.clear()

    def pending_script_steps(self, method: str, path: str) -> int:
        """How many scripted steps are still queued for ``method path``."""
        with self.lock:
            return sum(
                len(s.steps)
                for s in self._scripts
                if (s.method, s.template) == (method.upper(), path)
            )

    def faults(
        self,
        *,
        rate_limit: float = 0.0,
        server_error: float = 0.0,
        timeout: float = 0.0,
        connection_reset: float = 0.0,
        lost_response: float = 0.0,
        seed: int | None = None,
        retry_after: float = 1.0,
        retry_after_form: RetryAfterForm = "seconds",
        server_error_status: int = 503,
        burst: int = 1,
        timeout_delay: float = 30.0,
        methods: Iterable[str] | None = None,
        paths: Iterable[str] | None = None,
    ) -> FaultRates:
        """Inject faults at random: each request draws once from a generator seeded with
        ``seed`` (reseeded on every call that gives one), so the same sequence of requests
        meets the same faults. A server error opens a burst: the next ``burst - 1``
        requests to the same route get the same status. ``methods`` and ``paths`` (route
        templates or concrete paths) limit which requests are eligible. Calling with no
        rates turns random faults off."""
        rates = FaultRates(
            rate_limit=rate_limit,
            server_error=server_error,
            timeout=timeout,
            connection_reset=connection_reset,
            lost_response=lost_response,
            retry_after=retry_after,
            retry_after_form=retry_after_form,
            server_error_status=server_error_status,
            burst=burst,
            timeout_delay=timeout_delay,
            methods=None if methods is None else frozenset(m.upper() for m in methods),
            paths=None if paths is None else tuple(paths),
        )
        with self.lock:
            self._rates = rates
            self._bursts.clear()
            if seed is not None:
                self._rng.seed(seed)
        return rates

    def issue_token(
        self,
        token: str | None = None,
        *,
        expires_in: timedelta | float = 3600.0,
        subject: str | None = None,
    ) -> str:
        """Accept ``token`` (generated when omitted) as a bearer token until the fake's
        clock passes ``expires_in``; ``subject`` says whose it is (see :meth:`token_info`)."""
        with self.lock:
            value = token or f"fake-{self._ids.getrandbits(96):024x}"
            self._tokens[value] = TokenInfo(value, subject, self.clock() + _seconds(expires_in))
            return value

    def expire_token(self, token: str) -> None:
        """Make ``token`` expired now: requests carrying it get 401 ``invalid_token``."""
        with self.lock:
            self._tokens[token].expires_at = self.clock()

    def revoke_token(self, token: str) -> None:
        with self.lock:
            self._tokens[token].revoked = True

    def token_info(self, token: str | None) -> TokenInfo | None:
        """What the fake knows about ``token`` (None for an unknown one)."""
        with self.lock:
            return None if token is None else self._tokens.get(token)

    def expire_cursor(
        self, value: str, *, param: str | None = None, body: Any = None, status: int = 410
    ) -> None:
        """Answer 410 Gone to any request carrying ``value`` as a query parameter (only as
        ``param`` when given), as APIs answer a cursor or sync token they no longer keep."""
        reply = Reply.json({"error": "cursor_expired"} if body is None else body, status)
        with self.lock:
            self._cursors.append((value, param, reply))

    def calls(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        """Recorded requests, optionally only those of ``method`` and matching ``path``
        (a route template or a concrete path)."""
        pattern = None if path is None else _compile(path)
        with self.lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method.upper())
                and (pattern is None or pattern.match(r.path))
            ]

    # --- dispatch --------------------------------------------------------------------------

    def _match(self, method: str, path: str) -> tuple[_Route | None, dict[str, str], list[str]]:
        found: tuple[_Route, dict[str, str]] | None = None
        allowed: list[str] = []
        # Literal paths win over templates, then registration order.
        for route in sorted(self._routes, key=lambda r: not r.literal):
            m = route.pattern.match(path)
            if m is None:
                continue
            if route.method in (method, "*"):
                if found is None:
                    found = (route, m.groupdict())
            else:
                allowed.append(route.method)
        if found is None:
            return None, {}, allowed
        return found[0], found[1], allowed

    def _scripted(self, method: str, path: str) -> Step | None:
        for s in self._scripts:
            if s.method in (method, "*") and s.steps and s.pattern.match(path):
                return s.steps.popleft()
        return None

    def answer(
        self, method: str, url: httpx.URL, headers: httpx.Headers, body: bytes
    ) -> Decision:
        with self.lock:
            now = self.clock()
            method = method.upper()
            path = url.path
            route, params, allowed = self._match(method, path)
            items = tuple(parse_qsl(url.query.decode("latin-1"), keep_blank_values=True))
            request = RecordedRequest(
                method=method,
                path=path,
                query=dict(items),
                headers=httpx.Headers(headers),
                body=body,
                time=now,
                url=str(url),
                params=params,
                query_items=items,
            )
            self.requests.append(request)

            def produce() -> Reply:
                result = self._run_handler(request, route, allowed)
                if isinstance(result, Fault):
                    return self._fault_reply(result, now) if result.kind == "reply" else Reply()
                return result

            step = self._scripted(method, path)
            if isinstance(step, Reply):
                return Decision(request, step)
            if isinstance(step, Fault):
                return self._apply(step, request, now, produce)
            needs_auth = self.require_auth if route is None or route.auth is None else route.auth
            if needs_auth and (denied := self._check_auth(request, now)) is not None:
                return Decision(request, denied)
            if (fault := self._random_fault(method, path, route)) is not None:
                return self._apply(fault, request, now, produce)
            if (gone := self._expired_cursor(request)) is not None:
                return Decision(request, gone)
            result = self._run_handler(request, route, allowed)
            if isinstance(result, Fault):
                # The handler already ran: a lost response or truncation is of its answer.
                return self._apply(result, request, now, Reply)
            return Decision(request, result)

    def _run_handler(
        self, request: RecordedRequest, route: _Route | None, allowed: list[str]
    ) -> Reply | Fault:
        if route is None:
            if allowed:
                return Reply.json(
                    {"error": "method_not_allowed"}, 405, {"Allow": ", ".join(sorted(allowed))}
                )
            return Reply.json({"error": "not_found", "path": request.path}, 404)
        if isinstance(route.target, Reply | Fault):
            return route.target
        try:
            result = route.target(request)
            if isinstance(result, Reply):
                _check_reply(result, f"route {route.method} {route.template}'s handler")
                return result
            if isinstance(result, Fault):
                return result
            if result is None:
                return Reply.empty(204)
            return _json_reply(result, f"route {route.method} {route.template}'s handler")
        except Exception as exc:
            # A bug in a test's handler (or an answer it cannot give): answer as a real server
            # would (500) and keep the exception for the test to see, rather than crash the
            # transport or the server.
            self.handler_errors.append(exc)
            return Reply.json({"error": "fake_handler_failed", "detail": repr(exc)}, 500)

    def _apply(
        self, fault: Fault, request: RecordedRequest, now: datetime, produce: Callable[[], Reply]
    ) -> Decision:
        if fault.kind == "reply":
            return Decision(request, self._fault_reply(fault, now))
        if fault.kind == "drop":
            return Decision(request, None, fault.drop, fault.delay)
        if fault.kind == "lost_response":
            produce()
            return Decision(request, None, "timeout" if fault.delay else "disconnect", fault.delay)
        if fault.body is not None:
            base = Reply(fault.status, fault.body, fault.headers)
        else:
            base = produce()
        cut = base.body[: max(1, len(base.body) // 2)] if base.body else b"{"
        return Decision(request, Reply(base.status, cut, with_type(None, JSON_TYPE)))

    def _fault_reply(self, fault: Fault, now: datetime) -> Reply:
        headers = list(fault.headers)
        if fault.retry_after is not None:
            name = RETRY_HEADERS[fault.retry_after_form]
            headers.append((name, _format_wait(fault.retry_after, fault.retry_after_form, now)))
        return Reply(fault.status, fault.body or b"", tuple(headers))

    def _check_auth(self, request: RecordedRequest, now: datetime) -> Reply | None:
        token = request.bearer_token
        if token is None:
            # RFC 6750 §3.1: no credentials at all gets a bare challenge, no error code.
            body = json.dumps(
                {"error": "unauthorized"}
                if self.unauthorized_body is None
                else self.unauthorized_body
            ).encode()
            return Reply(401, body, (("Content-Type", JSON_TYPE), ("WWW-Authenticate", "Bearer")))
        info = self._tokens.get(token)
        if info is None:
            problem = "The access token is not recognised"
        elif info.revoked:
            problem = "The access token was revoked"
        elif now >= info.expires_at:
            problem = "The access token expired"
        else:
            return None
        return Reply(401, *unauthorized_parts(problem, self.unauthorized_body))

    def _random_fault(self, method: str, path: str, route: _Route | None) -> Fault | None:
        rates = self._rates
        if rates is None:
            return None
        if rates.methods is not None and method not in rates.methods:
            return None
        if rates.paths is not None and not any(_compile(p).match(path) for p in rates.paths):
            return None
        key = f"{route.method} {route.template}" if route else f"{method} {path}"
        if self._bursts.get(key, 0) > 0:
            self._bursts[key] -= 1
            return Fault.server_error(rates.server_error_status)
        x = self._rng.random()
        if x < (edge := rates.rate_limit):
            return Fault.rate_limited(rates.retry_after, form=rates.retry_after_form)
        if x < (edge := edge + rates.server_error):
            if rates.burst > 1:
                self._bursts[key] = rates.burst - 1
            return Fault.server_error(rates.server_error_status)
        if x < (edge := edge + rates.timeout):
            return Fault.timeout(rates.timeout_delay)
        if x < (edge := edge + rates.connection_reset):
            return Fault.connection_reset()
        if x < edge + rates.lost_response:
            return Fault.lost_response()
        return None

    def _expired_cursor(self, request: RecordedRequest) -> Reply | None:
        for value, param, reply in self._cursors:
            if any(v == value and (param is None or k == param) for k, v in request.query_items):
                return reply
        return None

    # --- in-process ------------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        """An httpx transport answering from this fake (for ``AsyncClient`` and ``Client``)."""
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one httpx request in-process (raises httpx errors for dropped answers)."""
        decision = self.answer(request.method, request.url, request.headers, request.content)
        if decision.reply is None:
            raise _transport_error(decision.drop or "disconnect", request)
        reply = decision.reply
        headers = [(k, v) for k, v in reply.headers if k.lower() != "content-length"]
        return httpx.Response(reply.status, headers=headers, content=reply.body, request=request)

    def mock_router(self, base_url: str | None = None) -> respx.MockRouter:
        """A respx router sending every request (under ``base_url``, if given) to this fake.

        Use it as a context manager to patch httpx globally: ``with api.mock_router(url):``.
        Needs ``respx`` installed (it is a test dependency, not a synckit one).
        """
        import respx

        router = respx.MockRouter(base_url=base_url, assert_all_called=False)
        router.route().mock(side_effect=self.handle)
        return router

    # --- loopback --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
        """Serve on ``host:port`` (a free port by default) in this event loop; yields the
        base URL. Leaving the block closes the server and every open connection."""
        server = LoopbackServer(self, host, port)
        url = await server.start()
        try:
            yield url
        finally:
            await server.close()

    @contextlib.contextmanager
    def serve_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve from a background thread with its own event loop (for synchronous tests
        and for clients running in another loop); yields the base URL."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict[str, Any] = {}
        server = LoopbackServer(self, host, port)

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                box["url"] = loop.run_until_complete(server.start())
            except BaseException as exc:
                box["error"] = exc
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(server.close())
                loop.close()

        thread = threading.Thread(target=run, name="synckit-fakeapi", daemon=True)
        thread.start()
        ready.wait(30)
        if "error" in box:
            thread.join(5)
            raise box["error"]
        try:
            yield str(box["url"])
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)


def _format_wait(seconds: float, form: RetryAfterForm, now: datetime) -> str:
    if form in ("retry-after-ms", "x-ms-retry-after-ms"):
        return str(round(seconds * 1000))
    whole = math.ceil(seconds)
    if form == "http-date":
        # HTTP-dates have whole seconds; round the moment up so the wait is never shorter.
        moment = (now + timedelta(seconds=whole)).astimezone(UTC)
        if moment.microsecond:
            moment = moment.replace(microsecond=0) + timedelta(seconds=1)
        return email.utils.format_datetime(moment, usegmt=True)
    return str(whole)


def _transport_error(drop: DropMode, request: httpx.Request) -> httpx.TransportError:
    if drop == "timeout":
        return httpx.ReadTimeout("timed out", request=request)
    if drop == "reset":
        return httpx.ReadError("[Errno 104] Connection reset by peer", request=request)
    if drop == "connect_error":
        return httpx.ConnectError("[Errno 111] Connection refused", request=request)
    return httpx.RemoteProtocolError(
        "Server disconnected without sending a response.", request=request
    )
