"""A hostile fake API for flow-control tests and ``bench.sync``: throttles, outages, latency.

:class:`HostileAPI` is a :class:`~synckit.testing.fakeapi.FakeAPI` with one paged
collection per tenant and a scripted :class:`Behaviour`: answers delayed by ``latency``,
a per-tenant rate limit the server enforces (fixed one-second windows, answered with
``429`` or GitHub's ``403`` + ``X-RateLimit-Remaining: 0``, ``Retry-After`` in whole or
fractional seconds), a share of random ``429 Retry-After: 1``, and an outage during which
every request (and/or the token endpoint) answers ``503`` with ``Retry-After`` = the
seconds left. It counts on the server's side what a client cannot hide: every request,
every 429, and a timeline per tenant.

Routes (``{tenant}`` is any name)::

    GET  /t/{tenant}/items?page=N   page N (from 1) of the tenant's records:
                                    {"items": [...], "next": N+1 | null}
    POST /t/{tenant}/sink           204 (what a connector's handle() may call per record)
    POST /oauth/token               a bearer token (client_credentials or refresh_token);
                                    with ``oauth=True`` the routes above require one

In a test, serve it from a thread (``api.fake.serve_in_thread()``) or in the test's loop.
``python -m synckit.testing.hostile`` serves one in a process of its own (so that a busy
client cannot starve it), prints ``{"url": ...}`` and adds control routes, which
:class:`HostileProcess` drives: ``GET /_control/stats``, ``POST /_control/reset`` (a new
behaviour, counters cleared) and ``POST /_control/outage`` (``{"after": s, "for": s}``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from synckit.testing.fakeapi import FakeAPI
from synckit.testing.replies import RecordedRequest, Reply

__all__ = [
    "Behaviour",
    "HostileAPI",
    "HostileProcess",
    "RetryAfterStyle",
    "Stats",
    "TenantTimeline",
]

RetryAfterStyle = Literal["seconds", "fractional", "none"]


@dataclass(frozen=True)
class Behaviour:
    """How the API behaves. Times are seconds; ``None`` turns a feature off.

    ``limit`` is requests per tenant per one-second window (windows aligned to whole epoch
    seconds, so ``X-RateLimit-Reset`` is exact); a request over it is refused with
    ``limit_status`` (429, or 403 as GitHub does) and ``X-RateLimit-Remaining: 0``.
    ``limit_headers`` adds ``X-RateLimit-Limit/Remaining/Reset`` to every answer, so a
    client may pace itself without being told the limit. ``bare_limit`` makes the limit
    an undeclared one: a refusal is a 429 with no header at all (no ``Retry-After``, no
    ``X-RateLimit-*``) and no answer reports the quota. ``random_429`` is the share of
    requests refused at random with ``429 Retry-After: random_retry_after`` (None: no
    header at all), drawn from a generator seeded with ``seed``. ``outage_after`` starts
    an outage that long after the first request (or use :meth:`HostileAPI.start_outage`);
    during it the API
    (``outage_api``) and/or the token endpoint (``outage_token``) answer 503 with
    ``Retry-After`` = the seconds left, rounded up.
    """

    pages: int = 100
    records: int = 100
    latency: float = 0.1
    limit: int | None = None
    limit_status: int = 429
    limit_headers: bool = True
    bare_limit: bool = False
    retry_after: RetryAfterStyle = "seconds"
    random_429: float = 0.0
    random_retry_after: float | None = 1.0
    seed: int = 0
    outage_after: float | None = None
    outage_for: float = 3.0
    outage_api: bool = True
    outage_token: bool = False
    oauth: bool = False
    token_expires_in: float = 3600.0

    def __post_init__(self) -> None:
        if self.pages < 1 or self.records < 0:
            raise ValueError("pages must be at least 1 and records at least 0")
        if self.limit is not None and self.limit < 1:
            raise ValueError("limit must be at least 1 request per second (or None)")
        if self.limit_status not in (403, 429):
            raise ValueError("limit_status must be 403 or 429")
        if self.retry_after not in ("seconds", "fractional", "none"):
            raise ValueError(f"unknown retry_after style {self.retry_after!r}")
        if not 0.0 <= self.random_429 <= 1.0:
            raise ValueError("random_429 is a share between 0 and 1")
        if self.latency < 0 or self.outage_for < 0:
            raise ValueError("latency and outage_for are durations >= 0")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Behaviour:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown behaviour fields: {', '.join(unknown)}")
        return cls(**data)


@dataclass
class TenantTimeline:
    """What one tenant's requests met: ``(epoch time, status, page)`` in arrival order
    (page 0 for a sink call)."""

    events: list[tuple[float, int, int]] = field(default_factory=list)
    pages_done: int = 0
    done_at: float | None = None


@dataclass
class Stats:
    """Server-side counts since the last reset."""

    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    #: Answers refused for the rate limit (over the window, or at random).
    rate_limited: int = 0
    random_429: int = 0
    outage_503: int = 0
    token_requests: int = 0
    token_requests_in_outage: int = 0
    first_request_at: float | None = None
    outage: tuple[float, float] | None = None
    tenants: dict[str, TenantTimeline] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "rate_limited": self.rate_limited,
            "random_429": self.random_429,
            "outage_503": self.outage_503,
            "token_requests": self.token_requests,
            "token_requests_in_outage": self.token_requests_in_outage,
            "first_request_at": self.first_request_at,
            "outage": list(self.outage) if self.outage else None,
            "tenants": {
                name: {"events": t.events, "pages_done": t.pages_done, "done_at": t.done_at}
                for name, t in self.tenants.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stats:
        return cls(
            requests=data["requests"],
            statuses=Counter({int(k): v for k, v in data["statuses"].items()}),
            rate_limited=data["rate_limited"],
            random_429=data["random_429"],
            outage_503=data["outage_503"],
            token_requests=data["token_requests"],
            token_requests_in_outage=data["token_requests_in_outage"],
            first_request_at=data["first_request_at"],
            outage=tuple(data["outage"]) if data["outage"] else None,
            tenants={
                name: TenantTimeline(
                    [(e[0], e[1], e[2]) for e in t["events"]],
                    t["pages_done"],
                    t["done_at"],
                )
                for name, t in data["tenants"].items()
            },
        )

    def recovery_s(self) -> dict[str, float | None]:
        """For each tenant unfinished when the outage ended: seconds from its end to the
        tenant's next success (None: no success since)."""
        if self.outage is None:
            return {}
        end = self.outage[1]
        out: dict[str, float | None] = {}
        for name, t in self.tenants.items():
            if t.done_at is not None and t.done_at <= end:
                continue
            after = [at for at, status, _ in t.events if at >= end and status < 400]
            out[name] = (min(after) - end) if after else None
        return out


def _page_of(request: RecordedRequest) -> int:
    try:
        return max(1, int(request.query.get("page", "1")))
    except ValueError:
        return 1


class HostileAPI:
    """The API of the module docstring, over a :class:`FakeAPI` (``self.fake``)."""

    def __init__(
        self, behaviour: Behaviour | None = None, *, clock: Any = time.time, control: bool = False
    ) -> None:
        self._clock = clock
        self.fake = FakeAPI()
        self.behaviour = Behaviour()
        self.stats = Stats()
        self._windows: dict[str, tuple[int, int]] = {}
        self._rng = random.Random(0)
        self._tokens = 0
        self.reset(behaviour or Behaviour())
        f = self.fake
        f.route("GET", "/t/{tenant}/items", self._items)
        f.route("POST", "/t/{tenant}/sink", self._sink)
        f.route("POST", "/oauth/token", self._token, auth=False)
        if control:
            f.route("GET", "/_control/stats", lambda r: self.stats.as_dict(), auth=False)
            f.route("POST", "/_control/reset", self._control_reset, auth=False)
            f.route("POST", "/_control/outage", self._control_outage, auth=False)

    # --- driving it ---------------------------------------------------------------------

    url = ""

    @contextlib.contextmanager
    def serve_in_thread(self) -> Iterator[str]:
        """Serve on loopback from a thread with its own event loop; yields (and sets)
        :attr:`url`."""
        with self.fake.serve_in_thread() as url:
            self.url = url
            yield url

    def reset(self, behaviour: Behaviour) -> None:
        """A new behaviour; counters, windows, tokens and the outage start afresh."""
        with self.fake.lock:
            self.behaviour = behaviour
            self.fake.latency = behaviour.latency
            self.fake.require_auth = behaviour.oauth
            self.fake.requests.clear()
            self.stats = Stats()
            self._windows.clear()
            self._rng = random.Random(behaviour.seed)

    def start_outage(self, duration: float, *, after: float = 0.0) -> tuple[float, float]:
        """An outage of ``duration`` seconds starting ``after`` seconds from now."""
        with self.fake.lock:
            start = self._clock() + after
            self.stats.outage = (start, start + duration)
            return self.stats.outage

    def snapshot(self) -> Stats:
        """A copy of the counters, safe to read while the server runs."""
        with self.fake.lock:
            return Stats.from_dict(json.loads(json.dumps(self.stats.as_dict())))

    # --- answering ------------------------------------------------------------------------

    def _in_outage(self, now: float) -> float | None:
        """Seconds left of the outage, or None outside one."""
        o = self.stats.outage
        if o is None or not o[0] <= now < o[1]:
            return None
        return o[1] - now

    def _unavailable(self, left: float) -> Reply:
        self.stats.outage_503 += 1
        return Reply.json(
            {"error": "service_unavailable"}, 503, {"Retry-After": str(max(1, math.ceil(left)))}
        )

    def _retry_after(self, wait: float) -> dict[str, str]:
        style = self.behaviour.retry_after
        if style == "none":
            return {}
        if style == "fractional":
            return {"Retry-After": f"{max(wait, 0.001):.3f}"}
        return {"Retry-After": str(max(1, math.ceil(wait)))}

    def _gate(self, tenant: str, page: int) -> tuple[Reply | None, dict[str, str]]:
        """Count the request: the refusal it meets (if any), and the quota headers."""
        b, st = self.behaviour, self.stats
        now = self._clock()
        st.requests += 1
        if st.first_request_at is None:
            st.first_request_at = now
            if b.outage_after is not None and st.outage is None:
                start = now + b.outage_after
                st.outage = (start, start + b.outage_for)
        timeline = st.tenants.setdefault(tenant, TenantTimeline())
        refusal: Reply | None = None
        headers: dict[str, str] = {}
        left = self._in_outage(now)
        if left is not None and b.outage_api:
            refusal = self._unavailable(left)
        elif b.limit is not None:
            second = math.floor(now)
            start, used = self._windows.get(tenant, (second, 0))
            if start != second:
                start, used = second, 0
            reset = second + 1
            if used >= b.limit and b.bare_limit:
                st.rate_limited += 1
                refusal = Reply.json({"error": "too_many_requests"}, 429, {})
            elif used >= b.limit:
                st.rate_limited += 1
                body = {"message": "API rate limit exceeded", "error": "rate_limited"}
                hdrs = {
                    "X-RateLimit-Limit": str(b.limit),
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset": str(reset),
                    **self._retry_after(reset - now),
                }
                refusal = Reply.json(body, b.limit_status, hdrs)
            else:
                used += 1
                if b.limit_headers and not b.bare_limit:
                    headers = {
                        "X-RateLimit-Limit": str(b.limit),
                        "X-RateLimit-Remaining": str(b.limit - used),
                        "X-RateLimit-Reset": str(reset),
                    }
            self._windows[tenant] = (start, used)
        if refusal is None and b.random_429 and self._rng.random() < b.random_429:
            st.rate_limited += 1
            st.random_429 += 1
            wait = b.random_retry_after
            refusal = Reply.json(
                {"error": "rate_limited"},
                429,
                {"Retry-After": f"{wait:g}"} if wait is not None else {},
            )
        status = refusal.status if refusal is not None else 200
        st.statuses[status] += 1
        timeline.events.append((now, status, page))
        return refusal, headers

    def _items(self, request: RecordedRequest) -> Reply:
        tenant = request.params["tenant"]
        page = _page_of(request)
        refusal, headers = self._gate(tenant, page)
        if refusal is not None:
            return refusal
        b = self.behaviour
        timeline = self.stats.tenants[tenant]
        if page >= b.pages and timeline.done_at is None:
            timeline.done_at = self._clock()
        timeline.pages_done = max(timeline.pages_done, min(page, b.pages))
        items = [{"id": f"{tenant}-{page}-{i}", "n": i} for i in range(b.records)]
        body = {"items": items, "next": page + 1 if page < b.pages else None}
        return Reply.json(body, 200, headers)

    def _sink(self, request: RecordedRequest) -> Reply:
        refusal, headers = self._gate(request.params["tenant"], 0)
        return refusal if refusal is not None else Reply.empty(204, headers)

    def _token(self, request: RecordedRequest) -> Reply:
        st = self.stats
        now = self._clock()
        st.token_requests += 1
        left = self._in_outage(now)
        if left is not None:
            st.token_requests_in_outage += 1
            if self.behaviour.outage_token:
                return self._unavailable(left)
        form = request.form()
        if form.get("grant_type") not in ("client_credentials", "refresh_token"):
            return Reply.json({"error": "unsupported_grant_type"}, 400)
        self._tokens += 1
        expires = self.behaviour.token_expires_in
        token = self.fake.issue_token(expires_in=expires)
        return Reply.json(
            {
                "access_token": token,
                "token_type": "Bearer",
                "expires_in": expires,
                "refresh_token": f"refresh-{self._tokens}",
            },
            headers={"Cache-Control": "no-store"},
        )

    def _control_reset(self, request: RecordedRequest) -> Any:
        self.reset(Behaviour.from_dict(request.json() if request.body else {}))
        return {"ok": True}

    def _control_outage(self, request: RecordedRequest) -> Any:
        data = request.json()
        start, end = self.start_outage(float(data["for"]), after=float(data.get("after", 0)))
        return {"start": start, "end": end}


class HostileProcess:
    """A :class:`HostileAPI` served by ``python -m synckit.testing.hostile`` in a process
    of its own; :meth:`reset`, :meth:`start_outage` and :meth:`snapshot` drive it."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> HostileProcess:
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "synckit.testing.hostile",
                "--behaviour",
                json.dumps(dataclasses.asdict(self.behaviour)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the hostile API process exited before serving")
        self.url = json.loads(line)["url"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    @property
    def pid(self) -> int | None:
        """The serving process's id (None outside the ``with`` block)."""
        return self._proc.pid if self._proc is not None else None

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(method, self.url + path, json=body, timeout=60)
        response.raise_for_status()
        return response.json()

    def reset(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self._call("POST", "/_control/reset", dataclasses.asdict(behaviour))

    def start_outage(self, duration: float, *, after: float = 0.0) -> tuple[float, float]:
        answer = self._call("POST", "/_control/outage", {"after": after, "for": duration})
        return answer["start"], answer["end"]

    def snapshot(self) -> Stats:
        """The server's counters now."""
        return Stats.from_dict(self._call("GET", "/_control/stats"))


def _serve(behaviour: Behaviour, host: str, port: int) -> None:
    api = HostileAPI(behaviour, control=True)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)

        # The parent closing our stdin (or dying) stops us too.
        def watch_stdin() -> None:
            sys.stdin.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=watch_stdin, daemon=True).start()
        async with api.fake.serve(host, port) as url:
            print(json.dumps({"url": url}), flush=True)
            await stop.wait()

    asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m synckit.testing.hostile")
    parser.add_argument("--behaviour", default="{}", help="Behaviour fields as a JSON object.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    _serve(Behaviour.from_dict(json.loads(args.behaviour)), args.host, args.port)


if __name__ == "__main__":
    main()
