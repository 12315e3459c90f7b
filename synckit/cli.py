"""The ``synckit`` command.

The CLI is a thin shell over the async core: each command builds its arguments, then
enters the core through :func:`run` (one ``asyncio.run``). Every :class:`SynckitError`
becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import json
import logging
import re
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from synckit.cli_options import JOB_ID, PRIORITY, cell, database_option
from synckit.cli_options import CliError as CliError
from synckit.cli_options import load_registry as load_registry
from synckit.clock import utcnow
from synckit.errors.exceptions import SynckitError
from synckit.runtime.logging import configure_logging, redact
from synckit.store import jobs as store
from synckit.store.db import Database, database_url_from_env, mask_url, open_database
from synckit.store.jobs import JobInfo

if TYPE_CHECKING:
    from synckit.runtime.worker import OutcomeObserver, Worker, WorkerStats

# Modules that only some commands need are imported by those commands: every
# invocation pays for what it imports, and `synckit jobs ls` needs neither Alembic nor
# the worker.

T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)


def run(
    make: Callable[[Database], Awaitable[T]],
    url: str | None,
    *,
    check: bool = True,
    schema: bool = True,
) -> T:
    """Open the database, run ``make(db)`` in the async core, and dispose of the engine.

    ``schema``: first require the schema at this synckit's revision (every command but
    ``db ...``), so a fresh database says to run ``synckit db upgrade`` and is not created.
    """

    async def main() -> T:
        db = open_database(url)
        try:
            if schema:
                await db.check_schema()
            if check:
                await db.check()
            return await make(db)
        finally:
            await db.dispose()

    try:
        return asyncio.run(main())
    except SynckitError as exc:
        raise CliError(str(exc)) from exc


class LazyGroup(click.Group):
    """A command group whose listed subcommands are imported only when used."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lazy.get(cmd_name)
        if spec is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attr = spec.partition(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command), spec
        return command


@click.group(
    cls=LazyGroup,
    lazy={
        "outbox": "synckit.runtime.outbox_cli:outbox",
        "breakers": "synckit.runtime.breakers_cli:breakers",
        "dlq": "synckit.dlq.cli:dlq",
        "tenants": "synckit.connectors.tenants_cli:tenants",
        "demo": "synckit.demo:demo_command",
        "sync": "synckit.sync_cli:sync_command",
        "web": "synckit.web.cli:web_command",
        "secrets": "synckit.connectors.secrets_cli:secrets_group",
    },
)
@click.version_option(package_name="synckit")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    envvar="SYNCKIT_LOG_LEVEL",
    help="Least severe log events shown (or $SYNCKIT_LOG_LEVEL).",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"], case_sensitive=False),
    default="auto",
    show_default=True,
    envvar="SYNCKIT_LOG_FORMAT",
    help="Log lines as JSON or for people; auto: console on a terminal, JSON otherwise "
    "(or $SYNCKIT_LOG_FORMAT).",
)
def cli(log_level: str, log_format: str) -> None:
    """synckit: third-party API sync that survives crashes and hostile APIs.

    Every command logs the same way: structured events on stderr, secrets redacted,
    so that stdout carries only the command's output (--json stays valid JSON).
    """
    configure_logging(
        json_lines={"auto": None, "json": True, "console": False}[log_format.lower()],
        level=logging.getLevelName(log_level.upper()),
        stream=sys.stderr,
    )


@cli.group()
def db() -> None:
    """Create and migrate the synckit schema."""


@db.command("upgrade")
@click.argument("revision", default="head")
@database_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Migrate the schema up to REVISION (default: head)."""
    from synckit.store import migrate

    async def go(d: Database) -> str | None:
        await migrate.upgrade(d, revision)
        return await migrate.current(d)

    rev = run(go, database_url, schema=False)
    click.echo(f"{mask_url(database_url_from_env(database_url))} at revision {rev}")


@db.command("downgrade")
@click.argument("revision")
@database_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Migrate the schema down to REVISION (`base` removes every table)."""
    from synckit.store import migrate

    async def go(d: Database) -> str | None:
        await migrate.downgrade(d, revision)
        return await migrate.current(d)

    rev = run(go, database_url, schema=False)
    click.echo(f"{mask_url(database_url_from_env(database_url))} at revision {rev or 'base'}")


@db.command("current")
@database_option
def db_current(database_url: str | None) -> None:
    """Print the schema revision the database is at."""
    from synckit.store import migrate

    rev = run(migrate.current, database_url, schema=False)
    head = migrate.head_revision()
    state = "up to date" if rev == head else f"head is {head}"
    click.echo(f"{rev or 'base'} ({state})")


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="Tenants per page.",
)
@click.option("--after", help="Start the page after this tenant (the previous page's last).")
@click.option("--all", "every", is_flag=True, help="Every tenant at once (slow with many).")
@database_option
def status_cmd(
    as_json: bool, limit: int, after: str | None, every: bool, database_url: str | None
) -> None:
    """Show tenants (breaker, lag, error budget, DLQ), queue depth and alerts at a glance.

    Tenants are summed by status and shown a page at a time, by name.
    """
    from synckit.runtime.status import read_status, render_status

    snapshot = run(
        functools.partial(read_status, limit=None if every else limit, after=after),
        database_url,
    )
    if as_json:
        click.echo(json.dumps(snapshot.to_json(), indent=2, sort_keys=True))
        return
    render_status(snapshot, console)


#: The longest duration a command takes: past it, a date computed from now leaves the
#: calendar (or the database's range), so it is a typo, not an intent.
MAX_DURATION = timedelta(days=100 * 366)


def parse_duration(text: str) -> timedelta:
    """``90s``, ``10m``, ``2h``, ``7d`` or a plain number of seconds, up to 100 years."""
    m = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([smhd]?)\s*", text)
    if not m:
        raise CliError(f"cannot read duration {text!r}: use forms like 90s, 10m, 2h, 7d")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    seconds = float(m.group(1)) * unit
    if seconds > MAX_DURATION.total_seconds():
        raise CliError(f"duration {text.strip()!r} is longer than 100 years")
    return timedelta(seconds=seconds)


def parse_moment(text: str, option: str = "--at") -> datetime:
    """An ISO 8601 time with a zone, as UTC, within years 1..9998 (both engines hold it)."""
    from datetime import UTC

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{option} {text!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        raise CliError(f"{option} {text!r} needs a time zone, e.g. {text}+00:00")
    try:
        when = when.astimezone(UTC)
    except OverflowError:
        raise CliError(f"{option} {text!r} is outside the calendar once in UTC") from None
    if not 1 < when.year < 9999:
        raise CliError(f"{option} {text!r} is out of range (years 2..9998)")
    return when


@cli.command("worker")
@click.option(
    "--app",
    "app",
    envvar="SYNCKIT_APP",
    required=True,
    help="module:attribute of your synckit App (or a job Registry), importable from the "
    "working directory (or $SYNCKIT_APP).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=10,
    show_default=True,
    help="Jobs in flight at once.",
)
@click.option("--lease", default="60s", show_default=True, help="Lease of a claimed job.")
@click.option(
    "--poll-interval",
    type=click.FloatRange(0.01, 3600),
    default=1.0,
    show_default=True,
    help="Fallback polling (s).",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, 86400),
    default=30.0,
    show_default=True,
    help="Shutdown grace period (s).",
)
@click.option("--burst", is_flag=True, help="Run the due jobs, then exit.")
@click.option(
    "--charge-at",
    type=click.Choice(["start", "claim"]),
    default="start",
    show_default=True,
    help="When a job's attempt is charged: when it starts (a crash costs jobs claimed "
    "ahead nothing), or when claimed (faster for very short jobs).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar="SYNCKIT_METRICS_PORT",
    help="Serve Prometheus metrics on this port at /metrics (or $SYNCKIT_METRICS_PORT).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="SYNCKIT_METRICS_HOST",
    help="Address /metrics listens on; 0.0.0.0 exposes it to the network "
    "(or $SYNCKIT_METRICS_HOST).",
)
@database_option
def worker_cmd(
    app: str,
    concurrency: int,
    lease: str,
    poll_interval: float,
    grace: float,
    burst: bool,
    charge_at: str,
    metrics_port: int | None,
    metrics_host: str,
    database_url: str | None,
) -> None:
    """Run jobs until SIGTERM/SIGINT (or, with --burst, until the queue is idle)."""
    from synckit.runtime.audit import audit_observer
    from synckit.runtime.worker import Worker

    registry, database_url = load_registry(app, database_url)
    lease_time = parse_duration(lease)
    if lease_time < timedelta(seconds=1):
        raise CliError(f"--lease {lease!r} is shorter than 1s")

    async def go(d: Database) -> WorkerStats:
        from synckit.runtime.keys import require_openable_secrets

        await require_openable_secrets(d)  # refuse to start rather than fail every cycle
        observers: list[OutcomeObserver] = [audit_observer()]
        server = None
        if metrics_port is not None:
            from synckit.runtime.metrics import metrics_observer, start_metrics_server

            observers.append(metrics_observer())
            server = await start_metrics_server(metrics_port, d, host=metrics_host)
        w = Worker(
            d,
            registry,
            concurrency=concurrency,
            lease=lease_time,
            poll_interval=poll_interval,
            grace_period=grace,
            observers=observers,
            charge_at="claim" if charge_at == "claim" else "start",
        )
        received: list[signal.Signals] = []
        if not burst:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, _acknowledge, w, sig, grace, received)
        try:
            return await (w.run_until_idle() if burst else w.run())
        finally:
            if server is not None:
                await server.close()

    stats = run(go, database_url)
    if burst:
        click.echo(json.dumps(vars(stats), sort_keys=True))


def _acknowledge(
    worker: Worker, sig: signal.Signals, grace: float, received: list[signal.Signals]
) -> None:
    """Say in the log that a signal arrived and what the worker does about it."""
    import structlog

    again = bool(received)
    received.append(sig)
    structlog.get_logger("synckit.worker").warning(
        "worker.signal_received",
        signal=sig.name,
        action="already stopping"
        if again
        else "stop claiming; in-flight jobs get the grace period, then go back to pending",
        grace_seconds=grace,
    )
    worker.stop()


@cli.group()
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
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
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
    from synckit.runtime.status import queue_depth
    from synckit.runtime.unreadable_jobs import count_unreadable_run_at, unreadable_run_at

    updated_since = utcnow() - parse_duration(since) if since else None
    created_after = utcnow() - parse_duration(created_since) if created_since else None

    async def go(d: Database) -> tuple[list[JobInfo], dict[str, dict[str, int]], int]:
        async with d.begin() as conn:
            queue = await queue_depth(conn)
            unreadable = await count_unreadable_run_at(conn)
            ids = [j.id for j in await unreadable_run_at(conn, limit=limit)] if stuck else []
        if stuck:
            return [await store.get_job(d, i) for i in ids], queue, unreadable
        found = await store.list_jobs(
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
@database_option
def jobs_show(job_id: int, database_url: str | None) -> None:
    """Show one job with its payload and error history (JSON)."""
    info = run(lambda d: store.get_job(d, job_id), database_url)
    click.echo(json.dumps(_job_json(info), indent=2, sort_keys=True))


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
    _job_action(lambda d: store.cancel_job(d, job_id, reason), database_url)


@jobs.command("retry")
@click.argument("job_id", type=JOB_ID)
@database_option
def jobs_retry(job_id: int, database_url: str | None) -> None:
    """Run a job again now (an ended job starts over with fresh attempts)."""
    _job_action(lambda d: store.retry_job(d, job_id), database_url)


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
    _job_action(lambda d: store.reschedule_job(d, job_id, when), database_url)


@jobs.command("priority")
@click.argument("job_id", type=JOB_ID)
@click.argument("priority", type=PRIORITY)
@database_option
def jobs_priority(job_id: int, priority: int, database_url: str | None) -> None:
    """Change a job's priority (higher runs first)."""
    _job_action(lambda d: store.set_priority(d, job_id, priority), database_url)


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
    _job_action(lambda d: store.replace_payload(d, job_id, data), database_url)


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
        lambda d: store.enqueue(
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


def _quiet_thread_error(args: threading.ExceptHookArgs) -> None:
    """No traceback from background threads: one line, or nothing for aiosqlite's worker
    thread finishing after ``asyncio.run`` closed the loop (after a failed connect)."""
    exc = args.exc_value
    if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
        return
    click.echo(f"error: in background thread: {type(exc).__name__}: {exc}", err=True)


def main() -> None:
    """Entry point of the ``synckit`` console script."""
    threading.excepthook = _quiet_thread_error
    try:
        cli.main(prog_name="synckit", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
