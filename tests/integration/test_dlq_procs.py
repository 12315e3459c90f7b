"""Two replay processes on one database never replay one row at once (both engines)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from waits import PROCESS_TIMEOUT  # tests/

from synckit.store.db import open_database
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters.rows import DlqFilter
from synckit.store.tables import dead_letters

APP = Path(__file__).parent.parent / "apps" / "dlq_app.py"
ROWS = 300


def seed(url: str) -> None:
    async def go() -> None:
        db = open_database(url)
        now = datetime.now(UTC)
        try:
            async with db.begin() as conn:
                await conn.execute(
                    dead_letters.insert(),
                    [
                        {
                            "tenant": f"t{i % 5}",
                            "connector": "mail",
                            "kind": "record:messages",
                            "record_id": f"r{i}",
                            "payload": {"id": i},
                            "error_class": "transient",
                            "error_message": "x",
                            "status": "pending",
                            "first_failed_at": now,
                            "last_attempt_at": now,
                            "next_retry_at": now - timedelta(seconds=1),
                        }
                        for i in range(ROWS)
                    ],
                )
        finally:
            await db.dispose()

    asyncio.run(go())


def statuses(url: str) -> collections.Counter[str]:
    async def go() -> collections.Counter[str]:
        db = open_database(url)
        try:
            return collections.Counter(
                [r.status async for r in dlq_reads.iter_rows(db, DlqFilter())]
            )
        finally:
            await db.dispose()

    return asyncio.run(go())


def test_two_replay_processes_replay_each_row_exactly_once(
    migrated_url: str, tmp_path: Path
) -> None:
    """Two OS processes drain the same due rows; the shared log shows every row once."""
    seed(migrated_url)
    log = tmp_path / "replays.log"
    start_line = tmp_path / "start"
    start_line.mkdir()
    with contextlib.ExitStack() as stack:
        procs = [
            subprocess.Popen(
                [sys.executable, str(APP), migrated_url, str(log), str(start_line)],
                stdout=subprocess.DEVNULL,
                stderr=stack.enter_context(open(tmp_path / f"proc{i}.stderr", "wb")),
            )
            for i in range(2)
        ]
        for i, p in enumerate(procs):
            assert p.wait(timeout=PROCESS_TIMEOUT) == 0, (tmp_path / f"proc{i}.stderr").read_text()[
                -2000:
            ]
    lines = log.read_text().splitlines()
    ids = collections.Counter(line.split()[0] for line in lines)
    assert len(ids) == ROWS
    assert [i for i, n in ids.items() if n > 1] == []
    assert statuses(migrated_url) == {"resolved": ROWS}
    # They started together (a start line in the script) and each row takes 10 ms, so
    # both took part: the exactly-once check above was a real contest.
    assert len({line.split()[1] for line in lines}) == 2
