"""Every complete code sample of the README and docs/ passes `mypy --strict` as written.

A sample is complete unless the line before its fence says ``<!-- excerpt -->``: excerpts
are parts of a file that is itself checked (the Graph walkthrough quotes
synckit/examples/graph_mail, which mypy --strict checks with the package).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(<!-- excerpt -->\n)?```python\n(.*?)```", re.S)


def samples() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1):
                continue
            line = text[: m.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", m.group(2)))
    return found


def test_complete_samples_pass_mypy_strict(tmp_path: Path) -> None:
    found = samples()
    assert len(found) >= 3  # the README's, the helpdesk connector, the incremental one
    names = {}
    for i, (where, code) in enumerate(found):
        path = tmp_path / f"sample_{i}.py"
        path.write_text(code)
        names[path.name] = where
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
