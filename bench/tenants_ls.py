"""``synckit tenants ls`` with many tenants: ``python -m bench.tenants_ls [--size 100000]``.

Adds ``--size`` tenants of the demo connector (``tests/apps/connector_app``, a sealed
``SecretStr`` config each) with :func:`synckit.runtime.admin.bulk.add_tenants`, then runs
each form of the command as its own ``synckit`` process, ``--runs`` times, and prints
the median wall time (process start included): the default page (table), a page as
JSON lines, and ``--all --json`` (every tenant, streamed a page at a time). ``--engine
sqlite`` for SQLite; ``--json`` prints the figures as one object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.sync import ROOT, fresh_database
from synckit.runtime.admin.bulk import add_tenants
from synckit.store.db import open_database

sys.path.insert(0, str(ROOT / "tests" / "apps"))

FORMS = {
    "page_table": ["tenants", "ls"],
    "page_json": ["tenants", "ls", "--json"],
    "all_json": ["tenants", "ls", "--all", "--json"],
}


def _timed_command(args: list[str], url: str) -> float:
    env = {**os.environ, "COLUMNS": "200"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "synckit.cli", *args, "--database-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=3600,
    )
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return elapsed


async def measure(engine: str, size: int, runs: int, skip: set[str]) -> dict[str, Any]:
    from connector_app import app  # tests/apps, made importable above

    out: dict[str, Any] = {"engine": engine, "size": size}
    with tempfile.TemporaryDirectory() as tmp:
        async with fresh_database(engine, Path(tmp)) as url:
            db = open_database(url)
            try:
                rows = [
                    {"tenant": f"t{i:07d}", "connector": "demo", "config": {"api_token": "k"}}
                    for i in range(size)
                ]
                t0 = time.perf_counter()
                added = await add_tenants(db, rows, app=app)
                out["add_s"] = round(time.perf_counter() - t0, 2)
                assert added.added == size, added.errors[:3]
            finally:
                await db.dispose()
            for name, args in FORMS.items():
                if name in skip:
                    continue
                times = [_timed_command(args, url) for _ in range(runs)]
                out[f"{name}_s"] = round(statistics.median(times), 3)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tenants_ls", description=__doc__)
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--engine", choices=["postgresql", "sqlite"], default="postgresql")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--skip", default="", help=f"Forms to leave out: {', '.join(FORMS)}.")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault(
        "SYNCKIT_SECRET_KEY", "c3luY2tpdC10ZXN0cy1vbmx5LWtleS0zMi1ieXRlcyE="
    )  # the tests' key: the demo connector's config holds a secret to seal
    skip = {s for s in args.skip.split(",") if s}
    result = asyncio.run(measure(args.engine, args.size, args.runs, skip))
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>14}: {value}")


if __name__ == "__main__":
    main()
