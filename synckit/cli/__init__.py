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

import logging
import sys
import threading

import click

from synckit.cli.options import LOG_SETTINGS, CliError, LazyGroup, LogSettings
from synckit.runtime.logging import configure_logging

__all__ = ["CliError", "cli", "main"]


@click.group(
    cls=LazyGroup,
    lazy={
        "breakers": "synckit.cli.breakers:breakers",
        "db": "synckit.cli.db:db",
        "demo": "synckit.cli.demo:demo_command",
        "dlq": "synckit.cli.dlq:dlq",
        "jobs": "synckit.cli.jobs:jobs",
        "outbox": "synckit.cli.outbox:outbox",
        "records": "synckit.cli.records:records_group",
        "secrets": "synckit.cli.secrets:secrets_group",
        "status": "synckit.cli.status:status_cmd",
        "sync": "synckit.cli.sync:sync_command",
        "tenants": "synckit.cli.tenants:tenants",
        "web": "synckit.cli.web:web_command",
        "webhooks": "synckit.cli.webhooks:webhooks",
        "worker": "synckit.cli.worker:worker_cmd",
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
    threading.excepthook = _quiet_thread_error
    try:
        cli.main(prog_name="synckit", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)
