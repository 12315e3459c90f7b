"""`synckit demo`'s database holds no tenant secret (issue 16: "the demo's too").

The demo is run as a newcomer runs it (a subprocess in an empty directory, no key set: it
makes an ephemeral one). Its simulator is seeded, so the client secret in every tenant's
config and every access and refresh token it issues can be computed here. The SQLite file
and its write-ahead log are read while the demo runs (the WAL holds what is not yet
checkpointed) and once more after it: none of those secrets may be in their bytes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from synckit.examples.graph_mail.demo import DB_FILE
from synckit.examples.graph_mail.simulator import GraphSimulator

#: ``run_demo`` seeds its simulator with this (synckit/examples/graph_mail/demo.py).
DEMO_SEED = 2024
#: ``GraphSimulator._opaque``: ``prefix + urlsafe_b64(sha256(seed:prefix:counter))``.
OPAQUE = re.compile(rb"(?:at|rt)[A-Za-z0-9_-]{43}")


def issued_tokens(seed: int, up_to: int = 20_000) -> set[bytes]:
    """Every access and refresh token the seeded simulator can issue in a demo's run."""
    out = set()
    for prefix in ("at", "rt"):
        for n in range(1, up_to + 1):
            raw = hashlib.sha256(f"{seed}:{prefix}:{n}".encode()).digest()
            out.add((prefix + base64.urlsafe_b64encode(raw).decode().rstrip("=")).encode())
    return out


def test_the_demo_database_and_its_wal_hold_no_client_secret_or_token(tmp_path: Path) -> None:
    client_secret = GraphSimulator(seed=DEMO_SEED).client_secret.encode()
    assert client_secret.startswith(b"sim-secret-")
    tokens = issued_tokens(DEMO_SEED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
    db, wal = tmp_path / DB_FILE, tmp_path / f"{DB_FILE}-wal"
    found: set[str] = set()
    seen_wal = 0

    def scan(path: Path) -> int:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0
        if client_secret in data:
            found.add(f"{path.name}: the client secret")
        leaked = set(OPAQUE.findall(data)) & tokens
        if leaked:
            found.add(f"{path.name}: {len(leaked)} issued token(s)")
        return len(data)

    log = tmp_path.parent / f"{tmp_path.name}-demo.stderr"  # a pipe unread would block it
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "synckit.cli", "demo", "--json"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            seen_wal = max(seen_wal, scan(wal))
            time.sleep(0.3)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
    scan(wal)
    assert scan(db) > 0
    assert seen_wal > 0, "the WAL was never seen: the test read nothing of it"
    # The demo did store its tenants' configs and tokens (sealed), so there was something
    # to leak: a connection row per tenant with a config and tokens.
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT config, token_set FROM connections").fetchall()
    assert rows and all(config and tokens for config, tokens in rows)
    assert not found, sorted(found)
