"""Every third-party module synckit imports is declared (issue 16, item 7).

The imports are read with ``ast`` over ``synckit/**/*.py``; a top-level name outside the
standard library is mapped to its distribution with
``importlib.metadata.packages_distributions()`` and must be a requirement of
``pyproject.toml``: a dependency, or an extra (``dev`` does not count: a user never
installs it). A distribution that only an extra brings may be imported at module level
only by that extra's own package (``synckit/web`` for ``web``, ``synckit/testing`` for
``testing``); anywhere else it must be imported lazily (inside a function), under
``TYPE_CHECKING``, or in a ``try`` that catches ``ImportError``, so that ``import synckit``
works without the extra.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "synckit"
#: The extras whose package is theirs alone: there, their imports may be at module level.
EXTRA_PACKAGES = {"web": "synckit/web/", "testing": "synckit/testing/"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec.strip())
    assert match, spec
    return normalise(match.group(0))


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """The core dependencies and, per extra (not ``dev``), the extra's own requirements."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {requirement_name(s) for s in project["dependencies"]}
    extras = {
        extra: {requirement_name(s) for s in specs} - {"synckit"}
        for extra, specs in project["optional-dependencies"].items()
        if extra != "dev"
    }
    return core, extras


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for n in names:
            if isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError"):
                return True
    return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.AST, guarded: bool = False) -> Iterator[tuple[str, int, bool]]:
    """(top-level module name, line, whether the import is guarded or lazy)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno, guarded
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.module.split(".")[0], node.lineno, guarded
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from imports(node, True)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from imports(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from imports(ast.Module(body=[child], type_ignores=[]), guarded)
        elif isinstance(node, ast.Try) and _catches_import_error(node):
            for child in node.body:
                yield from imports(ast.Module(body=[child], type_ignores=[]), True)
            for part in (node.handlers, node.orelse, node.finalbody):
                for child in part:
                    yield from imports(ast.Module(body=[child], type_ignores=[]), guarded)
        else:
            yield from imports(node, guarded)


def third_party_imports() -> list[tuple[str, str, int, bool]]:
    """(module name, file relative to the checkout, line, guarded) of every import."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name, line, guarded in imports(ast.parse(path.read_text(), rel)):
            if name in sys.stdlib_module_names or name in ("synckit", "__future__"):
                continue
            found.append((name, rel, line, guarded))
    return found


def test_the_reader_sees_lazy_and_guarded_imports_as_such() -> None:
    source = (
        "import httpx\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import asyncpg\n"
        "try:\n    import uvicorn\nexcept ImportError:\n    uvicorn = None\n"
        "def f():\n    import aio_pika\n"
        "class C:\n    import jinja2\n"
    )
    got = {(name, guarded) for name, _, guarded in imports(ast.parse(source))}
    assert got == {
        ("httpx", False),
        ("typing", False),
        ("asyncpg", True),
        ("uvicorn", True),
        ("aio_pika", True),
        ("jinja2", False),
    }


def test_every_third_party_import_is_a_declared_requirement() -> None:
    core, extras = declared()
    assert "cryptography" in core  # runtime/secrets seals configs and tokens with it
    everything = core.union(*extras.values())
    distributions = packages_distributions()
    found = third_party_imports()
    assert {name for name, *_ in found} >= {"httpx", "cryptography", "starlette"}
    undeclared = []
    for name, rel, line, _ in found:
        dists = {normalise(d) for d in distributions.get(name, [])}
        if not dists:
            undeclared.append(f"{rel}:{line}: {name} (not installed: no distribution)")
        elif not dists & everything:
            undeclared.append(f"{rel}:{line}: {name} (from {', '.join(sorted(dists))})")
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(undeclared)


def test_an_extras_import_is_lazy_or_guarded_outside_the_extras_own_package() -> None:
    core, extras = declared()
    distributions = packages_distributions()
    wrong = []
    for name, rel, line, guarded in third_party_imports():
        dists = {normalise(d) for d in distributions.get(name, [])}
        if not dists or dists & core or guarded:
            continue
        owners = [extra for extra, reqs in extras.items() if dists & reqs]
        if not any(rel.startswith(EXTRA_PACKAGES.get(extra, "\0")) for extra in owners):
            wrong.append(f"{rel}:{line}: import {name} at module level (extra {owners})")
    assert not wrong, "an extra's module imported where the extra may be missing:\n" + (
        "\n".join(wrong)
    )
