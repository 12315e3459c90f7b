"""`synckit ARGS` run in the test's own process (click's CliRunner), for tests of what a
command prints and stores. Starting a Python process per command cost more than the
command itself; tests of what only a process shows (signals, kill -9, the exit of a
worker, output encoding, a console script's start-up) start one (tests/procs.py).

The result has a finished process's shape (``returncode``, ``stdout``, ``stderr``), so a
test reads the same either way. An exception the command did not turn into an exit is
written to ``stderr`` as the traceback a process would print, exit code 1: a test that
a command fails with one line, never a traceback, holds in process too.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import traceback
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import structlog
from click.testing import CliRunner
from rich.console import Console

from synckit.cli import cli, options

_NOISY = ("httpx", "httpcore", "alembic")


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``synckit *args`` in process, with ``env`` added to the environment meanwhile."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _invoke(args, env, input)
    # Commands enter their own event loop (asyncio.run): not on this thread's running one.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_invoke, args, env, input).result()


def _invoke(
    args: tuple[str, ...], env: Mapping[str, str] | None, input: str | None
) -> subprocess.CompletedProcess[str]:
    # The command configures logging to the stream it is given (the runner's stderr):
    # put back this process's own once it is done.
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {name: logging.getLogger(name).level for name in _NOISY}
    full_env = {"COLUMNS": "200", **(env or {})}
    # The CLI's consoles read $COLUMNS when made, at import: give them the width a
    # process started with this environment would have.
    consoles = [c for c in vars(options).values() if isinstance(c, Console)]
    widths = [c._width for c in consoles]
    for c in consoles:
        c.width = int(full_env["COLUMNS"])
    try:
        result = CliRunner().invoke(cli, list(args), env=full_env, input=input)
    finally:
        for c, width in zip(consoles, widths, strict=True):
            c._width = width
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, lvl in noisy.items():
            logging.getLogger(name).setLevel(lvl)
    stderr = result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
        code = 1
    return subprocess.CompletedProcess(["synckit", *args], code, result.stdout, stderr)
