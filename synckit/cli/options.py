"""What every ``synckit`` command shares: the one-line error, the database option and
:func:`run` (the one entry into the async core), id types, durations and times, reading
JSON files, and untrusted text for rich output. The ``--app`` option and its loader are
:mod:`synckit.cli.app_loader`.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from synckit.errors.exceptions import SynckitError
from synckit.printable import printable
from synckit.redaction import redact_text
from synckit.store.urls import ENV_URL

# Every command imports this module, ``synckit --help`` too: what only some commands use
# (rich, asyncio, SQLAlchemy behind synckit.store.db) is imported where it is used;
# tests/unit/test_command_imports.py holds each command to what it may import.
if TYPE_CHECKING:
    import asyncio
    from datetime import timedelta

    from rich.console import Console

    from synckit.store.db import Database

__all__ = [
    "JOB_ID",
    "PRIORITY",
    "ROWS_SHOWN",
    "ROW_ID",
    "CliError",
    "LazyGroup",
    "Seconds",
    "cell",
    "console",
    "count_option",
    "database_option",
    "err_console",
    "hold_gc",
    "json_text",
    "loop_factory",
    "markup_escaped",
    "page_options",
    "parse_duration",
    "parse_moment",
    "plain",
    "print_unreadable",
    "read_json_file",
    "release_gc",
    "run",
    "seconds_option",
    "without_rich",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


#: Where the group's ``--log-level`` and ``--log-format`` land in ``click.Context.meta``.
LOG_SETTINGS = "synckit.log_settings"


@dataclass(frozen=True)
class LogSettings:
    """The group's logging options, for a command that logs somewhere other than stderr."""

    json_lines: bool | None  # None: JSON unless the stream is a terminal
    level: int


def log_settings() -> LogSettings:
    """The running command's logging options (INFO, format by stream outside a command)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.meta.get(LOG_SETTINGS) if ctx is not None else None
    return found if isinstance(found, LogSettings) else LogSettings(None, logging.INFO)


#: Whether :func:`hold_gc` has turned the collector off for this process's start-up.
_gc_held = False


def hold_gc() -> None:
    """No garbage collection while a command starts (the console script's first step).

    Importing a command's modules makes hundreds of thousands of objects, nearly none of
    them garbage, and the collector's passes over them were about a sixth of a short
    command's CPU (``synckit status``). :func:`release_gc` turns it back on.
    """
    global _gc_held
    if gc.isenabled():
        gc.disable()
        _gc_held = True


def release_gc() -> None:
    """After the command's modules are imported: what they made is set aside for good
    (``gc.freeze``: a long-running worker's collections no longer walk it) and the
    collector runs again. A no-op unless :func:`hold_gc` held it."""
    global _gc_held
    if _gc_held:
        _gc_held = False
        gc.freeze()
        gc.enable()


class LazyGroup(click.Group):
    """A command group whose listed subcommands are imported only when used.

    The group defers which command modules load, so that ``synckit jobs ls`` does not
    pay for the worker, Alembic, authlib or the demo (every invocation pays for what it
    imports), and its help lists the commands from their summaries (``lazy``: name to
    ``("module:attribute", summary)``) without importing any.
    """

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own asks each command for its short help, which imports them all. A
        # stand-in command holding the summary as its help gives the same line at any
        # width (click cuts a help at its first sentence, or at the width).
        listed: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            if name in self.lazy:
                listed.append((name, click.Command(name, help=self.lazy[name][1])))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                listed.append((name, command))
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in listed])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        spec = self.lazy[cmd_name][0]
        module_name, _, attr = spec.partition(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command), spec
        release_gc()
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SynckitError as exc:
            # Raised by a command's own setup, outside run() (a key in the environment
            # that is not a key, say): one line all the same, never a traceback.
            raise CliError(str(exc)) from exc


if TYPE_CHECKING:
    #: Where commands print their tables (stdout) and what is not their output (stderr).
    console: Console
    err_console: Console


def __getattr__(name: str) -> Any:
    # ``console`` and ``err_console`` are made on first use (PEP 562): rich costs a
    # tenth of ``synckit --help``'s start-up, which prints no table.
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    made = Console(stderr=name == "err_console")
    globals()[name] = made
    return made


# What the database's columns hold: a 64-bit id, a 32-bit priority. A value past them is
# one line from click, not a driver's overflow traceback.
ROW_ID = click.IntRange(1, 2**63 - 1)
JOB_ID = ROW_ID
PRIORITY = click.IntRange(-(2**31), 2**31 - 1)
#: How many rows a listing prints at most (``--limit``): a count, not a number past the
#: driver's integers.
ROWS_SHOWN = click.IntRange(1, 100_000)


class Seconds(click.FloatRange):
    """A number of seconds within bounds, finite: ``nan`` passes a plain FloatRange (every
    comparison with it is false) and ``inf`` one without a maximum; both are one line here,
    not a traceback from a timedelta or a sleep."""

    def __init__(self, low: float, high: float, *, min_open: bool = False) -> None:
        super().__init__(low, high, min_open=min_open)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return rv


def count_option(flag: str, low: int, high: int, default: int, help: str) -> Callable[[F], F]:
    """``flag``: a whole number within ``low`` and ``high``, its ``default`` shown in the help."""
    return click.option(
        flag, type=click.IntRange(low, high), default=default, show_default=True, help=help
    )


def seconds_option(
    flag: str, low: float, high: float, default: float, help: str, *, min_open: bool = False
) -> Callable[[F], F]:
    """``flag``: a number of seconds within ``low`` and ``high`` (:class:`Seconds`), its
    ``default`` shown in the help."""
    return click.option(
        flag,
        type=Seconds(low, high, min_open=min_open),
        default=default,
        show_default=True,
        help=help,
    )


def _check_database_url(
    _ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    """An empty URL is a mistake (an unset variable in a script), not "the default"; a URL
    that does not parse or names an impossible port is refused before anything opens."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter(
            f"is empty: give a database URL or leave it (and ${ENV_URL}) unset", param=param
        )
    from synckit.store.db import url_problem

    problem = url_problem(value)
    if problem is not None:
        raise click.BadParameter(problem, param=param)
    return value


database_option = click.option(
    "--database-url",
    "database_url",
    envvar=ENV_URL,
    default=None,
    callback=_check_database_url,
    help=f"Database URL (default: ${ENV_URL}, else sqlite:///synckit.db).",
)


def page_options(every_help: str) -> Callable[[F], F]:
    """``--limit`` (tenants per page), ``--after`` (the previous page's last) and ``--all``
    (``every_help`` says how), for the commands that list tenants a page at a time."""

    def decorate(f: F) -> F:
        f = click.option("--all", "every", is_flag=True, help=every_help)(f)
        f = click.option(
            "--after", help="Start the page after this tenant (the previous page's last)."
        )(f)
        return count_option("--limit", 1, 10_000, 50, "Tenants per page.")(f)

    return decorate


#: Files of config or payload read by commands: bigger is a mistake, not a config.
JSON_FILE_LIMIT = 10 * 1024 * 1024


def read_json_file(path: str, what: str = "file") -> Any:
    """The JSON document in ``path``, or one :class:`CliError` line saying what is wrong
    (missing, too big, not UTF-8, not JSON, nested too deeply)."""
    try:
        p = Path(path)
        if p.stat().st_size > JSON_FILE_LIMIT:
            raise CliError(f"{what} {path!r} is larger than {JSON_FILE_LIMIT // 2**20} MiB")
        raw = p.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CliError(f"{what} {path!r} is not UTF-8 (byte {exc.start})") from None
    return json_text(text, f"{what} {path!r}")


def json_text(text: str, what: str) -> Any:
    """``text`` as JSON, or one :class:`CliError` line naming ``what`` (not JSON, nested
    too deeply)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise CliError(f"{what} is nested too deeply") from None
    except ValueError as exc:
        raise CliError(f"{what} is not JSON: {exc}") from None


def cell(value: object, width: int | None = None) -> Any:
    """Untrusted text (error messages, API bodies, stored values) for a rich table or
    line: redacted, on one line, cut to ``width``, never read as markup, so
    ``Invalid path [/v1/users]`` prints as it is instead of crashing the command, and its
    control characters shown escaped (:func:`synckit.printable.printable`), so a stored
    ``ESC ]0;`` never reaches the terminal. Without ``width`` its lines are kept."""
    from rich.text import Text

    if value is None or value == "":
        return Text("-")
    text = redact_text(str(value))
    if width is not None:
        text = " ".join(text.split())
        text = text if len(text) <= width else text[: width - 1] + "…"
    return Text(printable(text, keep_newlines=True))


def print_unreadable(out: Console, rows: Iterable[Any], what: str) -> None:
    """After a table of ``rows``: a red line on ``out`` for each that holds values it could
    not read (its ``unreadable``, column to reason), naming the row as ``what`` and its id."""
    for r in rows:
        if r.unreadable:
            said = ", ".join(f"{name} ({why})" for name, why in sorted(r.unreadable.items()))
            out.print(cell(f"unreadable in {what} {r.id}: {said}"), style="red")


def markup_escaped(value: object) -> str:
    """Untrusted text inside a rich markup string: markup escaped, control characters
    shown escaped (newlines too)."""
    from rich.markup import escape

    return escape(printable(str(value)))


def plain(value: object) -> str:
    """Untrusted text for a plain line (``click.echo``): redacted, control characters
    (newlines too) shown escaped."""
    return printable(redact_text(str(value)))


class CliError(click.ClickException):
    """A one-line error, printed as ``error: ...`` with exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        # A message may quote stored text or an API's answer: never a raw escape.
        click.echo(f"error: {printable(self.format_message())}", err=True)


LoopFactory = Callable[[], "asyncio.AbstractEventLoop"]

#: ``--loop``'s choices: ``auto`` is uvloop where it is installed, else asyncio's own.
LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(name: str) -> LoopFactory | None:
    """The event loop ``--loop NAME`` asks for, as :class:`asyncio.Runner` takes it
    (``None``: asyncio's own).

    uvloop (libuv under asyncio's API, the loop uvicorn runs on) is installed with synckit
    where it builds (not on Windows). A worker's trivial poll spends a fifth of its CPU
    in the event loop and its socket transports; on uvloop the same polls took a median
    9% (PostgreSQL) and 14% (SQLite) less worker CPU (``bench.tenants``, six interleaved
    pairs each), and ``bench.sync``'s ``undeclared`` ran 6-8% faster on PostgreSQL.
    """
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise CliError("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


def run(
    make: Callable[[Database], Awaitable[T]],
    url: str | None,
    *,
    check: bool = True,
    schema: bool = True,
    loop: LoopFactory | None = None,
) -> T:
    """Open the database, run ``make(db)`` in the async core, and dispose of the engine.

    ``schema``: first require the schema at this synckit's revision (every command but
    ``db ...``), so a fresh database says to run ``synckit db upgrade`` and is not created.
    Every :class:`SynckitError` becomes one :class:`CliError` line. ``loop``: the event
    loop's factory (:func:`loop_factory`); asyncio's own by default.
    """

    import asyncio

    from synckit.store.db import open_database

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
        with asyncio.Runner(loop_factory=loop) as runner:
            return runner.run(main())
    except SynckitError as exc:
        raise CliError(str(exc)) from exc


def parse_duration(text: str) -> timedelta:
    """``90s``, ``10m``, ``2h``, ``7d`` or a plain number of seconds, up to 100 years
    (:func:`synckit.clock.parse_duration`), or one CliError line."""
    from synckit import clock

    try:
        return clock.parse_duration(text)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def parse_moment(text: str, option: str = "--at") -> datetime:
    """An ISO 8601 time with a zone, as UTC, within years 1..9998 (both engines hold it)."""
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


@contextmanager
def without_rich() -> Iterator[None]:
    """Imports made meanwhile find neither rich nor pygments (those that take them when
    they are there, as structlog's dev renderer and httpx's command line do, go
    without); afterwards both are importable again. One a process has imported already
    is left as it is."""
    held = [name for name in ("rich", "pygments") if name not in sys.modules]
    for name in held:
        sys.modules[name] = None  # type: ignore[assignment]  # ImportError for name.*
    try:
        yield
    finally:
        for name in held:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
