"""Options shared by the ``synckit`` command and its subcommand modules, and the one
``--app`` loader.

A module of its own so that the subcommand modules (loaded lazily by ``synckit.cli``)
can import it at import time: importing ``synckit.cli`` itself from them would, under
``python -m synckit.cli``, run the CLI module a second time.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from synckit.store.db import ENV_URL

if TYPE_CHECKING:
    from synckit.app import App
    from synckit.runtime.handlers import Registry

__all__ = [
    "APP_ENV",
    "JOB_ID",
    "PRIORITY",
    "ROW_ID",
    "CliError",
    "app_option",
    "cell",
    "database_option",
    "import_app_attribute",
    "load_app",
    "load_registry",
    "read_json_file",
]

APP_ENV = "SYNCKIT_APP"

# What the database's columns hold: a 64-bit id, a 32-bit priority. A value past them is
# one line from click, not a driver's overflow traceback.
ROW_ID = click.IntRange(1, 2**63 - 1)
JOB_ID = ROW_ID
PRIORITY = click.IntRange(-(2**31), 2**31 - 1)


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
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        port = make_url(value).port
    except (ArgumentError, ValueError) as exc:
        raise click.BadParameter(
            f"cannot read the URL: {str(exc).splitlines()[0][:200]}", param=param
        ) from None
    if port is not None and not 0 < port < 65536:
        raise click.BadParameter(f"port {port} is not between 1 and 65535", param=param)
    return value


database_option = click.option(
    "--database-url",
    "database_url",
    envvar=ENV_URL,
    default=None,
    callback=_check_database_url,
    help=f"Database URL (default: ${ENV_URL}, else sqlite:///synckit.db).",
)

#: Files of config or payload read by commands: bigger is a mistake, not a config.
JSON_FILE_LIMIT = 10 * 1024 * 1024


def read_json_file(path: str, what: str = "file") -> Any:
    """The JSON document in ``path``, or one :class:`CliError` line saying what is wrong
    (missing, too big, not UTF-8, not JSON, nested too deeply)."""
    import json
    from pathlib import Path

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
    try:
        return json.loads(text)
    except RecursionError:
        raise CliError(f"{what} {path!r} is nested too deeply") from None
    except ValueError as exc:
        raise CliError(f"{what} {path!r} is not JSON: {exc}") from None


app_option = click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    default=None,
    help=f"module:attribute of your synckit App, importable from the working directory "
    f"(or ${APP_ENV}).",
)


def cell(value: object, width: int | None = None) -> Any:
    """Untrusted text (error messages, API bodies, stored values) for a rich table or
    line: redacted, on one line, cut to ``width``, and never read as markup, so
    ``Invalid path [/v1/users]`` prints as it is instead of crashing the command."""
    from rich.text import Text

    from synckit.runtime.logging import redact_text

    if value is None or value == "":
        return Text("-")
    text = redact_text(str(value))
    if width is not None:
        text = " ".join(text.split())
        text = text if len(text) <= width else text[: width - 1] + "…"
    return Text(text)


class CliError(click.ClickException):
    """A one-line error, printed as ``error: ...`` with exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def import_app_attribute(spec: str | None) -> Any:
    """The object ``module:attribute`` names, the working directory importable.

    Every failure is one :class:`CliError` line starting ``--app 'spec':``; an exception
    raised inside the user's module is named with its type, not shown as a traceback.
    What the attribute names is returned as it is, never called: ``--app json:dumps``
    must not run whatever it names (the callers then refuse what is not an App).
    """
    if not spec:
        raise CliError(f"--app is required: module:attribute of your synckit App (or ${APP_ENV})")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliError(f"--app {spec!r}: expected module:attribute, e.g. myproject.sync:app")
    # A console script's sys.path does not hold the working directory (python -m does):
    # `--app helpdesk_sync:app` next to helpdesk_sync.py must work without PYTHONPATH.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CliError(
                f"--app {spec!r}: no module named {exc.name!r} in {cwd} or on the Python path"
            ) from None
        raise CliError(f"--app {spec!r}: importing {module_name!r} failed: {exc}") from None
    except Exception as exc:
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        raise CliError(f"--app {spec!r}: importing {module_name!r} failed: {line}") from None
    if not hasattr(module, attr):
        raise CliError(f"--app {spec!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def load_app(spec: str | None) -> App:
    """The :class:`~synckit.App` named by ``--app``, or one CliError line."""
    from synckit.app import App

    value = import_app_attribute(spec)
    if not isinstance(value, App):
        raise CliError(f"--app {spec!r}: {_what(value)} is not a synckit App")
    return value


def load_registry(spec: str | None, database_url: str | None) -> tuple[Registry, str | None]:
    """The job :class:`~synckit.Registry` of ``--app`` (an App's, or a Registry itself) and
    the database URL to open: ``database_url``, else an App's own ``database_url``."""
    from synckit.app import App
    from synckit.runtime.handlers import Registry

    value = import_app_attribute(spec)
    if isinstance(value, App):
        # The App's handlers must use the database this worker claims from.
        return value.registry, value.use_database_url(database_url)
    if not isinstance(value, Registry):
        raise CliError(f"--app {spec!r}: {_what(value)} is not a synckit App or Registry")
    return value, database_url


def _what(value: object) -> str:
    if inspect.isclass(value):
        return f"class {value.__name__!r}"
    if callable(value):
        return f"{type(value).__name__} {getattr(value, '__name__', '?')!r} (not called)"
    return f"a {type(value).__name__}"
