"""notify.watch_sqlite: another process's commit to a SQLite file wakes a waiter."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

from waits import await_until  # tests/

from synckit.store.db import open_database
from synckit.store.notify import watch_sqlite


def _commit_from_another_process(path: Path) -> None:
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "c.execute('insert into t values (1)'); c.commit()"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)


async def test_a_commit_by_another_process_wakes_the_watcher_and_nothing_else_does(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.db"
    with sqlite3.connect(path) as c:
        c.execute("pragma journal_mode=wal")
        c.execute("create table t (x)")
    db = open_database(f"sqlite:///{path}")
    woken: list[float] = []
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(watch_sqlite(db, lambda: woken.append(loop.time()), interval=0.02))
    try:
        await asyncio.sleep(0.3)
        assert woken == []  # nothing committed: no wake-up
        with sqlite3.connect(path) as c:  # a read is no change either
            c.execute("select count(*) from t").fetchone()
        await asyncio.sleep(0.2)
        assert woken == []
        before = loop.time()
        await asyncio.to_thread(_commit_from_another_process, path)

        async def noticed() -> bool:
            return bool(woken)

        await await_until(noticed, "the commit noticed", interval=0.02)
        await asyncio.sleep(0.2)  # and only once
        assert len(woken) == 1 and woken[0] >= before
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await db.dispose()
