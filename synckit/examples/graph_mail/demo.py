"""``synckit demo``: what synckit does, in half a minute, with nothing but Python.

The demo runs the Graph mail example (``synckit/examples/graph_mail``) against a simulated
Microsoft Graph on loopback, with a real worker on a real SQLite database
(``synckit-demo.db`` in the working directory, made fresh each run):

* three tenants: ``contoso`` is healthy (but its delta token expires mid-run, and a
  message is deleted meanwhile), ``fabrikam`` is throttled hard (40% of requests answer
  429 with ``Retry-After``) and then has an outage that opens its circuit breaker,
  ``northwind``'s admin revokes the app's consent mid-run;
* three ``sendMail`` writes per tenant, half of whose answers are lost after the mail
  was sent;
* every tenant's access token expires mid-run (refresh tokens rotate).

It runs the worker until everything has converged, then reports what happened. Every
figure comes from the database the worker wrote (``audit_buckets``, ``dead_letters``,
``connections``, ``resources``, ``jobs``, ``intents``, the example's ``mail_messages``)
or from the simulator's own counters and the requests seen on the wire; none is
written into this file. The command itself is :mod:`synckit.cli.demo`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from synckit.clock import utcnow
from synckit.errors import BreakerPolicy, RetryPolicy
from synckit.errors.exceptions import SynckitError
from synckit.examples.graph_mail.reads import DemoReader, snapshot_rows, summary_rows
from synckit.runtime.audit import audit_observer
from synckit.runtime.http import SENT_AT
from synckit.store import migrate
from synckit.store.audit import RETRIED_PREFIX
from synckit.store.db import open_database
from synckit.store.records import live_keys

if TYPE_CHECKING:
    from synckit.examples.graph_mail.simulator import GraphSimulator

__all__ = ["DB_FILE", "KEY_FILE", "LOG_FILE", "DemoResult", "render_summary", "run_demo"]

DB_FILE = "synckit-demo.db"
LOG_FILE = "synckit-demo.log"
#: The key the demo made (when ``$SYNCKIT_SECRET_KEY`` was unset), kept beside its database
#: so that every console action and command works on that database afterwards.
KEY_FILE = "synckit-demo.key"
DB_URL = f"sqlite:///{DB_FILE}"
APP_SPEC = "synckit.examples.graph_mail.app:app"
SENDS_PER_TENANT = 3
LOST_SEND_RATE = 0.5
FABRIKAM_RETRY_AFTER = 1
RECOVERED_THROTTLE_RATE = 0.1
TICK = 0.3

# What the demo asks of the runtime, so that minutes of real life fit in seconds.
DEMO_RETRY = RetryPolicy(
    base=timedelta(seconds=0.5), cap=timedelta(seconds=2), floor=timedelta(seconds=0.25)
)
DEMO_BREAKER = BreakerPolicy(
    failure_threshold=4,
    cooldown=timedelta(seconds=2),
    cooldown_cap=timedelta(seconds=4),
    probe_timeout=timedelta(seconds=30),
)


@dataclass(frozen=True)
class _Plan:
    tenant: str
    role: str
    story: str
    messages: int
    malformed: int
    mailbox: dict[str, Any] = field(default_factory=dict)


PLANS = (
    _Plan(
        "contoso",
        "healthy",
        "healthy; its delta token expires mid-run while a message is deleted",
        messages=40,
        malformed=2,
    ),
    _Plan(
        "fabrikam",
        "throttled hard",
        "throttled hard (40% of requests: 429 Retry-After), then a 503 outage",
        messages=40,
        malformed=1,
        mailbox={
            "throttled_hard": True,
            "retry_after": FABRIKAM_RETRY_AFTER,
            "server_error_rate": 0.05,
        },
    ),
    _Plan(
        "northwind",
        "consent revoked",
        "its admin revokes the app's consent mid-run",
        messages=20,
        malformed=1,
    ),
)
HEALTHY, THROTTLED, REVOKED = (p.tenant for p in PLANS)


def _example() -> ModuleType:
    """``synckit.examples.graph_mail``, which ships inside the package."""
    import synckit.examples.graph_mail as example

    return example


# --- what the wire saw -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    tenant: str
    #: When the request passed pacing (time.monotonic()); it left on the wire later.
    paced: float
    answered: float
    status: int | None
    retry_after: float | None


class _Wire(httpx.AsyncBaseTransport):
    """The network of every tenant's client, recording each Graph request and its answer."""

    def __init__(self, tenant_of: Callable[[str | None], str]) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.calls: list[_Call] = []
        self._tenant_of = tenant_of

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        header = request.headers.get("authorization", "")
        tenant = self._tenant_of(header.removeprefix("Bearer ") or None)
        sent = time.monotonic()
        # The runtime stamps when the request passed pacing: under load it may reach the
        # wire a while later, and it is the pacing that must have waited.
        passed = request.extensions.get(SENT_AT)
        paced = sent - (utcnow() - passed).total_seconds() if isinstance(passed, datetime) else sent
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError:
            self.calls.append(_Call(tenant, paced, time.monotonic(), None, None))
            raise
        wait = _seconds(response.headers.get("retry-after"))
        self.calls.append(_Call(tenant, paced, time.monotonic(), response.status_code, wait))
        return response

    async def aclose(self) -> None:
        """Shared by every tenant's client: closed by the demo, not by each client."""


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def retry_after_report(calls: list[_Call], grace: float = 0.25) -> dict[str, Any]:
    """For each 429 with ``Retry-After``: did the tenant's next request wait that long?

    A request that passed pacing within ``grace`` of the 429's arrival was already on its
    way (the 429 was not yet classified and recorded), so it is counted as in flight, not
    as a failure to wait. Times are when a request passed pacing, not when it reached
    the wire: under load the two can be far apart.
    """
    by_tenant: dict[str, list[_Call]] = defaultdict(list)
    for c in calls:
        by_tenant[c.tenant].append(c)
    answers = honoured = in_flight = ignored = unfollowed = 0
    asked: set[float] = set()
    gaps: list[float] = []
    for tenant_calls in by_tenant.values():
        tenant_calls.sort(key=lambda c: c.paced)
        for c in tenant_calls:
            if c.status != 429 or c.retry_after is None:
                continue
            answers += 1
            asked.add(c.retry_after)
            later = [d.paced - c.answered for d in tenant_calls if d.paced > c.answered]
            if not later:
                unfollowed += 1
                continue
            racing = [g for g in later if g < grace]
            in_flight += len(racing)
            gap = min((g for g in later if g >= grace), default=None)
            if gap is None:
                unfollowed += 1
            elif gap >= c.retry_after:
                honoured += 1
                gaps.append(gap)
            else:
                ignored += 1
    return {
        "answers": answers,
        "asked_seconds": sorted(asked),
        "honoured": honoured,
        "not_honoured": ignored,
        "no_later_request": unfollowed,
        "requests_already_in_flight": in_flight,
        "shortest_wait_seconds": round(min(gaps), 2) if gaps else None,
    }


# --- what the database says -------------------------------------------------------------------


@dataclass
class Snapshot:
    """The runtime's tables, read while the worker runs (and once more at the end)."""

    status: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    breaker: dict[str, tuple[str, Any]] = field(default_factory=dict)
    cursor: dict[str, Any] = field(default_factory=dict)
    synced: dict[str, set[str]] = field(default_factory=dict)
    dlq: Counter[str] = field(default_factory=Counter)
    sends_done: Counter[str] = field(default_factory=Counter)
    retried: dict[str, Counter[str]] = field(default_factory=dict)

    def delta_done(self, tenant: str) -> bool:
        cursor = self.cursor.get(tenant)
        return isinstance(cursor, dict) and "deltaLink" in cursor


def _resource_tenant(key: str) -> str:
    return key.split(":", 1)[1] if ":" in key else key


def _synced_ids(conn: Any) -> dict[str, set[str]]:
    """The ids of the messages landed (not deleted) per tenant."""
    spec = _example().MESSAGES.spec
    return {t: {k[0] for k in keys} for t, keys in live_keys(conn, spec).items()}


def read_snapshot(reader: DemoReader, synced_ids: Callable[[Any], dict[str, set[str]]]) -> Snapshot:
    """The tables the live display shows, read while the worker runs (by a plain SQLite
    reader: in WAL mode it never blocks the worker's writes); ``synced_ids`` reads the
    example's messages on the same connection."""
    rows, synced = reader.read(lambda c: (snapshot_rows(c), synced_ids(c)))
    s = Snapshot()
    for r in rows.connections:
        s.status[r.tenant] = (r.status, r.status_reason)
    for r in rows.resources:
        if not r.resource_key.startswith("api:"):
            s.breaker[_resource_tenant(r.resource_key)] = (r.state, r.opened_at)
    for r in rows.checkpoints:
        s.cursor[r.tenant] = r.cursor
    s.synced = synced
    for tenant, n in rows.dead_letters:
        s.dlq[tenant] = n
    for tenant, n in rows.sends_done:
        s.sends_done[tenant] = n
    for r in rows.audit:
        counts = s.retried.setdefault(r.tenant, Counter())
        for k, v in (r.failed_by_class or {}).items():
            if k.startswith(RETRIED_PREFIX):
                counts[k[len(RETRIED_PREFIX) :]] += int(v)
    return s


# --- the run ---------------------------------------------------------------------------------


@dataclass
class DemoResult:
    summary: dict[str, Any]
    converged: bool


@dataclass
class _Story:
    """The scripted events and what the monitor has seen happen."""

    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    openings: dict[str, set[Any]] = field(default_factory=lambda: defaultdict(set))
    outage_started: float | None = None
    emit: Callable[[float, str], None] = lambda _at, _text: None

    def at(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        moment = self.at()
        self.events.append((moment, text))
        self.emit(moment, text)

    def once(self, name: str) -> bool:
        if name in self.done:
            return False
        self.done.add(name)
        return True


async def run_demo(
    workdir: Path, *, out: Console, converge_within: float = 50.0, live: bool | None = None
) -> DemoResult:
    """Run the demo in ``workdir``; progress and tables go to ``out``."""
    example = _example()
    from synckit.examples.graph_mail.simulator import GraphSimulator

    db_path = workdir / DB_FILE
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (workdir / f"{DB_FILE}{suffix}").unlink()
    ephemeral_key = not os.environ.get("SYNCKIT_SECRET_KEY")
    key_path = workdir / KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        key_path.unlink()  # a stale key would open nothing in the new database
    if ephemeral_key:
        from cryptography.fernet import Fernet

        # Tokens are always stored encrypted. The key is kept beside the database (owner
        # only), and the commands printed at the end read it from there.
        key = Fernet.generate_key().decode()
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(key + "\n")
        os.environ["SYNCKIT_SECRET_KEY"] = key

    sim = GraphSimulator(seed=2024, page_size=10, lost_send_rate=LOST_SEND_RATE)
    for plan in PLANS:
        sim.add_mailbox(
            plan.tenant, messages=plan.messages, malformed=plan.malformed, **plan.mailbox
        )

    def tenant_of(token: str | None) -> str:
        info = sim.api.token_info(token)
        return (info.subject if info is not None else None) or "?"

    wire = _Wire(tenant_of)
    story = _Story()
    db = open_database(f"sqlite:///{db_path}")
    reader = DemoReader(db_path)
    try:
        with sim.serve_in_thread() as base_url:
            _intro(out, base_url, db_path, ephemeral_key)
            await migrate.upgrade(db)
            app = example.make_app(
                scheduler_every=timedelta(seconds=1),
                transport=wire,
                dlq_replay_every=None,
                alerts_every=None,
            )
            # What `synckit db upgrade --app` does: the declared mail_messages table.
            await app.upgrade_records(db)
            enqueued: dict[str, list[str]] = {}
            for plan in PLANS:
                config = {
                    "tenant_id": plan.tenant,
                    "client_id": sim.client_id,
                    "client_secret": sim.client_secret,
                    "graph_url": sim.graph_url(base_url),
                    "token_url": sim.token_url(base_url, plan.tenant),
                    "page_size": 10,
                }
                await example.connect_tenant(
                    app, db, plan.tenant, config, sim.issue_tokens(plan.tenant), schedule="every 2s"
                )
                enqueued[plan.tenant] = []
                for n in range(1, SENDS_PER_TENANT + 1):
                    key = f"invoice-{n}"
                    mail = {
                        "to": [f"billing@customer{n}.example"],
                        "subject": f"Invoice {n} from {plan.tenant}",
                        "body": "Please find your invoice attached.",
                    }
                    await example.enqueue_send(db, plan.tenant, key, mail)
                    enqueued[plan.tenant].append(key)
            await app.schedule(db)
            worker = app.worker(
                db,
                concurrency=8,
                poll_interval=0.2,
                lease=timedelta(seconds=30),
                grace_period=3.0,
                retry_policy=DEMO_RETRY,
                breaker_policy=DEMO_BREAKER,
                observers=[audit_observer()],
            )
            runner = asyncio.create_task(worker.run(), name="synckit-demo-worker")
            unmet: list[str] = []
            try:
                unmet = await _watch(
                    out,
                    story,
                    sim,
                    lambda: read_snapshot(reader, _synced_ids),
                    enqueued,
                    runner,
                    converge_within=converge_within,
                    live=out.is_terminal if live is None else live,
                )
            finally:
                worker.stop()
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(10):
                        await runner
            elapsed = story.at()
            summary = _summary(reader, example, sim, wire, story, enqueued, elapsed, unmet, db_path)
            summary["next_commands"] = _next_commands(ephemeral_key)
            summary["change_feed"] = await _read_changes(app, db)
    finally:
        await wire.inner.aclose()
        await db.dispose()
        reader.close()
    return DemoResult(summary, converged=not unmet)


async def _read_changes(app: Any, db: Any) -> list[dict[str, Any]]:
    """What an app does with the landed messages: read every change since its cursor
    (0: the beginning), a page of 25 at a time, per tenant."""
    out = []
    for plan in PLANS:
        feed = app.records(plan.tenant, "messages", db=db)
        cursor, pages = 0, 0
        ops: Counter[str] = Counter()
        while True:
            page = await feed.changes(since=cursor, limit=25)
            pages += 1
            ops.update(c.op for c in page.changes)
            cursor = page.cursor
            if not page.more:
                break
        out.append({"tenant": plan.tenant, "pages": pages, "cursor": cursor, **ops})
    return out


def _intro(out: Console, base_url: str, db_path: Path, ephemeral_key: bool) -> None:
    out.print(
        f"[bold]synckit demo[/]: the Graph mail example against a simulated Microsoft Graph "
        f"at {base_url}, one worker (8 jobs at once), database {db_path.name}"
    )
    for plan in PLANS:
        out.print(
            f"  [bold]{plan.tenant:<10}[/] {plan.messages} messages ({plan.malformed} "
            f"malformed); {plan.story}"
        )
    out.print(
        f"  {SENDS_PER_TENANT} sendMail writes per tenant; {LOST_SEND_RATE:.0%} of sendMail "
        "answers are lost after the mail is sent; every access token expires mid-run"
    )
    if ephemeral_key:
        out.print(
            f"  [dim]tokens are encrypted with a key made for this run, kept in {KEY_FILE} "
            "(set SYNCKIT_SECRET_KEY to choose it)[/]"
        )
    out.print()


async def _watch(
    out: Console,
    story: _Story,
    sim: GraphSimulator,
    read: Callable[[], Snapshot],
    enqueued: dict[str, list[str]],
    runner: asyncio.Task[Any],
    *,
    converge_within: float,
    live: bool,
) -> list[str]:
    """Drive the story and the display until everything converged; return what did not."""
    deadline = time.monotonic() + converge_within
    snapshot = Snapshot()
    display: Live | None = None
    if live:
        display = Live(console=out, refresh_per_second=4, transient=False)
        story.emit = lambda _at, _text: None
    else:
        story.emit = lambda at, text: out.print(f"[dim]{at:5.1f}s[/] {text}", highlight=False)
    with display if display is not None else contextlib.nullcontext():
        while True:
            if runner.done():
                exc = runner.exception()
                raise SynckitError(f"the worker stopped unexpectedly: {exc!r}")
            snapshot = await asyncio.to_thread(read)
            _advance(story, sim, snapshot, enqueued)
            unmet = _unmet(story, sim, snapshot, enqueued)
            if display is not None:
                display.update(_live_view(story, sim, snapshot, enqueued))
            if not unmet:
                story.say("[green]converged[/]: everything that can sync has synced")
                break
            if time.monotonic() >= deadline:
                story.say(
                    f"[red]did not converge within {converge_within:g}s[/]: " + "; ".join(unmet)
                )
                break
            await asyncio.sleep(TICK)
        if display is not None:
            display.update(_live_view(story, sim, snapshot, enqueued))
    return unmet


def _well_formed(sim: GraphSimulator, tenant: str) -> set[str]:
    malformed = set(sim.mailbox(tenant).malformed_ids)
    return {m["id"] for m in sim.messages(tenant)} - malformed


def _advance(
    story: _Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> None:
    """Fire the scripted events whose moment has come, and narrate what the tables show."""
    for tenant, (state, opened_at) in s.breaker.items():
        if state == "open" and opened_at not in story.openings[tenant]:
            story.openings[tenant].add(opened_at)
            story.say(f"{tenant}: [red]circuit breaker opened[/] (its jobs wait for a probe)")
        if state == "closed" and story.openings[tenant] and story.once(f"closed:{tenant}"):
            story.say(f"{tenant}: [green]circuit breaker closed[/] (the probe succeeded)")
    for tenant, (status, reason) in s.status.items():
        if status == "needs_reauth" and story.once(f"reauth:{tenant}"):
            story.say(f"{tenant}: [red]needs re-authorisation[/] ({_short(reason or '', 80)})")
    for plan in PLANS:
        t = plan.tenant
        if s.delta_done(t) and story.once(f"synced:{t}"):
            story.say(
                f"{t}: first sync done, {len(s.synced.get(t, ()))} messages synced, "
                f"{s.dlq[t]} malformed to the dead-letter queue"
            )
        if s.sends_done[t] >= len(enqueued[t]) and story.once(f"sent:{t}"):
            story.say(
                f"{t}: {s.sends_done[t]} mails sent, {sim.stats.lost_sends[t]} of their "
                "answers lost on the way"
            )

    candidates = sorted(s.synced.get(HEALTHY, set()) & _well_formed(sim, HEALTHY))
    if s.delta_done(HEALTHY) and candidates and story.once("expire"):
        sim.delete_message(HEALTHY, candidates[0])
        for _ in range(3):
            sim.add_message(HEALTHY)
        sim.expire_delta_tokens(HEALTHY)
        for plan in PLANS:
            sim.expire_access_tokens(plan.tenant)
        story.say(
            f"{HEALTHY}: its delta token expired (1 message deleted, 3 delivered meanwhile); "
            "every tenant's access token expired"
        )
    if (
        "expire" in story.done
        and sim.stats.full_syncs[HEALTHY] >= 2
        and s.synced.get(HEALTHY) == _well_formed(sim, HEALTHY)
        and story.once("resynced")
    ):
        story.say(f"{HEALTHY}: 410 Gone answered by a full resync; the deleted one forgotten")

    fabrikam_ready = s.cursor.get(THROTTLED) is not None and s.sends_done[THROTTLED] >= len(
        enqueued[THROTTLED]
    )
    if fabrikam_ready and story.once("outage"):
        sim.mailbox(THROTTLED).server_error_rate = 1.0
        story.outage_started = time.monotonic()
        story.say(f"{THROTTLED}: [red]Graph outage[/]: every request fails (503)")
    if story.outage_started is not None and "outage_over" not in story.done:
        opened = bool(story.openings[THROTTLED])
        if (opened or time.monotonic() - story.outage_started > 10) and story.once("outage_over"):
            mailbox = sim.mailbox(THROTTLED)
            mailbox.server_error_rate = 0.0
            mailbox.throttle_rate = RECOVERED_THROTTLE_RATE
            story.say(
                f"{THROTTLED}: outage over; Graph throttles it less now "
                f"({RECOVERED_THROTTLE_RATE:.0%} of requests)"
            )

    if (
        s.delta_done(REVOKED)
        and s.sends_done[REVOKED] >= len(enqueued[REVOKED])
        and story.once("revoke")
    ):
        sim.revoke(REVOKED, access_tokens=True)
        for _ in range(2):
            sim.add_message(REVOKED)
        story.say(f"{REVOKED}: its admin revoked the app's consent; 2 new messages arrive")


_SCRIPT = {
    "expire": f"{HEALTHY}'s delta token has not expired yet",
    "resynced": f"{HEALTHY} has not resynced after its 410",
    "outage": f"{THROTTLED}'s outage has not started",
    "outage_over": f"{THROTTLED}'s outage is not over",
    "revoke": f"{REVOKED}'s consent has not been revoked yet",
}


def _unmet(
    story: _Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> list[str]:
    unmet = [what for name, what in _SCRIPT.items() if name not in story.done]
    for t in (HEALTHY, THROTTLED):
        missing = len(_well_formed(sim, t) ^ s.synced.get(t, set()))
        if missing:
            unmet.append(f"{t}: {missing} messages not in sync")
        if not s.delta_done(t):
            unmet.append(f"{t}: delta sync not caught up")
    for t, keys in enqueued.items():
        if s.sends_done[t] < len(keys):
            unmet.append(f"{t}: {len(keys) - s.sends_done[t]} sends not done")
    if s.status.get(REVOKED, ("", None))[0] != "needs_reauth":
        unmet.append(f"{REVOKED}: not yet marked needs_reauth")
    if not story.openings[THROTTLED]:
        unmet.append(f"{THROTTLED}: breaker has not opened")
    still_open = [t for t, (state, _) in s.breaker.items() if state != "closed"]
    if still_open:
        unmet.append(f"breaker not closed again: {', '.join(still_open)}")
    return unmet


def _live_view(
    story: _Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> RenderableType:
    table = Table(title=f"synckit demo: {story.at():.1f}s", title_justify="left")
    for col in (
        "tenant",
        "connection",
        "breaker",
        "synced",
        "dead letters",
        "429s",
        "503s",
        "retries",
        "sent",
        "token refreshes",
    ):
        table.add_column(col)
    for plan in PLANS:
        t = plan.tenant
        status = s.status.get(t, ("-", None))[0]
        breaker = s.breaker.get(t, ("-", None))[0]
        table.add_row(
            t,
            _colour(status, status == "active"),
            _colour(breaker, breaker == "closed"),
            f"{len(s.synced.get(t, ()))}/{len(_well_formed(sim, t))}",
            str(s.dlq[t]),
            str(sim.stats.throttled[t]),
            str(sim.stats.server_errors[t]),
            str(sum(s.retried.get(t, Counter()).values())),
            f"{s.sends_done[t]}/{len(enqueued[t])}",
            str(sim.stats.token_refreshes[t]),
        )
    lines = [Text.from_markup(f"[dim]{at:5.1f}s[/] {text}") for at, text in story.events[-8:]]
    return Group(table, *lines)


def _colour(text: str, good: bool) -> str:
    return f"[green]{text}[/]" if good else f"[red]{text}[/]"


_HOST = re.compile(r"https?://[^/\s]+(/v1\.0)?")


_NEEDS_REAUTH = re.compile(r"^(NeedsReauth: )?tenant '[^']*' needs re-authorisation: ")


def _short(text: str, limit: int = 90) -> str:
    """One line, without the simulator's address or the tenant's name repeated."""
    text = _NEEDS_REAUTH.sub(r"\1", _HOST.sub("", " ".join(text.split())))
    text = text.split("; run `synckit tenants reauth", 1)[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the summary -------------------------------------------------------------------------------


def _summary(
    reader: DemoReader,
    example: ModuleType,
    sim: GraphSimulator,
    wire: _Wire,
    story: _Story,
    enqueued: dict[str, list[str]],
    elapsed: float,
    unmet: list[str],
    db_path: Path,
) -> dict[str, Any]:
    final = read_snapshot(reader, _synced_ids)
    rows = reader.read(summary_rows)
    audit: dict[str, dict[str, int]] = defaultdict(lambda: {"ok": 0, "failed": 0})
    for r in rows.audit:
        audit[r.tenant]["ok"] += int(r.ok)
        audit[r.tenant]["failed"] += int(r.failed)
    job_rows = rows.jobs
    dlq_rows = rows.dead_letters
    intent_rows = {(r.tenant, r.intent_key): r for r in rows.intents}
    breaker_rows = rows.breakers
    pending_by_resource = Counter(rows.unfinished_resources)

    jobs_ok: Counter[str] = Counter()
    reasons: Counter[tuple[str, str, str]] = Counter()
    for r in job_rows:
        tenant = r.payload.get("tenant") if isinstance(r.payload, dict) else None
        if not tenant:
            continue
        if r.status == "succeeded":
            jobs_ok[tenant] += 1
        for e in r.errors or []:
            reasons[(tenant, str(e.get("error_class")), _short(str(e.get("message", ""))))] += 1

    tenants = []
    lost_total = 0
    for plan in PLANS:
        t = plan.tenant
        found = sum(
            1
            for key in enqueued[t]
            if (row := intent_rows.get((t, key))) is not None
            and isinstance(row.result, dict)
            and "id" in row.result
        )
        lost_total += sim.stats.lost_sends[t]
        status, reason = final.status.get(t, ("?", None))
        tenants.append(
            {
                "tenant": t,
                "role": plan.role,
                "status": status,
                "status_reason": reason,
                "breaker": final.breaker.get(t, ("?", None))[0],
                "synced": len(final.synced.get(t, ())),
                "in_mailbox": len(_well_formed(sim, t)),
                "malformed": len(sim.mailbox(t).malformed_ids),
                "dead_letters": final.dlq[t],
                "checkpoint": _cursor_kind(final.cursor.get(t)),
                "requests": sim.stats.requests[t],
                "throttled_429": sim.stats.throttled[t],
                "server_errors_503": sim.stats.server_errors[t],
                "retries": dict(sorted(final.retried.get(t, Counter()).items())),
                "token_refreshes": sim.stats.token_refreshes[t],
                "token_refusals": sum(
                    n for k, n in sim.stats.token_errors.items() if k.startswith(f"{t}:")
                ),
                "full_syncs": sim.stats.full_syncs[t],
                "expired_delta_tokens": sim.stats.expired_delta_tokens[t],
                "audit": dict(audit[t]),
                "jobs_succeeded": jobs_ok[t],
                "records_handled": audit[t]["ok"] - jobs_ok[t],
                "sends": {
                    "enqueued": len(enqueued[t]),
                    "done": final.sends_done[t],
                    "lost_responses": sim.stats.lost_sends[t],
                    "found_after_lost_response": found,
                    "send_calls": sim.stats.sends[t],
                },
            }
        )

    sent = []
    for plan in PLANS:
        for key in enqueued[plan.tenant]:
            row = intent_rows.get((plan.tenant, key))
            imid = example.internet_message_id(plan.tenant, key)
            sent.append(
                {
                    "tenant": plan.tenant,
                    "key": key,
                    "internet_message_id": imid,
                    "intent_status": row.status if row is not None else None,
                    "intent_attempts": row.attempts if row is not None else 0,
                    "found_after_lost_response": bool(
                        row is not None and isinstance(row.result, dict) and "id" in row.result
                    ),
                    "copies_in_sent_items": len(sim.find_sent(plan.tenant, imid)),
                }
            )

    breakers = []
    for r in breaker_rows:
        t = _resource_tenant(r.resource_key)
        breakers.append(
            {
                "resource_key": r.resource_key,
                "tenant": t,
                "opened": len(story.openings.get(t, ())),
                "state": r.state,
                "last_error_class": r.last_error_class,
            }
        )

    needs_reauth = []
    for t, (status, reason) in sorted(final.status.items()):
        if status != "needs_reauth":
            continue
        needs_reauth.append(
            {
                "tenant": t,
                "reason": reason,
                "jobs_waiting": pending_by_resource.get(f"graph_mail:{t}", 0),
                "messages_not_synced": len(_well_formed(sim, t) - final.synced.get(t, set())),
            }
        )

    return {
        "converged": not unmet,
        "unmet": unmet,
        "elapsed_seconds": round(elapsed, 1),
        "database_url": DB_URL,
        "database_path": str(db_path),
        "tenants": tenants,
        "retry_reasons": [
            {"tenant": t, "error_class": cls, "reason": reason, "count": n}
            for (t, cls, reason), n in sorted(reasons.items())
        ],
        "retry_after": retry_after_report(wire.calls),
        "breakers": breakers,
        "needs_reauth": needs_reauth,
        "dead_letters": [
            {
                "tenant": r.tenant,
                "kind": r.kind,
                "record_id": r.record_id,
                "error_class": r.error_class,
                "status": r.status,
                "attempts": r.attempt_count,
                "error": _short(r.error_message, 200),
            }
            for r in dlq_rows
        ],
        "sent": sent,
        "lost_responses": lost_total,
        "events": [
            {"at": round(at, 1), "text": Text.from_markup(t).plain} for at, t in story.events
        ],
        "next_commands": _next_commands(False),
    }


def _next_commands(kept_key: bool) -> list[str]:
    """What to run on the demo's database afterwards; the console last, with its App (so
    "sync now", record replays and re-authorising work) and, when the demo made the key,
    the key read from the file it kept."""
    key = f"SYNCKIT_SECRET_KEY=$(cat {KEY_FILE}) " if kept_key else ""
    return [
        f"synckit status --database-url {DB_URL}",
        f"synckit dlq ls --database-url {DB_URL}",
        f"synckit tenants ls --database-url {DB_URL}",
        f"{key}synckit web --app {APP_SPEC} --database-url {DB_URL}",
    ]


def _cursor_kind(cursor: Any) -> str | None:
    if isinstance(cursor, dict):
        for kind in ("deltaLink", "nextLink"):
            if cursor.get(kind):
                return kind
    return None


def render_summary(summary: dict[str, Any], out: Console) -> None:
    """The tables printed after the run."""
    out.print()
    verdict = "[green]converged[/]" if summary["converged"] else "[red]did NOT converge[/]"
    out.print(f"[bold]What happened[/] ({summary['elapsed_seconds']}s, {verdict})")
    t = Table(title="Tenants", title_justify="left")
    for col in (
        "tenant",
        "connection",
        "synced",
        "dead letters",
        "requests",
        "429s",
        "503s",
        "retries",
        "token refreshes",
        "full syncs",
    ):
        t.add_column(col)
    for row in summary["tenants"]:
        t.add_row(
            row["tenant"],
            _colour(row["status"], row["status"] == "active"),
            f"{row['synced']} of {row['in_mailbox']}",
            str(row["dead_letters"]),
            str(row["requests"]),
            str(row["throttled_429"]),
            str(row["server_errors_503"]),
            str(sum(row["retries"].values())),
            str(row["token_refreshes"])
            + (f" ({row['token_refusals']} refused)" if row["token_refusals"] else ""),
            str(row["full_syncs"]),
        )
    out.print(t)

    feed = summary.get("change_feed") or []
    if feed:
        t = Table(
            title="The app reads what changed: app.records(tenant, 'messages').changes(since=...)",
            title_justify="left",
        )
        for col in ("tenant", "added", "updated", "deleted", "feed pages", "cursor now"):
            t.add_column(col)
        for f in feed:
            t.add_row(
                f["tenant"],
                str(f.get("added", 0)),
                str(f.get("updated", 0)),
                str(f.get("deleted", 0)),
                str(f["pages"]),
                str(f["cursor"]),
            )
        out.print(t)

    t = Table(title="Retries, and why (jobs.errors)", title_justify="left")
    for col in ("tenant", "class", "reason", "count"):
        t.add_column(col)
    for r in summary["retry_reasons"]:
        t.add_row(r["tenant"], r["error_class"], r["reason"], str(r["count"]))
    out.print(t)
    ra = summary["retry_after"]
    if ra["answers"]:
        shortest = ra["shortest_wait_seconds"]
        out.print(
            f"Retry-After honoured: {ra['honoured']} of {ra['answers']} 429 answers asked for "
            f"{' or '.join(f'{a:g}s' for a in ra['asked_seconds'])} and got it"
            + (
                f": the tenant's next request came {shortest}s later at the soonest"
                if shortest is not None
                else ""
            )
            + (f"; [red]{ra['not_honoured']} did not[/]" if ra["not_honoured"] else "")
            + (f"; {ra['no_later_request']} had no later request" if ra["no_later_request"] else "")
            + (
                f"; {ra['requests_already_in_flight']} request(s) were already on their way"
                if ra["requests_already_in_flight"]
                else ""
            )
        )

    t = Table(title="Circuit breakers (resources)", title_justify="left")
    for col in ("resource", "times opened", "state now", "last error class"):
        t.add_column(col)
    for b in summary["breakers"]:
        t.add_row(b["resource_key"], str(b["opened"]), b["state"], b["last_error_class"] or "-")
    out.print(t)

    t = Table(title="Needs re-authorisation (connections)", title_justify="left")
    for col in ("tenant", "reason", "jobs waiting", "messages waiting"):
        t.add_column(col)
    for n in summary["needs_reauth"]:
        t.add_row(
            n["tenant"],
            _short(n["reason"] or "", 100),
            str(n["jobs_waiting"]),
            str(n["messages_not_synced"]),
        )
    out.print(t)

    t = Table(title="Dead letters (dead_letters)", title_justify="left")
    for col in ("tenant", "record", "class", "status", "error"):
        t.add_column(col)
    for d in summary["dead_letters"]:
        t.add_row(
            d["tenant"],
            _short(d["record_id"], 20),
            d["error_class"],
            d["status"],
            _short(d["error"], 70),
        )
    out.print(t)

    t = Table(title="Mail sent exactly once (intents; Sent Items)", title_justify="left")
    for col in ("tenant", "send", "attempts", "answer lost, found by id", "copies in Sent Items"):
        t.add_column(col)
    for s in summary["sent"]:
        copies = s["copies_in_sent_items"]
        t.add_row(
            s["tenant"],
            s["key"],
            str(s["intent_attempts"]),
            "yes" if s["found_after_lost_response"] else "-",
            _colour(str(copies), copies == 1),
        )
    out.print(t)
    out.print(
        f"{summary['lost_responses']} sendMail answers were lost; "
        f"{sum(1 for s in summary['sent'] if s['copies_in_sent_items'] == 1)} of "
        f"{len(summary['sent'])} mails are in Sent Items exactly once."
    )
    out.print()
    out.print("See for yourself:")
    for command in summary["next_commands"]:
        out.print(f"  {command}", highlight=False)
