"""The one ``--app`` loader of the ``synckit`` command.

Every command that needs the application takes the same ``--app module:attribute``
option (or ``$SYNCKIT_APP``) and loads it here: the working directory is importable (the
README's "Running it" runs ``synckit worker --app myapp:app`` next to ``myapp.py``), what
the attribute names is never called, and every failure is one :class:`CliError` line in
one wording, ``--app 'spec': ...``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from synckit.cli.options import CliError

# The option is declared by commands whose other subcommands need no application
# (``secrets keygen``): the App and what it brings (httpx, the runtime) load with it.
if TYPE_CHECKING:
    from synckit.app import App
    from synckit.runtime.jobs.handlers import Registry

__all__ = [
    "APP_ENV",
    "app_option",
    "app_option_saying",
    "import_app_attribute",
    "load_app",
    "load_registry",
    "load_replay_target",
]

APP_ENV = "SYNCKIT_APP"

F = TypeVar("F", bound=Callable[..., Any])

_APP_HELP = (
    f"module:attribute of your synckit App, importable from the working directory (or ${APP_ENV})."
)


def app_option_saying(more: str = "") -> Callable[[F], F]:
    """The ``--app`` option (parameter ``app_spec``), its help followed by ``more``."""
    return click.option(
        "--app",
        "app_spec",
        envvar=APP_ENV,
        default=None,
        help=f"{_APP_HELP} {more}".strip(),
    )


app_option = app_option_saying()


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


def _refuse(spec: str | None, value: object) -> CliError:
    """The one error of an ``--app`` that names something else than an application."""
    return CliError(f"--app {spec!r}: {_what(value)} is not a synckit App")


def load_app(spec: str | None) -> App:
    """The :class:`~synckit.App` named by ``--app``, or one CliError line."""
    from synckit.app import App

    value = import_app_attribute(spec)
    if not isinstance(value, App):
        raise _refuse(spec, value)
    return value


def load_registry(spec: str | None, database_url: str | None) -> tuple[Registry, str | None]:
    """The job :class:`~synckit.Registry` of ``--app`` (an App's, or a Registry itself) and
    the database URL to open: ``database_url``, else an App's own ``database_url``."""
    from synckit.app import App
    from synckit.runtime.jobs.handlers import Registry

    value = import_app_attribute(spec)
    if isinstance(value, App):
        # The App's handlers must use the database this worker claims from.
        return value.registry, value.use_database_url(database_url)
    if not isinstance(value, Registry):
        raise _refuse(spec, value)
    return value, database_url


def load_replay_target(spec: str | None) -> object:
    """What ``dlq replay --app`` replays with: an App, a job Registry, Replayers, or an
    object offering ``replay_record``/``replayers``/``registry``; never called."""
    from synckit.app import App
    from synckit.dlq.replay import Replayers
    from synckit.runtime.jobs.handlers import Registry

    value = import_app_attribute(spec)
    offers = any(hasattr(value, a) for a in ("replay_record", "replayers", "registry"))
    if (
        inspect.isroutine(value)
        or inspect.isclass(value)
        or inspect.ismodule(value)
        or not (isinstance(value, App | Replayers | Registry) or offers)
    ):
        raise _refuse(spec, value)
    return value


def _what(value: object) -> str:
    if inspect.isclass(value):
        return f"class {value.__name__!r}"
    if inspect.ismodule(value):
        return f"module {value.__name__!r}"
    if callable(value):
        return f"{type(value).__name__} {getattr(value, '__name__', '?')!r} (not called)"
    return f"a {type(value).__name__}"
