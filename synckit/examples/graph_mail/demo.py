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
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from synckit.errors.exceptions import SynckitError
from synckit.examples.graph_mail.plan import (
    DB_FILE,
    DEMO_BREAKER,
    DEMO_RETRY,
    HEALTHY,
    KEY_FILE,
    LOST_SEND_RATE,
    PLANS,
    RECOVERED_THROTTLE_RATE,
    REVOKED,
    SENDS_PER_TENANT,
    THROTTLED,
    TICK,
    Snapshot,
    Story,
    example_module,
    landed_ids,
    read_snapshot,
    well_formed,
)
from synckit.examples.graph_mail.reads import DemoReader
from synckit.examples.graph_mail.report import colour, short
from synckit.examples.graph_mail.summary import next_commands, summarise
from synckit.examples.graph_mail.wire import Wire
from synckit.runtime.admin.audit import audit_observer
from synckit.store import migrate
from synckit.store.db import open_database

if TYPE_CHECKING:
    from synckit.examples.graph_mail.simulator import GraphSimulator

__all__ = ["DemoResult", "run_demo"]

# --- the run ---------------------------------------------------------------------------------


@dataclass
class DemoResult:
    summary: dict[str, Any]
    converged: bool


async def run_demo(
    workdir: Path, *, out: Console, converge_within: float = 50.0, live: bool | None = None
) -> DemoResult:
    """Run the demo in ``workdir``; progress and tables go to ``out``."""
    example = example_module()
    from synckit.examples.graph_mail.simulator import GraphSimulator

    db_path = workdir / DB_FILE
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (workdir / f"{DB_FILE}{suffix}").unlink()
    ephemeral_key = _ensure_key(workdir)

    sim = GraphSimulator(seed=2024, page_size=10, lost_send_rate=LOST_SEND_RATE)
    for plan in PLANS:
        sim.add_mailbox(
            plan.tenant, messages=plan.messages, malformed=plan.malformed, **plan.mailbox
        )

    def tenant_of(token: str | None) -> str:
        info = sim.api.token_info(token)
        return (info.subject if info is not None else None) or "?"

    wire = Wire(tenant_of)
    story = Story()
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
            enqueued = await _connect_tenants(example, app, db, sim, base_url)
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
                    lambda: read_snapshot(reader, landed_ids),
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
            summary = summarise(
                reader, example, sim, wire, story, enqueued, elapsed, unmet, db_path
            )
            summary["next_commands"] = next_commands(ephemeral_key)
            summary["change_feed"] = await _read_changes(app, db)
    finally:
        await wire.inner.aclose()
        await db.dispose()
        reader.close()
    return DemoResult(summary, converged=not unmet)


def _ensure_key(workdir: Path) -> bool:
    """Whether the demo made the token key: without ``$SYNCKIT_SECRET_KEY`` it makes one
    and keeps it beside the database (owner only), where the commands printed at the end
    read it. Tokens are always stored encrypted; a stale key file is removed, since it
    would open nothing in the new database."""
    key_path = workdir / KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        key_path.unlink()
    if os.environ.get("SYNCKIT_SECRET_KEY"):
        return False
    from cryptography.fernet import Fernet

    key = Fernet.generate_key().decode()
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key + "\n")
    os.environ["SYNCKIT_SECRET_KEY"] = key
    return True


async def _connect_tenants(
    example: ModuleType, app: Any, db: Any, sim: GraphSimulator, base_url: str
) -> dict[str, list[str]]:
    """Connect each planned tenant to the simulator and enqueue its sends; the keys of
    the sends, per tenant."""
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
    return enqueued


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
    story: Story,
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


def _advance(
    story: Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> None:
    """Fire the scripted events whose moment has come, and narrate what the tables show."""
    _narrate(story, sim, s, enqueued)
    _script_healthy(story, sim, s)
    _script_throttled(story, sim, s, enqueued)
    _script_revoked(story, sim, s, enqueued)


def _narrate(
    story: Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> None:
    """Say what the tables show once it first shows: breakers, re-authorisation, first
    syncs, sends done."""
    for tenant, (state, opened_at) in s.breaker.items():
        if state == "open" and opened_at not in story.openings[tenant]:
            story.openings[tenant].add(opened_at)
            story.say(f"{tenant}: [red]circuit breaker opened[/] (its jobs wait for a probe)")
        if state == "closed" and story.openings[tenant] and story.once(f"closed:{tenant}"):
            story.say(f"{tenant}: [green]circuit breaker closed[/] (the probe succeeded)")
    for tenant, (status, reason) in s.status.items():
        if status == "needs_reauth" and story.once(f"reauth:{tenant}"):
            story.say(f"{tenant}: [red]needs re-authorisation[/] ({short(reason or '', 80)})")
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


def _script_healthy(story: Story, sim: GraphSimulator, s: Snapshot) -> None:
    """Once contoso has synced: expire its delta token (deleting one message and delivering
    three) and every tenant's access token; then watch for its full resync."""
    candidates = sorted(s.synced.get(HEALTHY, set()) & well_formed(sim, HEALTHY))
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
        and s.synced.get(HEALTHY) == well_formed(sim, HEALTHY)
        and story.once("resynced")
    ):
        story.say(f"{HEALTHY}: 410 Gone answered by a full resync; the deleted one forgotten")


def _script_throttled(
    story: Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> None:
    """Once fabrikam has a checkpoint and its sends are done: an outage until its breaker
    opens (or 10 s), then lighter throttling."""
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


def _script_revoked(
    story: Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> None:
    """Once northwind has synced and sent: its admin revokes consent."""
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
    story: Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
) -> list[str]:
    unmet = [what for name, what in _SCRIPT.items() if name not in story.done]
    for t in (HEALTHY, THROTTLED):
        missing = len(well_formed(sim, t) ^ s.synced.get(t, set()))
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
    story: Story, sim: GraphSimulator, s: Snapshot, enqueued: dict[str, list[str]]
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
            colour(status, status == "active"),
            colour(breaker, breaker == "closed"),
            f"{len(s.synced.get(t, ()))}/{len(well_formed(sim, t))}",
            str(s.dlq[t]),
            str(sim.stats.throttled[t]),
            str(sim.stats.server_errors[t]),
            str(sum(s.retried.get(t, Counter()).values())),
            f"{s.sends_done[t]}/{len(enqueued[t])}",
            str(sim.stats.token_refreshes[t]),
        )
    lines = [Text.from_markup(f"[dim]{at:5.1f}s[/] {text}") for at, text in story.events[-8:]]
    return Group(table, *lines)
