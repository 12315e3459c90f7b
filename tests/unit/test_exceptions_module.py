"""One exception module: every exception and warning synckit defines is in
``synckit.errors.exceptions``, drawn in its docstring's tree where it really sits, and
importable from ``synckit`` (the one re-export)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import synckit
import synckit.errors
from synckit.errors import exceptions

PACKAGE = Path(synckit.__file__).parent
#: Exceptions that may live elsewhere, and why.
ELSEWHERE = {
    "CliError": "the CLI's error line: a click.ClickException, and click is the CLI's",
    "CycleBlocked": "`synckit sync`'s own control flow, never raised out of the command",
    "BadFilter": "the console's form parsing: a ValueError, caught in the same module",
}


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(exceptions).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == exceptions.__name__
    }


def _is_exception_base(base: ast.expr) -> bool:
    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
    return bool(re.search(r"(Error|Exception|Warning|Outcome)$", name)) or name in _classes()


def test_no_module_but_the_exception_module_defines_a_public_exception() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == Path(exceptions.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and not node.name.startswith("_")
                and node.name not in ELSEWHERE
                and any(_is_exception_base(b) for b in node.bases)
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert found == []


def test_every_exception_is_importable_from_synckit_and_only_from_there() -> None:
    for name, cls in _classes().items():
        assert getattr(synckit, name) is cls, name
        assert name in synckit.__all__, name
    # No second path through the errors package.
    assert not set(synckit.errors.__all__) & set(_classes())


def test_the_docstring_draws_every_class_under_its_real_parent() -> None:
    doc = exceptions.__doc__ or ""
    drawn: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        m = re.match(r"^(\s*)(?:[│ ]*(?:├──|└──) )?([A-Z]\w+)(\s|$)", line)
        if not m or ("──" not in line and line.strip() not in ("SynckitError", "UserWarning")):
            continue
        depth = len(line) - len(line.lstrip(" │├└─"))
        name = m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            drawn[name] = stack[-1][1]
        stack.append((depth, name))
    classes = _classes()
    assert set(drawn) | {"SynckitError"} == set(classes)
    for name, parent in drawn.items():
        parent_cls = UserWarning if parent == "UserWarning" else classes[parent]
        assert parent_cls in classes[name].__bases__, f"{name} is drawn under {parent}"
