"""What each ``synckit`` command imports: only what it uses.

Each command runs in a fresh interpreter (a subprocess: ``sys.modules`` is per process),
through the click group as the console script runs it, and then the modules it loaded
are read. A new top-level import that brings SQLAlchemy into ``--help``, or httpx into
``status``, fails here with the chain to look at (``python -X importtime`` names it).
The lists are explicit: a module is forbidden to a command because the command has no
use for it, and each costs start-up CPU that every invocation (and every test that runs
the CLI) pays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from engines import sqlite_only  # tests/
from waits import PROCESS_TIMEOUT  # tests/

from synckit.cli import cli
from synckit.cli.options import LazyGroup

APPS = Path(__file__).parent.parent / "apps"

#: Runs ``synckit ARGS`` as the console script does (``synckit.cli:main``), then prints
#: the imported modules as the last line of stdout (the command's own output comes before
#: it), from ``atexit``: ``main`` ends the process with ``os._exit`` after atexit runs.
RUNNER = """\
import atexit, json, sys
class Begun:
    # Every module whose import found its code, kept even where the import then failed
    # (rich.traceback, begun by structlog after rich was imported, fails on pygments,
    # which without_rich holds back: its CPU is spent, yet sys.modules keeps no trace).
    names = set()
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    self.names.add(name)
                    return spec
        return None
sys.meta_path.insert(0, Begun())
def report():
    print()
    print(json.dumps({"modules": sorted(sys.modules), "begun": sorted(Begun.names)}))
atexit.register(report)
sys.argv = ["synckit", *sys.argv[1:]]
from synckit.cli import main
main()
"""

#: Database drivers and the ORM: nothing that only lists commands or prints a key opens
#: a database.
DATABASE = ("sqlalchemy", "aiosqlite", "asyncpg", "sqlite3", "alembic", "synckit.store.db")
#: The HTTP client and what rides on it (OAuth, the webhook sink's client).
HTTP = ("httpx", "httpcore", "h11", "anyio", "authlib")
#: The Graph mail demo, its simulator and the examples: only `synckit demo` loads them.
DEMO = ("synckit.examples",)
#: PostgreSQL's dialect and drivers: a command on a SQLite database loads none of them
#: (the tables name PostgreSQL's types and index predicates without importing it).
POSTGRESQL = ("sqlalchemy.dialects.postgresql", "asyncpg", "psycopg", "psycopg2")
#: The operator console and its server: only `synckit web`.
WEB = ("synckit.web", "starlette", "jinja2", "uvicorn")
#: SQLAlchemy's ORM: the store runs on Core (synckit/store/lazy_asyncio.py keeps the
#: asyncio extension from loading it).
ORM = ("sqlalchemy.orm",)

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "--help": (
        *DATABASE,
        *HTTP,
        *DEMO,
        *WEB,
        "cryptography",
        "pydantic",
        "rich",
        "structlog",
        "asyncio",
        "croniter",
        "synckit.app",
        "synckit.runtime",
    ),
    "secrets keygen": (
        *DATABASE,
        *HTTP,
        *DEMO,
        *WEB,
        "cryptography",
        "pydantic",
        "synckit.app",
        "synckit.runtime.credentials.secrets",
        "synckit.runtime.credentials.keys",
    ),
    # status evaluates the alert rules on the spot (its documented behaviour), so it
    # loads synckit.runtime.observe.alerts (and its rules), but none of the sinks' HTTP client.
    "status": (
        *POSTGRESQL,
        *ORM,
        *HTTP,
        *DEMO,
        *WEB,
        "asyncpg",
        "alembic",
        "cryptography",
        "pydantic",
        "croniter",
        "synckit.app",
        "synckit.runtime.admin.tenants",
        "synckit.runtime.jobs.worker",
        "synckit.runtime.sync.poll",
        "synckit.connectors.base",
        # structlog's dev renderer takes them when rich is there: the reads are imported
        # before the console is made (it was imported first, through cli.options).
        "rich.traceback",
        "pygments",
    ),
    "tenants ls": (
        *POSTGRESQL,
        *ORM,
        *HTTP,
        *DEMO,
        *WEB,
        "asyncpg",
        "alembic",
        "synckit.app",
        "synckit.runtime.observe.alerts",
        "synckit.runtime.observe.alert_rules",
        "synckit.runtime.observe.alert_delivery",
        "synckit.runtime.jobs.worker",
        "synckit.runtime.sync.poll",
        "synckit.connectors.base",
    ),
    "jobs ls": (
        *POSTGRESQL,
        *ORM,
        *HTTP,
        *DEMO,
        *WEB,
        "asyncpg",
        "alembic",
        "cryptography",
        "pydantic",
        "croniter",
        "synckit.app",
        "synckit.runtime.observe.alerts",
        "synckit.runtime.observe.alert_rules",
        "synckit.runtime.observe.alert_delivery",
        "synckit.runtime.admin.tenants",
        "synckit.runtime.jobs.worker",
    ),
    # A worker runs the application's jobs: the HTTP client and the runtime are its
    # work; the demo, the console, Alembic and (on SQLite) PostgreSQL's dialect are not,
    # nor rich and pygments, which structlog and httpx would take in for nothing
    # (synckit.cli.options.without_rich).
    "worker --app queue_app:registry --burst": (
        *DEMO,
        *WEB,
        *POSTGRESQL,
        "alembic",
        "rich",
        "pygments",
    ),
}


def _imports(args: str, url: str, tmp_path: Path) -> tuple[str, set[str]]:
    env = {
        **os.environ,
        "SYNCKIT_DATABASE_URL": url,
        "SYNCKIT_LOG_FORMAT": "json",
        "QUEUE_APP_LOG": str(tmp_path / "queue.log"),
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("SYNCKIT_SECRET_KEY", None)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *args.split()],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=PROCESS_TIMEOUT,
    )
    *output, last = done.stdout.rstrip("\n").split("\n")
    result = json.loads(last)
    assert done.returncode == 0, done.stderr
    return "\n".join(output), set(result["modules"]) | set(result["begun"])


def _loaded(forbidden: tuple[str, ...], modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


@sqlite_only  # imports are per command, not per engine (asyncpg is PostgreSQL's own)
@pytest.mark.parametrize("args", sorted(FORBIDDEN))
def test_a_command_imports_none_of_what_it_does_not_use(
    args: str, migrated_url: str, tmp_path: Path
) -> None:
    """Each command runs to its end (exit 0, its output printed) without importing any
    module of its forbidden list."""
    output, modules = _imports(args, migrated_url, tmp_path)
    expected = {
        "--help": "Commands:",
        "secrets keygen": "=",  # a Fernet key: 44 characters of URL-safe base64
        "status": "Tenants",
        "tenants ls": "no tenants yet",
        "jobs ls": "Jobs (0)",
        "worker --app queue_app:registry --burst": '"succeeded": 0',
    }[args]
    assert expected in output, output
    assert _loaded(FORBIDDEN[args], modules) == [], f"synckit {args} imports them"


def test_the_probe_sees_a_forbidden_import() -> None:
    """The check reads prefixes: a submodule of a forbidden package counts, a package
    whose name merely starts the same does not."""
    assert _loaded(("httpx",), {"httpx._client", "httpx"}) == ["httpx", "httpx._client"]
    assert _loaded(("synckit.web",), {"synckit.webhooks", "synckit.web.app"}) == ["synckit.web.app"]


def test_the_key_keygen_prints_opens_what_it_seals() -> None:
    """`secrets keygen` makes its key without cryptography; Fernet takes it as its own."""
    from cryptography.fernet import Fernet

    key = CliRunner().invoke(cli, ["secrets", "keygen"]).output.strip()
    assert len(key) == 44
    assert Fernet(key).decrypt(Fernet(key).encrypt(b"token")) == b"token"
    assert CliRunner().invoke(cli, ["secrets", "keygen"]).output.strip() != key


def _groups() -> list[tuple[str, LazyGroup]]:
    from synckit.cli.tenants import tenants

    assert isinstance(cli, LazyGroup) and isinstance(tenants, LazyGroup)
    return [("synckit", cli), ("synckit tenants", tenants)]


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200, 400])
def test_help_lists_each_lazy_command_with_its_own_first_sentence(width: int) -> None:
    """--help lists the commands from the summaries the group holds, without importing
    them, and prints at any width what click prints from the commands themselves (each
    one's short help: its help's first sentence, cut to the width)."""
    import click

    for where, group in _groups():
        ctx = click.Context(group, info_name=where)
        ours = click.HelpFormatter(width=width)
        group.format_commands(ctx, ours)
        clicks = click.HelpFormatter(width=width)
        click.Group.format_commands(group, ctx, clicks)  # imports every command
        assert "Commands:" in ours.getvalue()
        assert ours.getvalue() == clicks.getvalue(), (where, width)
