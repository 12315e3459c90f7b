"""``synckit sync TENANT [--stream S] [--wait]``: run a tenant's poll cycle now.

The cycle goes through the queue as an ordinary ``synckit.poll`` job, with the unique key
the scheduler uses (``poll:<tenant>:<stream>``, so never two at once) and the tenant's
resource key, so breakers, pacing and in-flight limits apply to it exactly as to a
scheduled cycle. A worker runs it. ``--wait`` follows it until it ends: pages committed,
records handled and failed, dead letters, with a rich display on a terminal and one JSON
line per job with ``--json``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from sqlalchemy import func, select

from synckit.app import App
from synckit.cli.app_loader import app_option, load_app
from synckit.cli.options import CliError, database_option, run
from synckit.clock import utcnow
from synckit.runtime.poll import POLL_KIND, POLL_MAX_ATTEMPTS, poll_key
from synckit.runtime.tenants import get_tenant
from synckit.store.db import Database
from synckit.store.jobs import JobSpec, enqueue_many, get_job
from synckit.store.tables import audit_buckets, checkpoints, dead_letters, jobs

__all__ = ["CycleProgress", "enqueue_cycles", "poll_job_spec", "sync_command"]

_ENDED = frozenset({"succeeded", "dead", "cancelled", "discarded"})
#: How long a cycle may wait unclaimed before --wait says no worker seems to run.
NO_WORKER_HINT_AFTER = 10.0


def poll_job_spec(tenant: str, connector: str, stream: str, resource_key: str) -> JobSpec:
    """The job of one cycle: what the scheduler enqueues (runtime/poll.py), field for field."""
    return JobSpec(
        kind=POLL_KIND,
        payload={"tenant": tenant, "connector": connector, "stream": stream},
        resource_key=resource_key,
        unique_key=poll_key(tenant, stream),
        max_attempts=POLL_MAX_ATTEMPTS,
    )


@dataclass
class CycleProgress:
    """What ``--wait`` shows of one cycle job."""

    stream: str
    job_id: int
    created: bool
    status: str = "pending"
    attempts: int = 0
    pages: int = 0
    last_error: str | None = None
    _checkpoint_at: datetime | None = field(default=None, repr=False)

    @property
    def ended(self) -> bool:
        return self.status in _ENDED

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "job_id": self.job_id,
            "created": self.created,
            "status": self.status,
            "attempts": self.attempts,
            "pages": self.pages,
            "last_error": self.last_error,
        }


async def enqueue_cycles(
    db: Database, app: App, tenant: str, streams: Sequence[str] = ()
) -> tuple[str, list[CycleProgress]]:
    """Enqueue a cycle of each of ``streams`` (default: all) of ``tenant``, now.

    Returns the connector's name and one :class:`CycleProgress` per stream; a cycle
    already queued or running is reported (``created`` False) rather than doubled.
    """
    t = await get_tenant(db, tenant)
    cls = app.connector(t.connector)
    if t.status != "active":
        reason = f" ({t.status_reason})" if t.status_reason else ""
        hint = "synckit tenants reauth" if t.status == "needs_reauth" else "synckit tenants resume"
        raise CliError(f"tenant {tenant!r} is {t.status}{reason}: `{hint} {tenant}` first")
    names = [cls.stream(s).name for s in streams] or [s.name for s in cls.declared_streams()]
    if not names:
        raise CliError(f"connector {cls.name!r} does not poll: nothing to sync")
    specs = [poll_job_spec(t.tenant, t.connector, s, t.resource_key) for s in names]
    enqueued = await enqueue_many(db, specs)
    return t.connector, [
        CycleProgress(stream=s, job_id=e.id, created=e.created)
        for s, e in zip(names, enqueued, strict=True)
    ]


@dataclass
class _Totals:
    ok: int = 0
    failed: int = 0
    dead_letters: int = 0


async def _totals(db: Database, tenant: str, connector: str, since: datetime) -> _Totals:
    minute = since.replace(second=0, microsecond=0)
    async with db.begin() as conn:
        ok, failed = (
            await conn.execute(
                select(
                    func.coalesce(func.sum(audit_buckets.c.ok), 0),
                    func.coalesce(func.sum(audit_buckets.c.failed), 0),
                ).where(
                    audit_buckets.c.tenant == tenant,
                    audit_buckets.c.connector == connector,
                    audit_buckets.c.minute >= minute,
                )
            )
        ).one()
        letters = (
            await conn.execute(
                select(func.count()).where(
                    dead_letters.c.tenant == tenant,
                    dead_letters.c.connector == connector,
                    dead_letters.c.last_attempt_at >= since,
                )
            )
        ).scalar_one()
    return _Totals(int(ok), int(failed), int(letters))


async def _refresh(db: Database, tenant: str, connector: str, cycle: CycleProgress) -> None:
    info = await get_job(db, cycle.job_id)
    cycle.status, cycle.attempts, cycle.last_error = info.status, info.attempts, info.last_error
    async with db.begin() as conn:
        at = (
            await conn.execute(
                select(checkpoints.c.updated_at).where(
                    checkpoints.c.tenant == tenant,
                    checkpoints.c.connector == connector,
                    checkpoints.c.stream == cycle.stream,
                )
            )
        ).scalar()
        # Each committed page writes the checkpoint: a new time is a new page (a page
        # committed between two looks counts once; the count is a lower bound).
        if (
            at is not None
            and info.status in ("running", "succeeded")
            and at != cycle._checkpoint_at
        ):
            started = (
                await conn.execute(select(jobs.c.created_at).where(jobs.c.id == cycle.job_id))
            ).scalar()
            if started is None or at >= started:
                cycle.pages += 1
            cycle._checkpoint_at = at


async def follow(
    db: Database,
    tenant: str,
    connector: str,
    cycles: list[CycleProgress],
    *,
    out: Console | None,
    every: float = 0.1,
    give_up_after: float | None = None,
) -> _Totals:
    """Watch ``cycles`` until each has ended; the records and dead letters meanwhile."""
    start = utcnow() - timedelta(seconds=1)
    base = await _totals(db, tenant, connector, start)
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
    totals = _Totals()
    try:
        while True:
            for c in cycles:
                if not c.ended:
                    await _refresh(db, tenant, connector, c)
            now_totals = await _totals(db, tenant, connector, start)
            # The audit counts the cycle jobs' own outcomes beside their records (a
            # success of the job is one "ok", each failed attempt one "failed").
            jobs_ok = sum(1 for c in cycles if c.status == "succeeded")
            jobs_failed = sum(c.attempts - (c.status == "succeeded") for c in cycles if c.ended)
            totals = _Totals(
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
            waited = time.monotonic() - began
            if (
                not hinted
                and waited > NO_WORKER_HINT_AFTER
                and all(c.status == "pending" for c in cycles)
            ):
                hinted = True
                if out is not None:
                    out.print(
                        "[yellow]not claimed yet: is a worker running? "
                        "(`synckit worker --app ...`; a paced or broken tenant waits too)[/]"
                    )
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
@click.argument("tenant")
@click.option("--stream", "streams", multiple=True, help="Only this stream (repeatable).")
@click.option("--wait", is_flag=True, help="Follow the cycle until it ends.")
@click.option(
    "--timeout", type=float, default=None, help="With --wait: give up after this many seconds."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@app_option
@database_option
def sync_command(
    tenant: str,
    streams: tuple[str, ...],
    wait: bool,
    timeout: float | None,
    as_json: bool,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """Run TENANT's poll cycle now, through the queue (a worker runs it).

    The cycle is a normal job: never two at once for one stream, and the tenant's
    breaker and pacing apply. With --wait, show its pages, records and dead letters
    until it ends; the exit code is 1 if a cycle did not succeed.
    """
    app = load_app(app_spec)
    out = Console(stderr=True)

    async def go(db: Database) -> tuple[list[CycleProgress], _Totals | None]:
        connector, cycles = await enqueue_cycles(db, app, tenant, streams)
        if not as_json:
            for c in cycles:
                verb = "enqueued" if c.created else "already queued"
                out.print(f"{tenant}/{c.stream}: cycle {verb} (job {c.job_id})", highlight=False)
        if not wait:
            return cycles, None
        totals = await follow(
            db, tenant, connector, cycles, out=None if as_json else out, give_up_after=timeout
        )
        return cycles, totals

    cycles, totals = run(go, database_url)
    if as_json:
        doc: dict[str, Any] = {"tenant": tenant, "cycles": [c.to_json() for c in cycles]}
        if totals is not None:
            doc.update(records=totals.ok, failed=totals.failed, dead_letters=totals.dead_letters)
        click.echo(json.dumps(doc, sort_keys=True))
    elif totals is not None:
        for c in cycles:
            line = f"{tenant}/{c.stream}: {c.status} after {c.attempts} attempt(s)"
            if c.status != "succeeded" and c.last_error:
                line += f": {c.last_error[:200]}"
            out.print(line, highlight=False, markup=False)
        out.print(
            f"{totals.ok} records handled, {totals.failed} failed, "
            f"{totals.dead_letters} dead letters",
            highlight=False,
        )
    if totals is not None and any(c.status != "succeeded" for c in cycles):
        raise SystemExit(1)
