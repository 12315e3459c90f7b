"""The import rules of the package layout (issue 18), read from the source with ``ast``.

``synckit.store`` owns the tables: no module outside it may import
``synckit.store.tables`` or SQLAlchemy. The move is done module by module; the modules
still to move are listed here, and the list may only shrink: a listed module that no
longer breaks the rule fails the test too, so the list stays the true remainder.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import synckit

ROOT = Path(synckit.__file__).parent

# Modules outside synckit.store that still build SQL themselves (issue 18 item 1).
STILL_BUILDING_SQL: set[str] = set()

# Example code that keeps its records in tables of its own, as a user's connector would:
# it may build SQL on those (with SQLAlchemy), never on synckit's tables.
OWN_TABLES: set[str] = set()

# The demo's read-only view of synckit's tables (what its live display and summary show):
# outside the core store so that the store ships no demo code, and imported by the demo
# alone (test_the_demos_reads_are_the_demos_alone_and_only_read).
DEMO_READS = "synckit.examples.graph_mail.reads"


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.cache  # every rule reads the same source: parse it once per process
def _modules() -> dict[str, set[str]]:
    """Every module of the package and the names it imports (``a.b`` and ``a.b.name``)."""
    out: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        imported: set[str] = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module)
                imported.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
        out[name] = imported
    return out


def _builds_sql(imported: set[str]) -> bool:
    return any(
        name == "synckit.store.tables" or name == "sqlalchemy" or name.startswith("sqlalchemy.")
        for name in imported
    )


def test_only_the_store_imports_the_tables_and_sqlalchemy() -> None:
    """Outside ``synckit.store`` only the listed, not yet moved, modules build SQL."""
    modules = _modules()
    offenders = {
        name
        for name, imported in modules.items()
        if not name.startswith("synckit.store")
        and name not in OWN_TABLES | {DEMO_READS}
        and _builds_sql(imported)
    }
    assert offenders - STILL_BUILDING_SQL == set(), "new SQL outside synckit.store"
    moved = STILL_BUILDING_SQL - offenders
    assert moved == set(), f"no longer build SQL, strike them from the list: {sorted(moved)}"


def test_only_the_store_sends_sql_text() -> None:
    """Outside ``synckit.store`` no module sends SQL text of its own (``exec_driver_sql``,
    or a string that reads as a statement) on a connection it was lent."""
    statement = ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "NOTIFY ", "LISTEN ", "PRAGMA ")
    offenders: set[str] = set()
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.startswith("synckit.store") or name in OWN_TABLES:
            continue
        for node in ast.walk(_tree(path)):
            sends = isinstance(node, ast.Attribute) and node.attr == "exec_driver_sql"
            reads_as_sql = isinstance(node, ast.JoinedStr | ast.Constant) and any(
                isinstance(v, ast.Constant)
                and isinstance(v.value, str)
                and v.value.lstrip().startswith(statement)
                for v in (node.values if isinstance(node, ast.JoinedStr) else [node])
            )
            if sends or reads_as_sql:
                offenders.add(f"{name}:{node.lineno}")
    assert offenders == set(), "SQL sent outside synckit.store"


#: What the store may build on: itself and the pure modules below everything
#: (``synckit.tracing`` imports only redaction: a row made in a span keeps its traceparent).
STORE_BUILDS_ON = (
    "synckit.store",
    "synckit.errors",
    "synckit.clock",
    "synckit.redaction",
    "synckit.tracing",
)


def test_the_store_does_not_import_the_layers_above_it() -> None:
    """``synckit.store`` builds on ``errors``, the clock, redaction and tracing, never on
    the runtime, connectors, the DLQ, the console or the commands, even inside a function."""
    for name, imported in _modules().items():
        if name.startswith("synckit.store"):
            bad = {
                i
                for i in imported
                if i.startswith("synckit.")
                and not i.startswith(tuple(f"{m}." for m in STORE_BUILDS_ON) + STORE_BUILDS_ON)
            }
            assert bad == set(), f"{name} imports {sorted(bad)}"


# --- layers between packages (issue 18 item 4) ----------------------------------------------

#: The packages whose graph must have no cycles (``synckit.app`` is a module, a node too).
PACKAGES = ("app", "connectors", "dlq", "errors", "runtime", "store", "testing", "web")

#: Modules of synckit.connectors that still import synckit.runtime or synckit.store, and
#: why. The list may only shrink.
CONNECTORS_STILL_BELOW: dict[str, str] = {}

#: Package edges that still close a cycle, and why. The set may only shrink.
CYCLES_LEFT: set[tuple[str, str]] = set()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _synckit_imports(tree: ast.AST, *, in_functions: bool) -> set[str]:
    """The ``synckit`` modules ``tree`` imports when it runs: at module level (class
    bodies included) and, with ``in_functions``, inside functions too. Imports under
    ``if TYPE_CHECKING:`` never run and are not counted."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                visit(other)
            return
        functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        if isinstance(node, functions) and not in_functions:
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("synckit"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("synckit"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@functools.cache
def _runtime_imports(*, in_functions: bool) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = _tree(path)
        out[name] = _synckit_imports(tree, in_functions=in_functions)
    return out


def _package(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "synckit":
        return None
    return parts[1] if parts[1] in PACKAGES else None


def test_connectors_import_neither_the_runtime_nor_the_store() -> None:
    """``synckit.connectors`` is what authors subclass and import; the runtime implements
    its interfaces and fulfils its declarations, so nothing in it imports
    ``synckit.runtime`` or ``synckit.store`` (at module level or in a function; only
    ``TYPE_CHECKING`` imports, which never run, are exempt)."""
    below = ("synckit.runtime", "synckit.store")
    offenders = {
        name: sorted(i for i in imported if i == below[0] or i == below[1] or i.startswith(
            tuple(f"{b}." for b in below)))
        for name, imported in _runtime_imports(in_functions=True).items()
        if name.startswith("synckit.connectors")
    }  # fmt: skip
    offenders = {name: found for name, found in offenders.items() if found}
    new = {name: found for name, found in offenders.items() if name not in CONNECTORS_STILL_BELOW}
    assert new == {}, "synckit.connectors may not import the runtime or the store"
    done = set(CONNECTORS_STILL_BELOW) - set(offenders)
    assert done == set(), f"no longer import them, strike them from the list: {sorted(done)}"


def test_no_import_cycles_between_the_packages() -> None:
    """The package graph, from the imports that run when a module is imported (module
    level; ``TYPE_CHECKING`` imports and imports inside functions are exempt), has no
    cycle but the listed remainder."""
    edges: dict[tuple[str, str], set[str]] = {}
    for name, imported in _runtime_imports(in_functions=False).items():
        source = _package(name)
        for target_module in imported:
            target = _package(target_module)
            if source and target and source != target:
                edges.setdefault((source, target), set()).add(f"{name} -> {target_module}")

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            for a, b in edges:
                if a == node and b not in seen:
                    seen.add(b)
                    todo.append(b)
        return False

    cyclic = {(a, b) for a, b in edges if reaches(b, a)}
    new = {edge: sorted(edges[edge]) for edge in cyclic - CYCLES_LEFT}
    assert new == {}, "an import cycle between packages"
    gone = CYCLES_LEFT - cyclic
    assert gone == set(), f"no longer in a cycle, strike them from CYCLES_LEFT: {sorted(gone)}"


def test_the_cycle_check_sees_a_cycle() -> None:
    """The rule's own parts find what they must: a module-level import counts, one under
    ``TYPE_CHECKING`` or in a function does not (unless asked), an ``else`` does."""
    tree = ast.parse(
        "from synckit.store import db\n"
        "if TYPE_CHECKING:\n    from synckit.runtime import worker\n"
        "else:\n    import synckit.web\n"
        "def f():\n    from synckit.dlq import replay\n"
    )
    assert _synckit_imports(tree, in_functions=False) == {
        "synckit.store", "synckit.store.db", "synckit.web"
    }  # fmt: skip
    assert "synckit.dlq.replay" in _synckit_imports(tree, in_functions=True)
    assert _package("synckit.runtime.jobs.worker") == "runtime"
    assert _package("synckit.app") == "app"
    assert _package("synckit.cli") is None


def test_one_waker_and_one_listen_loop() -> None:
    """Wake-ups go through ``synckit.store.notify``: no other module keeps a waker
    registry or opens a LISTEN connection (asyncpg is the store's: notify, db, and
    db_errors for its exceptions)."""
    modules = _modules()
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name in ("synckit.store.notify", "synckit.store.db", "synckit.store.db_errors"):
            continue
        source = path.read_text()
        assert "add_listener(" not in source, f"{name} opens its own LISTEN loop"
        assert "_wakers" not in source, f"{name} keeps its own waker registry"
        assert not any(i.split(".")[0] == "asyncpg" for i in modules[name]), name


def test_example_tables_of_their_own_never_touch_synckits() -> None:
    """A module with tables of its own imports neither synckit's table definitions nor a
    store module beyond the Database and the public column type; the rest of the example
    builds no SQL at all."""
    modules = _modules()
    for name in OWN_TABLES:
        imported = modules[name]
        assert "synckit.store.tables" not in imported, name
        store = {i for i in imported if i.startswith("synckit.store.")}
        allowed = {"synckit.store.UTCDateTime", "synckit.store.db", "synckit.store.db.Database"}
        assert store <= allowed, (name, store)
    examples = {n for n in modules if n.startswith("synckit.examples")} - OWN_TABLES
    assert {n for n in examples if _builds_sql(modules[n])} == {DEMO_READS}


def test_the_demos_reads_are_the_demos_alone_and_only_read() -> None:
    """The demo's view of synckit's tables is imported by the demo (its run, plan and
    summary) and nothing else, and
    builds reads only: no insert, update or delete, no SQL text."""
    importers = {n for n, imported in _modules().items() if DEMO_READS in imported}
    demo = {f"synckit.examples.graph_mail.{m}" for m in ("demo", "plan", "summary")}
    assert importers == demo
    tree = _tree(ROOT / "examples" / "graph_mail" / "reads.py")
    writes = {"insert", "update", "delete", "text", "exec_driver_sql", "execute_many"}
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert used & writes == set()


def test_the_pure_bottom_imports_nothing_above_it() -> None:
    """``errors``, ``clock`` and ``redaction`` are pure and sit under everything: they
    import no other part of synckit (``errors`` may import itself)."""
    bottom = ("synckit.errors", "synckit.clock", "synckit.redaction")
    for name, imported in _modules().items():
        if name.startswith(bottom):
            own = name if name in ("synckit.clock", "synckit.redaction") else "synckit.errors"
            bad = {i for i in imported if i.startswith("synckit") and not i.startswith(own)}
            assert bad == set(), f"{name} imports {sorted(bad)}"


# Modules outside synckit.cli that import click or rich, and why (issue 18 item 4).
CLI_OUTSIDE_THE_CLI = {
    # `synckit demo` is a program of its own: its output is a live rich display of the
    # simulated run as it converges, and the summary (the command is synckit.cli.demo).
    "synckit.examples.graph_mail.demo",
    # Its summary, drawn as rich tables after the run.
    "synckit.examples.graph_mail.report",
    # The summary's events, told in rich markup, kept as plain text.
    "synckit.examples.graph_mail.summary",
}


def _prints(imported: set[str]) -> bool:
    return any(
        name.split(".")[0] in ("click", "rich") or name.startswith("synckit.cli")
        for name in imported
    )


def test_only_the_cli_imports_click_and_rich() -> None:
    """Commands live in ``synckit.cli``: nothing else imports click, rich (tables, consoles,
    progress) or the CLI itself, so the core returns data and the CLI prints it."""
    modules = _modules()
    offenders = {
        name
        for name, imported in modules.items()
        if not (name == "synckit.cli" or name.startswith("synckit.cli.")) and _prints(imported)
    }
    assert offenders - CLI_OUTSIDE_THE_CLI == set(), "click or rich outside synckit.cli"
    stale = CLI_OUTSIDE_THE_CLI - offenders
    assert stale == set(), f"no longer import click or rich, strike them: {sorted(stale)}"


def test_the_cli_imports_at_module_level() -> None:
    """A command module imports what it needs at its top. A function-local import is
    listed here with its reason; anything else is a cycle or a cost to look at. (What
    each command may import at all is tests/unit/test_command_imports.py's.)"""
    allowed = {
        # Every command, `synckit --help` too, imports the group and its options: what only
        # commands that run (logging), print tables (rich), open the database (asyncio,
        # SQLAlchemy) or parse a duration (synckit.clock, asyncio) need loads there.
        ("synckit.cli", "synckit.runtime.observe.logging"),
        ("synckit.cli.options", "asyncio"),
        ("synckit.cli.options", "rich.console"),
        ("synckit.cli.options", "rich.markup"),
        ("synckit.cli.options", "rich.text"),
        ("synckit.cli.options", "synckit"),
        ("synckit.cli.options", "synckit.store.db"),
        # `--app` is an option of commands that run without it: the App (httpx, the
        # runtime) and what a replay target may be load when it is given.
        ("synckit.cli.app_loader", "synckit.app"),
        ("synckit.cli.app_loader", "synckit.dlq.replay"),
        ("synckit.cli.app_loader", "synckit.runtime.jobs.handlers"),
        # `secrets keygen` needs no database, runtime or cryptography; check and rotate do.
        ("synckit.cli.secrets", "synckit.runtime.credentials"),
        ("synckit.cli.secrets", "synckit.runtime.credentials.secrets"),
        # prometheus_client only for a worker given --metrics-port.
        ("synckit.cli.worker", "synckit.runtime.observe.metrics"),
        # The web extra (Starlette, Jinja2, uvicorn): only `synckit web` needs it.
        ("synckit.cli.web", "uvicorn"),
        ("synckit.cli.web", "synckit.web.app"),
        ("synckit.cli.web", "synckit.web.base"),
        ("synckit.cli.web", "synckit.web.security"),
        # Not built everywhere (Windows): a missing uvloop is `--loop`'s one-line error.
        ("synckit.cli.options", "uvloop"),
        # The App (and so the runtime) only when `db upgrade --app` is given one.
        ("synckit.cli.db", "synckit.cli.app_loader"),
        ("synckit.cli.records", "synckit.cli.app_loader"),
        ("synckit.cli.records", "rich.table"),
        # `synckit webhooks`: rich, the store and the runtime only in the command run.
        ("synckit.cli.webhooks", "rich.table"),
        ("synckit.cli.webhooks", "synckit.clock"),
        ("synckit.cli.webhooks", "synckit.runtime.sync.webhooks"),
        ("synckit.cli.webhooks", "synckit.store"),
    }
    found = set()
    for path in sorted((ROOT / "cli").glob("*.py")):
        name = "synckit.cli" + ("" if path.stem == "__init__" else f".{path.stem}")
        tree = _tree(path)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module:
                    found.add((name, node.module))
                elif isinstance(node, ast.Import):
                    found.update((name, a.name) for a in node.names)
    assert found - allowed == set(), "function-local imports in synckit.cli"
