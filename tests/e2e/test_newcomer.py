"""A newcomer's path, run as written: docs/connectors.md's connector and shell commands in an
empty folder, with the installed ``synckit`` script and no PYTHONPATH; and the one ``--app``
loader's errors.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from waits import PROCESS_TIMEOUT  # tests/

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "connectors.md"
SCRIPT = Path(sys.executable).parent / "synckit"
TICKETS = 7


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


class Helpdesk(BaseHTTPRequestHandler):
    """``GET /v2/tickets?page=N`` (three a page) and ``POST /v2/exports``."""

    exports: list[Any] = []
    auth: set[str] = set()

    def _send(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        Helpdesk.auth.add(self.headers.get("Authorization", ""))
        url = urlparse(self.path)
        page = int(parse_qs(url.query).get("page", ["1"])[0])
        ids = list(range(1, TICKETS + 1))[(page - 1) * 3 : page * 3]
        more = page * 3 < TICKETS
        self._send(
            {
                "tickets": [{"id": i, "status": "open"} for i in ids],
                "next_page": page + 1 if more else None,
            }
        )

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        Helpdesk.exports.append(json.loads(self.rfile.read(length)))
        self._send({"ok": True})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def helpdesk() -> Iterator[str]:
    Helpdesk.exports = []
    Helpdesk.auth = set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Helpdesk)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v2"
    finally:
        server.shutdown()
        server.server_close()


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCKIT_", "PYTHONPATH"))}
    env["PATH"] = f"{SCRIPT.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_documented_connector_and_commands_sync_a_tenant_with_sync_wait(
    tmp_path: Path, helpdesk: str
) -> None:
    """docs/connectors.md word for word (base_url pointed at the fake), then `sync --wait`."""
    docs = DOCS.read_text()
    code = next(b for b in blocks(docs, "python") if b.startswith("# helpdesk_sync.py"))
    assert "https://api.helpdesk.example.com/v2" in code
    (tmp_path / "helpdesk_sync.py").write_text(
        code.replace("https://api.helpdesk.example.com/v2", helpdesk)
    )
    shell = next(b for b in blocks(docs, "sh") if "synckit sync acme" in b)
    script = "set -e\n" + shell + "status=$?\nkill %1\nwait %1 || true\nexit $status\n"
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=2 * PROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    err = result.stderr
    assert "acme/default: succeeded" in err, err[-3000:]
    # The worker's scheduler may run the new tenant's first cycle too (before or after
    # the one `sync` asked for): a later cycle reads the last page again, as documented,
    # so its tickets may be handled twice. Every ticket is handled, none failed, and
    # only the last page's tickets twice.
    handled = re.search(r"(\d+) records handled, 0 failed, 0 dead letters", err)
    assert handled is not None, err[-3000:]
    exported = collections.Counter(e["ticket"] for e in Helpdesk.exports)
    assert 1 <= int(handled.group(1)) <= exported.total(), err[-3000:]
    assert set(exported) == set(range(1, TICKETS + 1))
    last_page = set(range(1, TICKETS + 1)[(TICKETS - 1) // 3 * 3 :])
    assert {t for t, n in exported.items() if n > 1} <= last_page, exported
    assert Helpdesk.auth == {"Bearer ..."}


def run_synckit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )


@pytest.mark.parametrize(
    "command", [("tenants", "add", "t1", "demo"), ("dlq", "replay", "--all"), ("worker", "--burst")]
)
def test_every_app_error_is_the_same_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    """A missing module, a module that raises and a wrong object: one line, the same text."""
    (tmp_path / "broken.py").write_text("raise ValueError('config missing')\n")
    (tmp_path / "notapp.py").write_text("app = 42\n")
    for spec, expected in [
        ("nowhere:app", "--app 'nowhere:app': no module named 'nowhere'"),
        ("broken:app", "--app 'broken:app': importing 'broken' failed: ValueError: config missing"),
        ("notapp:app", "--app 'notapp:app': a int is not a synckit App"),
        ("notapp:nothing", "--app 'notapp:nothing': module 'notapp' has no attribute 'nothing'"),
    ]:
        result = run_synckit(tmp_path, *command, "--app", spec)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (spec, result.stderr)
        assert len(lines) == 1 and expected in lines[0], (spec, result.stderr)


README = ROOT / "README.md"


class Tickets(BaseHTTPRequestHandler):
    """``GET /tickets[?cursor=N]``: three tickets a page, ``next_cursor`` until the last."""

    seen: list[int] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        start = int(parse_qs(url.query).get("cursor", ["0"])[0])
        ids = list(range(start + 1, min(start + 3, TICKETS) + 1))
        Tickets.seen += ids
        more = start + 3 < TICKETS
        data = json.dumps(
            {"tickets": [{"id": i} for i in ids], "next_cursor": str(start + 3) if more else None}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_readme_runs_as_written_next_to_myapp_py(tmp_path: Path) -> None:
    """README's connector saved as myapp.py and its "Running it" block, word for word (only
    base_url points at a loopback fake), in an empty folder with no PYTHONPATH."""
    Tickets.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Tickets)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        readme = README.read_text()
        code = next(b for b in blocks(readme, "python") if b.startswith("# myapp.py"))
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert 'base_url = "https://api.example.com"' in code
        (tmp_path / "myapp.py").write_text(code.replace("https://api.example.com", url))
        section = readme[readme.index("## Running it") :]
        shell = blocks(section, "sh")[0]
        assert "synckit sync acme --app myapp:app --wait" in shell
        script = "set -e\n" + shell + "kill %1\nwait %1 || true\n"
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=2 * PROCESS_TIMEOUT,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "acme/default: succeeded" in result.stderr, result.stderr[-3000:]
    assert sorted(set(Tickets.seen)) == list(range(1, TICKETS + 1))
    assert "acme" in result.stdout  # synckit status lists the tenant
