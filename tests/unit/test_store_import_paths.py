"""One import path per store name: code and tests import a name of ``synckit/store/`` from
the store module that owns it, never through ``synckit/runtime/`` or ``synckit/dlq/``
(read from the source with ``ast``, as test_layers.py reads imports)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Imports that still go through runtime/ (none now; an entry names its file, the
# module it imports from and the name).
PENDING: set[tuple[str, str, str]] = set()


def _module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _store_names(module: str) -> set[str]:
    """The names ``module`` imports at its top level from ``synckit.store``."""
    path = _module_path(module)
    if path is None:
        return set()
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("synckit.store"):
            names.update(a.asname or a.name for a in node.names)
    return names


def _sources() -> list[Path]:
    return [
        p for folder in ("synckit", "tests", "bench") for p in sorted((ROOT / folder).rglob("*.py"))
    ]


def test_no_store_name_is_imported_through_runtime_or_dlq() -> None:
    """Every ``from synckit.runtime.X import N`` / ``from synckit.dlq import N`` names
    something runtime or dlq defines, not a store name they import."""
    cache: dict[str, set[str]] = {}
    found = set()
    for path in _sources():
        source = path.read_text()
        if "synckit.runtime" not in source and "synckit.dlq" not in source:
            continue  # imports nothing from either: no need to parse it
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if not node.module.startswith(("synckit.runtime", "synckit.dlq")):
                continue
            store = cache.setdefault(node.module, _store_names(node.module))
            for alias in node.names:
                if alias.name in store:
                    found.add((path.relative_to(ROOT).as_posix(), node.module, alias.name))
    assert found - PENDING == set()
