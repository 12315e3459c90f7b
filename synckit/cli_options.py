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

from synckit.runtime.db import ENV_URL

if TYPE_CHECKING:
    from synckit.app import App
    from synckit.runtime.handlers import Registry

__all__ = [
    "APP_ENV",
    "CliError",
    "app_option",
    "database_option",
    "import_app_attribute",
    "load_app",
    "load_registry",
]

APP_ENV = "SYNCKIT_APP"

database_option = click.option(
    "--database-url",
    "database_url",
    envvar=ENV_URL,
    default=None,
    help=f"Database URL (default: ${ENV_URL}, else sqlite:///synckit.db).",
)

app_option = click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    default=None,
    help=f"module:attribute of your synckit App, importable from the working directory "
    f"(or ${APP_ENV}).",
)


class CliError(click.ClickException):
    """A one-line error, printed as ``error: ...`` with exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def import_app_attribute(spec: str | None) -> Any:
    """The object ``module:attribute`` names, the working directory importable.

    Every failure is one :class:`CliError` line starting ``--app 'spec':``; an exception
    raised inside the user's module is named with its type, not shown as a traceback.
    A function found there is called (an app factory).
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
    value = getattr(module, attr)
    if inspect.isfunction(value):
        try:
            value = value()
        except Exception as exc:
            line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            raise CliError(f"--app {spec!r}: calling {attr}() failed: {line}") from None
    return value


def load_app(spec: str | None) -> App:
    """The :class:`~synckit.App` named by ``--app``, or one CliError line."""
    from synckit.app import App

    value = import_app_attribute(spec)
    if not isinstance(value, App):
        raise CliError(f"--app {spec!r}: {_what(value)} is not a synckit App")
    return value


def load_registry(spec: str | None) -> Registry:
    """The job :class:`~synckit.Registry` of ``--app``: an App's, or a Registry itself."""
    from synckit.app import App
    from synckit.runtime.handlers import Registry

    value = import_app_attribute(spec)
    if isinstance(value, App):
        # The App's handlers must use the database this worker claims from.
        ctx = click.get_current_context(silent=True)
        value.use_database_url(ctx.params.get("database_url") if ctx else None)
        return value.registry
    if not isinstance(value, Registry):
        raise CliError(f"--app {spec!r}: {_what(value)} is not a synckit App or Registry")
    return value


def _what(value: object) -> str:
    if inspect.isclass(value):
        return f"class {value.__name__!r}"
    return f"a {type(value).__name__}"
