"""docs/architecture.md names every package and module of ``synckit/`` in one line
(its "Modules" table), and this test keeps the table and the tree in step: a module
added, moved or removed without its line fails here."""

from __future__ import annotations

import re
from pathlib import Path

import synckit

ROOT = Path(synckit.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.+) \|$")


def _table() -> dict[str, str]:
    text = DOC.read_text()
    start = text.index("## Modules\n")
    end = text.find("\n## ", start + 1)
    rows = {}
    for line in text[start : end if end > 0 else None].splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is named twice"
            rows[m.group(1)] = m.group(2)
    return rows


def _tree() -> set[str]:
    out = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if "versions" in rel.parts:  # the migrations: one entry, store/migrations/
            continue
        if path.name == "__init__.py":
            if rel.parent != Path("."):
                out.add(f"{rel.parent.as_posix()}/")
        else:
            out.add(rel.as_posix())
    return out


def test_the_module_table_names_every_package_and_module_and_nothing_else() -> None:
    table, tree = set(_table()), _tree()
    assert sorted(tree - table) == [], "modules without a line in architecture.md's table"
    assert sorted(table - tree) == [], "lines in architecture.md's table for no module"


def test_each_line_says_what_the_module_holds() -> None:
    for path, says in _table().items():
        assert says.strip() and "TODO" not in says, path
        assert len(says) <= 240, f"{path}: one line, please ({len(says)} characters)"
