"""The import rules of the package layout (issue 18), read from the source with ``ast``.

``synckit.store`` owns the tables: no module outside it may import
``synckit.store.tables`` or SQLAlchemy. The move is done module by module; the modules
still to move are listed here, and the list may only shrink: a listed module that no
longer breaks the rule fails the test too, so the list stays the true remainder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import synckit

ROOT = Path(synckit.__file__).parent

# Modules outside synckit.store that still build SQL themselves (issue 18 item 1).
STILL_BUILDING_SQL = {
    "synckit.cli_options",
    "synckit.connectors.authorize",
    "synckit.connectors.bulk",
    "synckit.connectors.keys",
    "synckit.connectors.secrets",
    "synckit.connectors.tenant_pages",
    "synckit.connectors.tenants",
    "synckit.demo",
    "synckit.examples.graph_mail.connector",
    "synckit.runtime.outbox",
    "synckit.runtime.status",
    "synckit.sync_cli",
}


def _modules() -> dict[str, set[str]]:
    """Every module of the package and the names it imports (``a.b`` and ``a.b.name``)."""
    out: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
        if not name.startswith("synckit.store") and _builds_sql(imported)
    }
    assert offenders - STILL_BUILDING_SQL == set(), "new SQL outside synckit.store"
    moved = STILL_BUILDING_SQL - offenders
    assert moved == set(), f"no longer build SQL, strike them from the list: {sorted(moved)}"


def test_the_store_does_not_import_the_layers_above_it() -> None:
    """``synckit.store`` builds on ``errors`` and pure decisions, never on the runtime."""
    above = ("synckit.runtime.worker", "synckit.runtime.poll", "synckit.app", "synckit.cli")
    for name, imported in _modules().items():
        if name.startswith("synckit.store"):
            bad = {i for i in imported if i.startswith(above)}
            assert bad == set(), f"{name} imports {sorted(bad)}"
