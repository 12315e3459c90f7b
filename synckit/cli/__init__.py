"""The ``synckit`` command.

The CLI is a thin shell over the async core: each command builds its arguments, then
enters the core through :func:`synckit.cli.options.run` (one ``asyncio.run``). Every
:class:`~synckit.errors.exceptions.SynckitError` becomes one line on stderr and exit
code 2, never a traceback.

Each command group is a module of this package (``jobs``, ``dlq``, ``tenants`` with
``oauth`` and ``bulk``, ``secrets``, ``demo``, ``breakers``, ``outbox``, ``status``, ``sync``,
``worker``, ``db``, ``web``, ``webhooks``); ``options`` holds what they share and ``app_loader`` the
one ``--app`` loader. Nothing outside this package imports click or prints tables.
The group imports a command's module when that command runs (:class:`LazyGroup`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

import click

from synckit.cli.options import LOG_SETTINGS, CliError, LazyGroup, LogSettings, hold_gc

__all__ = ["CliError", "cli", "main"]


@click.group(
    cls=LazyGroup,
    # Each command: where it lives, and the line ``synckit --help`` shows for it (its
    # help's first sentence, held to it by tests/unit/test_command_imports.py), so that
    # listing the commands imports none of them.
    lazy={
        "breakers": (
            "synckit.cli.breakers:breakers",
            "Circuit breakers and pacing per resource (tenant connection or whole API).",
        ),
        "db": ("synckit.cli.db:db", "Create and migrate the synckit schema."),
        "demo": (
            "synckit.cli.demo:demo_command",
            "Sync three Graph mail tenants against a simulated Graph, and show what happened.",
        ),
        "dlq": (
            "synckit.cli.dlq:dlq",
            "Inspect, replay, resolve, ignore, purge and export dead letters.",
        ),
        "jobs": ("synckit.cli.jobs:jobs", "List, inspect and change jobs."),
        "outbox": (
            "synckit.cli.outbox:outbox",
            "Inspect the transactional outbox and retry failed messages.",
        ),
        "records": (
            "synckit.cli.records:records_group",
            "Read the rows a stream's declared records landed in, and their changes.",
        ),
        "secrets": (
            "synckit.cli.secrets:secrets_group",
            "Make a key, check that it opens every stored secret, re-seal under a new key.",
        ),
        "status": (
            "synckit.cli.status:status_cmd",
            "Show tenants (breaker, lag, error budget, DLQ), queue depth and alerts at a glance.",
        ),
        "sync": (
            "synckit.cli.sync:sync_command",
            "Run TENANT's poll cycle now (or every active tenant's: --all, --connector NAME), "
            "through the queue (a worker runs it).",
        ),
        "tenants": (
            "synckit.cli.tenants:tenants",
            "Add, list, inspect, pause, resume and remove tenants.",
        ),
        "web": (
            "synckit.cli.web:web_command",
            "Serve the operator console: overview, tenants (and why they wait), jobs, dead "
            "letters, outbox; live, with actions (pause, resume, sync now, re-authorise, "
            "reset breaker, retry, cancel, replay, resolve, ignore).",
        ),
        "webhooks": (
            "synckit.cli.webhooks:webhooks",
            "Inspect the webhook inbox: what was received, refused, orphaned, processed.",
        ),
        "worker": (
            "synckit.cli.worker:worker_cmd",
            "Run jobs until SIGTERM/SIGINT (or, with --burst, until the queue is idle).",
        ),
        "workers": (
            "synckit.cli.workers:workers",
            "Worker processes: who runs jobs, where, and whether they are still alive.",
        ),
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
    from synckit.runtime.observe.logging import configure_logging  # structlog: not for --help

    json_lines = {"auto": None, "json": True, "console": False}[log_format.lower()]
    level = logging.getLevelName(log_level.upper())
    configure_logging(json_lines=json_lines, level=level, stream=sys.stderr)
    # A command that logs elsewhere (the demo, to its log file) logs the same way.
    click.get_current_context().meta[LOG_SETTINGS] = LogSettings(json_lines, level)


def _quiet_thread_error(args: threading.ExceptHookArgs) -> None:
    """No traceback from background threads: one line, or nothing for aiosqlite's worker
    thread finishing after ``asyncio.run`` closed the loop (after a failed connect)."""
    exc = args.exc_value
    if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
        return
    click.echo(f"error: in background thread: {type(exc).__name__}: {exc}", err=True)


def main() -> None:
    """Entry point of the ``synckit`` console script."""
    hold_gc()
    threading.excepthook = _quiet_thread_error
    try:
        cli.main(prog_name="synckit", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)
    except SystemExit as exc:
        _leave(exc)


def _leave(exc: SystemExit) -> None:
    """End the process as the interpreter would, without its teardown.

    Everything a command leaves behind is done by then: its threads are waited for,
    ``atexit`` runs (logging's flush, a tracer's export), stdout and stderr are flushed.
    What is skipped is tearing down every module and a last collection of the objects
    the imports made, about a fifth of a short command's CPU (``synckit status``) and
    nothing any command writes. An exit status that is not a number is printed, as the
    interpreter prints it; a flush that fails (a closed pipe) exits 120, as it does.
    """
    code = exc.code
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own wait
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120
    os._exit(status)
