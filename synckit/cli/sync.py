"""``synckit sync TENANT|--all|--connector NAME [--stream S] [--wait]``: run poll cycles now.

The cycle is enqueued by :func:`synckit.runtime.admin.actions.enqueue_cycles` as an ordinary
poll job; a worker runs it. ``--wait`` follows it until it ends: pages committed,
records handled and failed, dead letters, with a rich display on a terminal and one JSON
line per tenant with ``--json``. It stops as soon as the cycle cannot go on (the tenant
needs re-authorisation or was paused), with the reason and exit code 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from synckit import tracing
from synckit.cli.app_loader import app_option, load_app
from synckit.cli.options import CliError, Seconds, cell, database_option, markup_escaped, run
from synckit.clock import utcnow
from synckit.errors.exceptions import TenantNotFound
from synckit.runtime.admin.actions import CycleProgress, enqueue_cycles, waiting_hint
from synckit.runtime.admin.tenants import get_tenant, list_tenants
from synckit.store.db import Database
from synckit.store.jobs.admin import get_job
from synckit.store.views import CycleCounts, checkpoint_moment, cycle_counts, job_created_at
from synckit.store.workers import alive_count

__all__ = ["CycleBlocked", "follow", "sync_command"]

#: How long a cycle may wait unclaimed before --wait says no worker seems to run.
NO_WORKER_HINT_AFTER = 10.0


async def _counts(db: Database, tenant: str, connector: str, since: datetime) -> CycleCounts:
    async with db.read() as conn:
        return await cycle_counts(conn, tenant, connector, since)


async def _refresh(db: Database, tenant: str, connector: str, cycle: CycleProgress) -> None:
    info = await get_job(db, cycle.job_id)
    cycle.status, cycle.attempts, cycle.last_error = info.status, info.attempts, info.last_error
    async with db.read() as conn:
        at = await checkpoint_moment(conn, tenant, connector, cycle.stream)
        # Each committed page writes the checkpoint: a new time is a new page (a page
        # committed between two looks counts once; the count is a lower bound).
        if (
            at is not None
            and info.status in ("running", "succeeded")
            and at != cycle._checkpoint_at
        ):
            started = await job_created_at(conn, cycle.job_id)
            if started is None or at >= started:
                cycle.pages += 1
            cycle._checkpoint_at = at


async def _hint(db: Database, cycle: CycleProgress) -> str:
    """What the pending cycle waits for (:func:`~synckit.runtime.admin.actions.waiting_hint`)."""
    info = await get_job(db, cycle.job_id)
    now = utcnow()
    return waiting_hint(
        run_at=info.run_at,
        last_error=info.last_error,
        error_class=info.error_class,
        attempts=info.attempts,
        max_attempts=info.max_attempts,
        workers_alive=await alive_count(db, now=now),
        now=now,
    )


class CycleBlocked(Exception):
    """The followed cycles cannot go on until an operator acts (the message says why)."""


async def blocked_reason(db: Database, tenant: str) -> str | None:
    """Why ``tenant``'s cycles cannot run now (re-authorisation needed, paused, removed),
    with what to do; None while they can."""
    try:
        t = await get_tenant(db, tenant, reveal=False)
    except TenantNotFound:
        return f"tenant {tenant!r} was removed"
    if t.status == "active":
        return None
    why = f" ({t.status_reason})" if t.status_reason else ""
    if t.status == "needs_reauth":
        return f"tenant {tenant!r} needs re-authorisation{why}: `synckit tenants reauth {tenant}`"
    if t.status == "paused":
        return f"tenant {tenant!r} is paused{why}: `synckit tenants resume {tenant}`"
    return f"tenant {tenant!r} is {t.status}{why}"


async def follow(
    db: Database,
    tenant: str,
    connector: str,
    cycles: list[CycleProgress],
    *,
    out: Console | None,
    every: float = 0.1,
    give_up_after: float | None = None,
) -> CycleCounts:
    """Watch ``cycles`` until each has ended; the records and dead letters meanwhile.

    Raises :class:`CycleBlocked` as soon as a cycle that has not ended cannot go on: its
    tenant needs re-authorisation, was paused or removed (the job stays queued)."""
    start = utcnow() - timedelta(seconds=1)
    base = await _counts(db, tenant, connector, start)
    began = time.monotonic()
    hinted = False
    progress = None
    tasks: dict[str, Any] = {}
    if out is not None and out.is_terminal:
        progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=out
        )
        progress.start()
        for c in cycles:
            tasks[c.stream] = progress.add_task(f"{tenant}/{c.stream}", total=None)
    totals = CycleCounts()
    try:
        while True:
            for c in cycles:
                if not c.ended:
                    await _refresh(db, tenant, connector, c)
            now_totals = await _counts(db, tenant, connector, start)
            # The audit counts the cycle jobs' own outcomes beside their records (a
            # success of the job is one "ok", each failed attempt one "failed").
            jobs_ok = sum(1 for c in cycles if c.status == "succeeded")
            jobs_failed = sum(c.attempts - (c.status == "succeeded") for c in cycles if c.ended)
            totals = CycleCounts(
                max(0, now_totals.ok - base.ok - jobs_ok),
                max(0, now_totals.failed - base.failed - jobs_failed),
                now_totals.dead_letters,
            )
            if progress is not None:
                for c in cycles:
                    progress.update(
                        tasks[c.stream],
                        description=(
                            f"{tenant}/{c.stream}: {c.status}, attempt {c.attempts}, "
                            f"{c.pages}+ pages; {totals.ok} records, {totals.failed} failed, "
                            f"{totals.dead_letters} dead letters"
                        ),
                    )
            if all(c.ended for c in cycles):
                return totals
            blocked = await blocked_reason(db, tenant)
            if blocked is not None:
                raise CycleBlocked(f"{blocked}; the cycle stays queued")
            waited = time.monotonic() - began
            if (
                not hinted
                and waited > NO_WORKER_HINT_AFTER
                and all(c.status == "pending" for c in cycles)
            ):
                hinted = True
                if out is not None:
                    for c in cycles:
                        line = markup_escaped(f"{c.stream}: {await _hint(db, c)}")
                        out.print(f"[yellow]{line}[/]")
            if give_up_after is not None and waited > give_up_after:
                raise CliError(
                    f"the cycle has not ended after {give_up_after:g}s "
                    f"({', '.join(f'{c.stream}: {c.status}' for c in cycles)}); "
                    "it stays queued"
                )
            await asyncio.sleep(every)
    finally:
        if progress is not None:
            progress.stop()


@click.command("sync")
@click.argument("tenant", required=False)
@click.option("--all", "all_tenants", is_flag=True, help="Every active tenant.")
@click.option("--connector", "connector_name", default=None, help="Every active tenant of it.")
@click.option("--stream", "streams", multiple=True, help="Only this stream (repeatable).")
@click.option("--wait", is_flag=True, help="Follow the cycle until it ends.")
@click.option(
    "--timeout",
    type=Seconds(0, 86_400, min_open=True),
    default=None,
    help="With --wait: give up after this many seconds.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@app_option
@database_option
def sync_command(
    tenant: str | None,
    all_tenants: bool,
    connector_name: str | None,
    streams: tuple[str, ...],
    wait: bool,
    timeout: float | None,
    as_json: bool,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """Run TENANT's poll cycle now (or every active tenant's: --all, --connector NAME),
    through the queue (a worker runs it).

    The cycle is a normal job: never two at once for one stream, and the tenant's
    breaker and pacing apply. With --wait, show its pages, records and dead letters
    until it ends; the exit code is 1 if a cycle did not succeed, or could not go on
    (the tenant needs re-authorisation, was paused): that is said at once, not after
    --timeout.
    """
    if sum((tenant is not None, all_tenants, connector_name is not None)) != 1:
        raise CliError("name one TENANT, or give --all or --connector NAME")
    app = load_app(app_spec)
    out = Console(stderr=True)
    # With OTEL_TRACES_EXPORTER (or the app's own provider), the cycles enqueued here are
    # children of this command's span: one trace from the command to the API calls.
    tracing.configure_from_env()

    async def go(db: Database) -> list[_Followed]:
        with tracing.span(
            "synckit.sync", synckit__tenant=tenant, synckit__connector=connector_name
        ):
            return await _go(db)

    async def _go(db: Database) -> list[_Followed]:
        names = [tenant] if tenant is not None else await _active(db, connector_name, out)
        followed = []
        for name in names:
            connector, cycles = await enqueue_cycles(db, app, name, streams)
            followed.append(_Followed(name, connector, cycles))
            if not as_json:
                for c in cycles:
                    verb = "enqueued" if c.created else "already queued"
                    out.print(f"{name}/{c.stream}: cycle {verb} (job {c.job_id})", highlight=False)
        if not wait:
            return followed
        deadline = None if timeout is None else time.monotonic() + timeout
        for f in followed:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                f.totals = await follow(
                    db, f.tenant, f.connector, f.cycles, out=None if as_json else out,
                    give_up_after=left,
                )  # fmt: skip
            except CycleBlocked as exc:
                f.blocked = str(exc)
        return followed

    try:
        followed = run(go, database_url)
    finally:
        tracing.shutdown()
    for f in followed:
        _report(f, out, as_json=as_json)
    if wait and any(not f.succeeded for f in followed):
        raise SystemExit(1)


def _report(f: _Followed, out: Console, *, as_json: bool) -> None:
    """What one tenant's cycles came to: a JSON line, or lines for people."""
    if as_json:
        doc: dict[str, Any] = {"tenant": f.tenant, "cycles": [c.to_json() for c in f.cycles]}
        if f.totals is not None:
            doc.update(
                records=f.totals.ok, failed=f.totals.failed,
                dead_letters=f.totals.dead_letters,
            )  # fmt: skip
        if f.blocked is not None:
            doc["blocked"] = f.blocked
        click.echo(json.dumps(doc, sort_keys=True))
    elif f.blocked is not None:
        out.print(
            cell(f"{f.tenant}: stopped waiting: {f.blocked}"),
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    elif f.totals is not None:
        for c in f.cycles:
            line = f"{f.tenant}/{c.stream}: {c.status} after {c.attempts} attempt(s)"
            if c.status != "succeeded" and c.last_error:
                line += f": {c.last_error[:200]}"
            out.print(cell(line), highlight=False, soft_wrap=True)
        out.print(
            f"{f.totals.ok} records handled, {f.totals.failed} failed, "
            f"{f.totals.dead_letters} dead letters",
            highlight=False,
        )


@dataclass
class _Followed:
    tenant: str
    connector: str
    cycles: list[CycleProgress]
    totals: CycleCounts | None = None
    blocked: str | None = None

    @property
    def succeeded(self) -> bool:
        """Every cycle succeeded and the wait was not stopped (the tenant could not go on)."""
        return self.blocked is None and all(c.status == "succeeded" for c in self.cycles)


async def _active(db: Database, connector: str | None, out: Console) -> list[str]:
    """The active tenants (of ``connector``); the others are named as skipped."""
    tenants = await list_tenants(db, connector=connector, reveal=False)
    for t in tenants:
        if t.status != "active":
            out.print(f"{t.tenant}: skipped, {t.status}", highlight=False, markup=False)
    names = [t.tenant for t in tenants if t.status == "active"]
    if not names:
        of = f" of connector {connector!r}" if connector else ""
        raise CliError(f"no active tenant{of} to sync")
    return names
