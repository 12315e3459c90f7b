"""Each table has exactly one writer module, and docs/architecture.md names it.

Read from the source with ``ast``, as test_layers.py reads imports: a module *writes* a
table when it builds an INSERT, UPDATE or DELETE on it, through SQLAlchemy
(``insert(t)``, ``update(t)``, ``delete(t)``, ``dialect_insert(conn)(t)``, the one lease's
``leases.claim(t, ...)`` / ``leases.fenced(t, ...)``, ``t.insert()``...) or as SQL text
(``INSERT INTO t``, ``UPDATE t``, ``DELETE FROM t``). Another module may run the
statement in its transaction (the queue runs the lane marks it gets from
store/resources.py); what matters is where the statement is written. Migrations are left
out: they are the schema's history, not its writers.

A table family too large for one module is a package under ``synckit/store/`` (such as
``store/dead_letters/`` or ``store/jobs/``): the writer is then the package, any module
inside it, and the doc names the package (``synckit/store/dead_letters/``).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "synckit"
TABLES = PACKAGE / "store" / "tables.py"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

_WRITE_CALLS = frozenset({"insert", "update", "delete", "claim", "fenced"})
_SQL_WRITE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+([a-z_]+)\b")
_OWNER_ROW = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*`(synckit/[a-z_/]+(?:\.py|/))`\s*\|")


def table_names() -> dict[str, str]:
    """The Table objects of store/tables.py: variable name -> table name."""
    names: dict[str, str] = {}
    for node in ast.parse(TABLES.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "Table"
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value.args[0], ast.Constant)
        ):
            names[node.targets[0].id] = str(node.value.args[0].value)
    return names


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Call):  # dialect_insert(conn)(table)
        return "insert"
    return None


def _module_writes(tree: ast.Module, tables: dict[str, str]) -> set[str]:
    # Names this module binds to tables: from synckit.store.tables import jobs [as j].
    bound: dict[str, str] = {}
    inserters = set()  # names bound to dialect_insert(conn), jobs._insert(conn)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "synckit.store.tables":
            for alias in node.names:
                if alias.name in tables:
                    bound[alias.asname or alias.name] = tables[alias.name]
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and "insert" in (_call_name(node.value.func) or "")
        ):
            inserters.update(t.id for t in node.targets if isinstance(t, ast.Name))
    written: set[str] = set()
    known = set(tables.values())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node.func)
            first = node.args[0] if node.args else None
            if (
                (name in _WRITE_CALLS or name in inserters)
                and isinstance(first, ast.Name)
                and first.id in bound
            ):
                written.add(bound[first.id])
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in ("insert", "update", "delete")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in bound
            ):
                written.add(bound[node.func.value.id])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            written.update(t for t in _SQL_WRITE.findall(node.value) if t in known)
    return written


def owner_of(path: Path) -> str:
    """The writer unit of a module: itself, or the package under synckit/store/ it is in
    (``synckit/store/dead_letters/capture.py`` -> ``synckit/store/dead_letters/``)."""
    rel = path.relative_to(ROOT)
    if rel.parts[:2] == ("synckit", "store") and len(rel.parts) > 3:
        return "/".join(rel.parts[:3]) + "/"
    return rel.as_posix()


def writers() -> dict[str, set[str]]:
    """Table name -> the writer units (modules, or store packages; paths from the
    repository root) that write it."""
    tables = table_names()
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for table in _module_writes(ast.parse(path.read_text()), tables):
            found[table].add(owner_of(path))
    return dict(found)


def documented_owners() -> dict[str, str]:
    """The table-owner table of docs/architecture.md: table -> writer module."""
    owners: dict[str, str] = {}
    for line in ARCHITECTURE.read_text().splitlines():
        m = _OWNER_ROW.match(line)
        if m:
            owners[m.group(1)] = m.group(2)
    return owners


def test_the_scan_sees_the_writes_it_is_meant_to_see() -> None:
    """The reader finds each form of write (so an empty result cannot pass by accident)."""
    tables = {"jobs": "jobs", "resources": "resources", "outbox": "outbox", "alerts": "alerts"}
    source = (
        "from synckit.store.tables import jobs, resources as r, outbox, alerts\n"
        "a = update(jobs)\n"
        "b = leases.fenced(r, 'x', values={})\n"
        "ins = dialect_insert(conn)\n"
        "c = ins(outbox)\n"
        "d = text('DELETE FROM alerts WHERE id = 1')\n"
        "e = select(jobs)\n"
    )
    assert _module_writes(ast.parse(source), tables) == {"jobs", "resources", "outbox", "alerts"}


def test_a_module_of_a_store_package_writes_for_its_package() -> None:
    """A module inside a package of synckit/store/ counts as that package; any other
    module as itself."""
    store = PACKAGE / "store"
    assert owner_of(store / "dead_letters" / "capture.py") == "synckit/store/dead_letters/"
    assert owner_of(store / "jobs" / "claiming.py") == "synckit/store/jobs/"
    assert owner_of(store / "outbox.py") == "synckit/store/outbox.py"
    assert owner_of(PACKAGE / "runtime" / "sync" / "poll.py") == "synckit/runtime/sync/poll.py"


def test_each_table_has_exactly_one_writer_module() -> None:
    """No table is written by two modules: its owner holds every statement that writes it."""
    shared = {t: sorted(m) for t, m in writers().items() if len(m) != 1}
    assert shared == {}


def test_the_architecture_doc_names_each_tables_writer() -> None:
    """docs/architecture.md's table-owner table is the code's: every table written, and by
    the module the doc names."""
    found = {t: next(iter(m)) for t, m in writers().items() if len(m) == 1}
    assert documented_owners() == found
