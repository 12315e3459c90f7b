"""One import path per store name: code and tests import a name of ``synckit/store/`` from
the store module that owns it, never through ``synckit/runtime/`` or ``synckit/dlq/``
(read from the source with ``ast``, as test_layers.py reads imports)."""

from __future__ import annotations

import ast
import re
from functools import cache
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


@cache
def _store_names(module: str) -> frozenset[str]:
    """The names ``module`` imports at its top level from ``synckit.store``."""
    path = _module_path(module)
    if path is None:
        return frozenset()
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("synckit.store"):
            names.update(a.asname or a.name for a in node.names)
    return frozenset(names)


def _sources() -> list[Path]:
    return [
        p for folder in ("synckit", "tests", "bench") for p in sorted((ROOT / folder).rglob("*.py"))
    ]


#: A ``from synckit.runtime... import ...`` / ``from synckit.dlq... import ...`` statement
#: at any indentation, parenthesised or on one line, also in the scripts tests keep in
#: strings (the processes they start). Only these statements are parsed: parsing and
#: walking every source file (4 MB) cost seconds of CPU for a few hundred imports. A
#: statement the pattern cuts short (a backslash continuation) does not parse, and its
#: file is then parsed whole.
_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+synckit\.(?:runtime|dlq)\b[\w.]*[ \t]+import[ \t]+(?:\([^)]*\)|[^\n]*)",
    re.MULTILINE,
)


def _imports_from_runtime_or_dlq(source: str) -> list[ast.ImportFrom]:
    try:
        statements = [ast.parse(m.group(0).strip()).body[0] for m in _IMPORT.finditer(source)]
    except SyntaxError:
        statements = list(ast.walk(ast.parse(source)))
    return [
        node
        for node in statements
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(("synckit.runtime", "synckit.dlq"))
    ]


def test_no_store_name_is_imported_through_runtime_or_dlq() -> None:
    """Every ``from synckit.runtime.X import N`` / ``from synckit.dlq import N`` names
    something runtime or dlq defines, not a store name they import."""
    found = set()
    for path in _sources():
        for node in _imports_from_runtime_or_dlq(path.read_text()):
            module = node.module or ""
            store = _store_names(module)
            for alias in node.names:
                if alias.name in store:
                    found.add((path.relative_to(ROOT).as_posix(), module, alias.name))
    assert found - PENDING == set()
