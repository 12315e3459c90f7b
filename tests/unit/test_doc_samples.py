"""Every code sample of the README and docs/ is checked (issue 19 item 6).

A sample is complete unless the line before its fence says ``<!-- excerpt -->``. Complete
samples pass ``mypy --strict`` as written; one whose first line is ``# name.py`` is that
file, so that another sample can import it (``from helpdesk_sync import Helpdesk``).

An excerpt is a quote of a file that is itself checked: a module of synckit (mypy
--strict checks it with the package) or a test (it runs). It must be one verbatim: its
code, token by token, is a run of the file's code, where ``...`` stands for code left out.
Comments and docstrings are annotations (either side may have them or not); everything
else, down to a type annotation or a name, must be as in the file.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(<!-- excerpt -->\n)?```python\n(.*?)```", re.S)
NAMED = re.compile(r"# ([A-Za-z_][A-Za-z0-9_]*\.py)\n")
#: What an excerpt may quote.
QUOTABLE = ("synckit", "tests")
_LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def samples(*, excerpts: bool) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if bool(m.group(1)) != excerpts:
                continue
            line = text[: m.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", m.group(2)))
    return found


def code_tokens(source: str) -> list[str]:
    """The code of ``source``, token by token: no layout, comments or docstrings."""
    out = []
    for t in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline):
        if t.type in _LAYOUT:
            continue
        if t.type == tokenize.STRING and t.string.lstrip("rbuRBU").startswith(('"""', "'''")):
            continue
        out.append(t.string)
    return out


def _runs(excerpt: str) -> list[list[str]]:
    runs: list[list[str]] = [[]]
    for token in code_tokens(excerpt):
        if token == "...":
            runs.append([])
        else:
            runs[-1].append(token)
    return [r for r in runs if r]


def _find(tokens: list[str], run: list[str], start: int) -> int:
    for i in range(start, len(tokens) - len(run) + 1):
        if tokens[i : i + len(run)] == run:
            return i
    return -1


def quotes(excerpt: str, tokens: list[str]) -> bool:
    """Whether ``excerpt`` is a quote of the file whose code is ``tokens``."""
    at = 0
    for run in _runs(excerpt):
        found = _find(tokens, run, at)
        if found < 0:
            return False
        at = found + len(run)
    return True


@cache
def quotable() -> dict[str, list[str]]:
    return {
        path.relative_to(ROOT).as_posix(): code_tokens(path.read_text())
        for folder in QUOTABLE
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def test_complete_samples_pass_mypy_strict(tmp_path: Path) -> None:
    found = samples(excerpts=False)
    assert len(found) >= 3  # the README's, the helpdesk connector, the incremental one
    names = {}
    for i, (where, code) in enumerate(found):
        named = NAMED.match(code)
        name = named.group(1) if named else f"sample_{i}.py"
        assert name not in names, f"{where}: a second {name}"
        (tmp_path / name).write_text(code)
        names[name] = where
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(ROOT / ".mypy_cache"),
         "--config-file", str(ROOT / "pyproject.toml"), *sorted(names)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    report = result.stdout
    for name, where in names.items():
        report = report.replace(name, f"{where} ({name})")
    assert result.returncode == 0, report


def test_every_excerpt_quotes_a_checked_file_verbatim() -> None:
    found = samples(excerpts=True)
    files = quotable()
    unquoted = [where for where, code in found if not any(quotes(code, t) for t in files.values())]
    assert not unquoted, (
        "excerpts that quote no checked file (make them complete samples, or quote the "
        f"file as it is, with ... for what is left out): {unquoted}"
    )


def test_a_changed_name_or_annotation_is_not_a_quote() -> None:
    source = code_tokens(
        'class C:\n    """Doc."""\n\n    # a comment\n    x: int = 1\n\n'
        "    def f(self, a: int) -> int:\n        return a + self.x\n"
    )
    assert quotes("    x: int = 1  # one\n    ...\n        return a + self.x\n", source)
    assert quotes("class C:\n    x: int = 1\n    def f(self, a: int) -> int:\n", source)
    assert not quotes("    def f(self, a) -> int:\n", source)
    assert not quotes("    x: int = 2\n", source)
    assert not quotes("    return a + self.x\n    x: int = 1\n", source)  # order kept
