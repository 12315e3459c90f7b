"""Webhook acknowledgements: ``python -m bench.webhooks [--n 5000] [--concurrency 32]
[--engines sqlite postgresql] [--json]``.

Per engine (a temporary SQLite file; a PostgreSQL schema of its own, created and
dropped here): 20 tenants of the tests' Stripe-signed connector
(tests/apps/webhooks_app.py); one web process (uvicorn as ``synckit web`` runs it:
httptools and uvloop when installed, ``webhook_app`` alone) started as a subprocess on
loopback. A sender, a process of its own so that it shares no interpreter with either,
opens ``--concurrency`` keep-alive connections, warms every tenant up (five deliveries
each, not counted: a running web process has read its tenants' secrets), then posts
``--n`` deliveries, requests signed before the clock starts, each a new event id, each
connection sending its next once the last is answered. Each 2xx comes after the event's
commit (the durable inbox), so the figures are: deliveries acknowledged per second (wall
clock over all of them), the p50 / p99 acknowledgement latency seen by the sender in
milliseconds, the web process's CPU time per acknowledgement (from /proc: the figure a
loaded machine distorts least), the sender's own CPU per acknowledgement, and the load
average before and after. Bar (issue 33): >= 1,000/s on PostgreSQL with p99 <= 50 ms.

Environment: ``SYNCKIT_SECRET_KEY`` (default: a key made for the run),
``SYNCKIT_BENCH_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from synckit.connectors.webhooks import sign_stripe
from synckit.store import migrate
from synckit.store.db import open_database

sys.path[:0] = [str(Path(__file__).parents[1] / "tests" / "apps")]
import webhooks_app  # noqa: E402  (tests/apps, made importable above)

PG_URL = os.environ.get("SYNCKIT_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
TENANTS = 20
SECRET = "whsec_bench_secret_{}"
CONNECTOR = webhooks_app.Logged.name  # the tests' Stripe-signed connector
app = webhooks_app.app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _setup(url: str) -> None:
    db = open_database(url)
    try:
        await migrate.upgrade(db)
        for i in range(TENANTS):
            await app.add_tenant(db, f"t{i}", CONNECTOR, {"webhook_secret": SECRET.format(i)})
    finally:
        await db.dispose()


def _cpu_seconds(pid: int) -> float | None:
    """The process's user + system CPU time (Linux /proc), or None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _requests(n: int, first: int) -> list[bytes]:
    """``n`` signed deliveries as raw HTTP/1.1 requests (keep-alive), each a new event id,
    the tenants in turn: built before the clock starts, so the sender spends its time
    sending."""
    out = []
    for i in range(first, first + n):
        t = i % TENANTS
        body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "n": i}).encode()
        sig = sign_stripe(SECRET.format(t), int(time.time()), body)
        head = (
            f"POST /{CONNECTOR}/t{t} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"content-type: application/json\r\nstripe-signature: {sig}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def _wait_up(port: int) -> None:
    up_by = time.monotonic() + 120  # a loaded machine can take many seconds to start it
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > up_by:
                raise
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return


async def _send(port: int, n: int, concurrency: int, pid: int) -> dict[str, Any]:
    """The sender (a process of its own, beside the web process): ``concurrency``
    keep-alive connections, each posting its next delivery once the last is answered."""
    await _wait_up(port)
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    # Warm-up, not counted: every tenant's secret is read once, as in a running process.
    warm = iter(_requests(TENANTS * 5, 0))
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def sender(reader: Any, writer: Any, queue: Any, timed: bool) -> None:
        for request in queue:
            start = time.perf_counter()
            status = await _exchange(reader, writer, request)
            if timed:
                latencies.append(time.perf_counter() - start)
                statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(sender(r, w, warm, False) for r, w in conns))
    queue = iter(_requests(n, TENANTS * 5))
    cpu0, own0 = _cpu_seconds(pid), time.process_time()
    begin = time.perf_counter()
    await asyncio.gather(*(sender(r, w, queue, True) for r, w in conns))
    wall = time.perf_counter() - begin
    cpu1, own1 = _cpu_seconds(pid), time.process_time()
    for _, w in conns:
        w.close()
    latencies.sort()
    acks = statuses.get(200, 0)
    return {
        "deliveries": n,
        "concurrency": concurrency,
        "acks_per_s": round(acks / wall, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
        "statuses": statuses,
        # The web process's CPU per acknowledgement: what a loaded machine distorts least.
        "server_cpu_ms_per_ack": (
            round((cpu1 - cpu0) * 1000 / max(1, acks), 3)
            if cpu0 is not None and cpu1 is not None
            else None
        ),
        "sender_cpu_ms_per_ack": round((own1 - own0) * 1000 / max(1, acks), 3),
        "load": os.getloadavg()[0],
    }


def _sender_process(port: int, n: int, concurrency: int, pid: int) -> dict[str, Any]:
    return asyncio.run(_send(port, n, concurrency, pid))


async def _pg_schema(action: str, schema: str) -> None:
    db = open_database(PG_URL)
    try:
        async with db.begin() as conn:
            await conn.exec_driver_sql(f"{action} SCHEMA {schema}")
    finally:
        await db.dispose()


def run_engine(engine: str, n: int, concurrency: int) -> dict[str, Any]:
    schema = None
    with tempfile.TemporaryDirectory() as tmp:
        if engine == "sqlite":
            url = f"sqlite:///{tmp}/bench.db"
        else:
            schema = f"bench_{uuid.uuid4().hex[:10]}"
            asyncio.run(_pg_schema("CREATE", schema))
            url = f"{PG_URL}?search_path={schema}"
        try:
            asyncio.run(_setup(url))
            port = _free_port()
            load_before = os.getloadavg()[0]
            server = subprocess.Popen(
                [sys.executable, webhooks_app.__file__, "--serve", url, str(port)]
            )
            try:
                # The sender in a process of its own: on a 2-core machine it must not
                # share the bench's interpreter (and its GIL) with anything else.
                with multiprocessing.get_context("spawn").Pool(1) as pool:
                    result: dict[str, Any] = pool.apply(
                        _sender_process, (port, n, concurrency, server.pid)
                    )
                result["load_before"] = load_before
                return result
            finally:
                server.terminate()
                server.wait(timeout=30)
        finally:
            if schema:
                asyncio.run(_pg_schema("DROP", f"{schema} CASCADE"))


def main() -> None:
    if not os.environ.get("SYNCKIT_SECRET_KEY"):
        # Tenants' secrets are sealed: a key for this run (the server inherits it).
        from cryptography.fernet import Fernet

        os.environ["SYNCKIT_SECRET_KEY"] = Fernet.generate_key().decode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--engines", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {e: run_engine(e, args.n, args.concurrency) for e in args.engines}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for engine, r in results.items():
        print(
            f"{engine}: {r['acks_per_s']} acks/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
            f"web process CPU {r['server_cpu_ms_per_ack']} ms/ack, "
            f"sender CPU {r['sender_cpu_ms_per_ack']} ms/ack "
            f"({r['deliveries']} deliveries, {r['concurrency']} at a time, {r['statuses']}; "
            f"load {r['load_before']:.1f} before, {r['load']:.1f} after)"
        )


if __name__ == "__main__":
    main()
