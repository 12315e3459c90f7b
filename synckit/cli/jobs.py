"""``synckit jobs ls|show|cancel|retry|reschedule|priority|set-payload|enqueue``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import click
from rich.table import Table

from synckit.cli.options import (
    JOB_ID,
    PRIORITY,
    ROWS_SHOWN,
    CliError,
    cell,
    console,
    database_option,
    parse_duration,
    parse_moment,
    run,
)
from synckit.clock import utcnow
from synckit.redaction import redact
from synckit.store.db import Database
from synckit.store.jobs import admin, enqueueing
from synckit.store.jobs.admin import JobInfo, count_unreadable_run_at, unreadable_run_at
from synckit.store.views import queue_depth

__all__ = ["jobs"]


@click.group("jobs")
def jobs() -> None:
    """List, inspect and change jobs."""


def _job_json(info: JobInfo) -> dict[str, Any]:
    data = dataclasses.asdict(info)
    for k, v in data.items():
        if isinstance(v, datetime):
            data[k] = v.isoformat()
    # Payloads and error texts may quote what an API echoed back: printed redacted.
    out: dict[str, Any] = redact(data)
    return out


@jobs.command("ls")
@click.option(
    "--status",
    type=click.Choice(["pending", "running", "succeeded", "dead", "cancelled", "discarded"]),
)
@click.option("--kind")
@click.option("--resource-key")
@click.option("--since", help="Updated within this long (e.g. 1h, 2d).")
@click.option("--created-since", help="Created within this long (e.g. 1h, 2d).")
@click.option(
    "--unreadable",
    "stuck",
    is_flag=True,
    help="Only pending jobs whose run_at cannot be read (they never run), oldest first.",
)
@click.option("--limit", type=ROWS_SHOWN, default=50, show_default=True)
@click.option("--before", type=JOB_ID, help="Jobs older than this id (the last one shown).")
@click.option("--json", "as_json", is_flag=True)
@database_option
def jobs_ls(
    status: str | None,
    kind: str | None,
    resource_key: str | None,
    since: str | None,
    created_since: str | None,
    stuck: bool,
    limit: int,
    before: int | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """List jobs, newest first, with the queue counted by status.

    Pending jobs whose run_at cannot be read never run: they are counted below the
    table (on stderr with --json) and listed with --unreadable.
    """
    updated_since = utcnow() - parse_duration(since) if since else None
    created_after = utcnow() - parse_duration(created_since) if created_since else None

    async def go(d: Database) -> tuple[list[JobInfo], dict[str, dict[str, int]], int]:
        async with d.read() as conn:
            queue = await queue_depth(conn)
            unreadable = await count_unreadable_run_at(conn)
            ids = [j.id for j in await unreadable_run_at(conn, limit=limit)] if stuck else []
        if stuck:
            return [await admin.get_job(d, i) for i in ids], queue, unreadable
        found = await admin.list_jobs(
            d,
            status=status,
            kind=kind,
            resource_key=resource_key,
            updated_since=updated_since,
            created_since=created_after,
            limit=limit,
            before=before,
        )
        return found, queue, unreadable

    found, queue, unreadable = run(go, database_url)
    never = (
        f"{unreadable} pending job(s) never run: their run_at cannot be read; "
        "list them with `synckit jobs ls --unreadable`"
        if unreadable and not stuck
        else None
    )
    more = f"next page: --before {found[-1].id}" if len(found) == limit and not stuck else None
    if as_json:
        for info in found:
            click.echo(json.dumps(_job_json(info), sort_keys=True))
        for line in (more, never):
            if line:
                click.echo(line, err=True)
        return
    _print_jobs(found, queue, stuck=stuck, more=more, never=never)


def _print_jobs(
    found: list[JobInfo],
    queue: dict[str, dict[str, int]],
    *,
    stuck: bool,
    more: str | None,
    never: str | None,
) -> None:
    """``jobs ls``'s table: the queue counted by status, then the jobs."""
    by_status: dict[str, int] = {}
    for counts in queue.values():
        for st, n in counts.items():
            by_status[st] = by_status.get(st, 0) + n
    if by_status:
        said = ", ".join(f"{n} {st}" for st, n in sorted(by_status.items()))
        console.print(cell(f"Queue: {sum(by_status.values())} jobs ({said})"), highlight=False)
    title = "Pending jobs that never run (run_at unreadable)" if stuck else "Jobs"
    table = Table(title=f"{title} ({len(found)})")
    for col in ("id", "kind", "status", "resource", "prio", "attempts", "run at", "last error"):
        table.add_column(col)
    for j in found:
        table.add_row(
            str(j.id),
            cell(j.kind),
            cell(j.status),
            cell(j.resource_key or "-"),
            str(j.priority),
            f"{j.attempts}/{j.max_attempts}",
            cell(_iso(j.run_at) if "run_at" not in j.unreadable else "<unreadable>"),
            cell(j.last_error, 60),
        )
    if more:
        table.caption = more
    console.print(table)
    if never:
        console.print(never, style="bold red", markup=False, highlight=False)


def _iso(value: object) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value)


@jobs.command("show")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on one line (for scripts).")
@database_option
def jobs_show(job_id: int, as_json: bool, database_url: str | None) -> None:
    """Show one job with its payload and error history (JSON, indented; --json: one
    line, as `jobs ls --json` prints each job)."""
    info = run(lambda d: admin.get_job(d, job_id), database_url)
    click.echo(json.dumps(_job_json(info), indent=None if as_json else 2, sort_keys=True))


def _job_action(make: Callable[[Database], Awaitable[JobInfo]], url: str | None) -> None:
    info = run(make, url)
    click.echo(
        f"job {info.id}: {info.status}, run at {_iso(info.run_at)}, priority {info.priority}"
    )


@jobs.command("cancel")
@click.argument("job_id", type=JOB_ID)
@click.option("--reason", default="cancelled by operator")
@database_option
def jobs_cancel(job_id: int, reason: str, database_url: str | None) -> None:
    """Cancel a job (a running one is stopped at its next heartbeat)."""
    _job_action(lambda d: admin.cancel_job(d, job_id, reason), database_url)


@jobs.command("retry")
@click.argument("job_id", type=JOB_ID)
@database_option
def jobs_retry(job_id: int, database_url: str | None) -> None:
    """Run a job again now (an ended job starts over with fresh attempts)."""
    _job_action(lambda d: admin.retry_job(d, job_id), database_url)


@jobs.command("reschedule")
@click.argument("job_id", type=JOB_ID)
@click.option("--at", "at", help="ISO 8601 time (with zone).")
@click.option("--in", "after", help="A delay from now, e.g. 10m.")
@database_option
def jobs_reschedule(
    job_id: int, at: str | None, after: str | None, database_url: str | None
) -> None:
    """Move a job's next run."""
    if (at is None) == (after is None):
        raise CliError("give exactly one of --at or --in")
    when = parse_moment(at) if at is not None else utcnow() + parse_duration(after or "0")
    _job_action(lambda d: admin.reschedule_job(d, job_id, when), database_url)


@jobs.command("priority")
@click.argument("job_id", type=JOB_ID)
@click.argument("priority", type=PRIORITY)
@database_option
def jobs_priority(job_id: int, priority: int, database_url: str | None) -> None:
    """Change a job's priority (higher runs first)."""
    _job_action(lambda d: admin.set_priority(d, job_id, priority), database_url)


@jobs.command("set-payload")
@click.argument("job_id", type=JOB_ID)
@click.argument("payload")
@database_option
def jobs_set_payload(job_id: int, payload: str, database_url: str | None) -> None:
    """Replace a job's payload with the JSON document PAYLOAD."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise CliError(f"payload is not JSON: {exc}") from exc
    _job_action(lambda d: admin.replace_payload(d, job_id, data), database_url)


@jobs.command("enqueue")
@click.argument("kind")
@click.option("--payload", default="{}", help="JSON payload.")
@click.option("--resource-key")
@click.option("--priority", type=PRIORITY, default=0)
@click.option("--in", "after", help="Delay, e.g. 10m.")
@click.option("--unique-key")
@database_option
def jobs_enqueue(
    kind: str,
    payload: str,
    resource_key: str | None,
    priority: int,
    after: str | None,
    unique_key: str | None,
    database_url: str | None,
) -> None:
    """Enqueue a job by hand."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise CliError(f"payload is not JSON: {exc}") from exc
    delay = parse_duration(after) if after else None
    out = run(
        lambda d: enqueueing.enqueue(
            d,
            kind,
            data,
            resource_key=resource_key,
            priority=priority,
            delay=delay,
            unique_key=unique_key,
        ),
        database_url,
    )
    click.echo(f"job {out.id} {'enqueued' if out.created else 'already queued'}")
