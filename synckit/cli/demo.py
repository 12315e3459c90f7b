"""``synckit demo``: run the Graph mail example's demo
(:func:`synckit.examples.graph_mail.demo.run_demo`) in the working directory and print its
summary (:func:`~synckit.examples.graph_mail.report.render_summary`), or the summary as JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
from rich.console import Console

from synckit.cli.options import log_settings, seconds_option
from synckit.errors.exceptions import SynckitError
from synckit.examples.graph_mail.demo import DemoResult, run_demo
from synckit.examples.graph_mail.plan import LOG_FILE
from synckit.examples.graph_mail.report import render_summary
from synckit.runtime.observe.logging import configure_logging

__all__ = ["demo_command"]


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[IO[str]]:
    """Log to ``path`` as every command logs (redacted; ``--log-level`` and ``--log-format``
    apply), so that the summary on the terminal stays readable."""
    settings = log_settings()
    try:
        with path.open("w", encoding="utf-8") as stream:
            configure_logging(json_lines=settings.json_lines, level=settings.level, stream=stream)
            yield stream
    finally:
        # Nothing may log to the closed file afterwards.
        configure_logging(json_lines=settings.json_lines, level=settings.level)
        # A run that failed before logging anything leaves no empty file behind.
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@seconds_option(
    "--timeout",
    1,
    3600,
    50.0,
    "Give up (exit 1) if the sync has not converged after this many seconds.",
)
def demo_command(as_json: bool, timeout: float) -> None:
    """Sync three Graph mail tenants against a simulated Graph, and show what happened.

    Creates synckit-demo.db in the working directory, and logs to synckit-demo.log there
    (not stderr, so the summary stays readable; --log-level and --log-format apply).
    """
    workdir = Path.cwd()
    out = Console(stderr=as_json)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(stderr=as_json, width=120)  # a log or a pipe: no need to squeeze
    hard_limit = timeout + 30.0

    async def main() -> DemoResult:
        async with asyncio.timeout(hard_limit):
            return await run_demo(workdir, out=out, converge_within=timeout)

    with _log_to(workdir / LOG_FILE):
        try:
            result = asyncio.run(main())
        except TimeoutError:
            raise click.ClickException(
                f"the demo did not finish within {hard_limit:g}s; see {LOG_FILE}"
            ) from None
        except SynckitError as exc:  # a bad SYNCKIT_SECRET_KEY, an unwritable directory
            raise click.ClickException(str(exc)) from exc
    render_summary(result.summary, out)
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, default=str))
    if not result.converged:
        raise SystemExit(1)
