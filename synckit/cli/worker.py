"""``synckit worker``: run jobs until told to stop (or, with ``--burst``, until idle)."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
from datetime import timedelta

import click

from synckit.cli.options import (
    LOOPS,
    CliError,
    count_option,
    database_option,
    loop_factory,
    parse_duration,
    run,
    seconds_option,
    without_rich,
)

# structlog's dev renderer and httpx's command line import rich (and pygments) when it is
# installed: about a tenth of a second of CPU of every worker's start, for a traceback
# formatter and a command line a worker never uses (its console logs format tracebacks
# plainly). rich stays importable for whatever asks for it later.
with without_rich():
    import structlog

    from synckit import tracing
    from synckit.cli.app_loader import app_option_saying, load_registry
    from synckit.runtime.admin.audit import audit_observer
    from synckit.runtime.credentials.keys import require_openable_secrets
    from synckit.runtime.jobs.recorder import OutcomeObserver, WorkerStats
    from synckit.runtime.jobs.worker import Worker
    from synckit.runtime.sync.context import prepare_process
    from synckit.store.db import Database

__all__ = ["worker_cmd"]


@click.command("worker")
@app_option_saying("A job Registry will do too.")
@count_option("--concurrency", 1, 10_000, 10, "Jobs in flight at once.")
@click.option("--lease", default="60s", show_default=True, help="Lease of a claimed job.")
@seconds_option("--poll-interval", 0.01, 3600, 1.0, "Fallback polling (s).")
@seconds_option("--grace", 0, 86400, 30.0, "Shutdown grace period (s).")
@click.option("--burst", is_flag=True, help="Run the due jobs, then exit.")
@click.option(
    "--charge-at",
    type=click.Choice(["start", "claim"]),
    default="start",
    show_default=True,
    help="When a job's attempt is charged: when it starts (a crash costs jobs claimed "
    "ahead nothing), or when claimed (faster for very short jobs).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar="SYNCKIT_METRICS_PORT",
    help="Serve Prometheus metrics on this port at /metrics (or $SYNCKIT_METRICS_PORT).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="SYNCKIT_METRICS_HOST",
    help="Address /metrics listens on; 0.0.0.0 exposes it to the network "
    "(or $SYNCKIT_METRICS_HOST).",
)
@click.option(
    "--loop",
    "loop_name",
    type=click.Choice(LOOPS),
    default="auto",
    show_default=True,
    envvar="SYNCKIT_LOOP",
    help="Event loop: uvloop where installed (auto), or asyncio's own (or $SYNCKIT_LOOP).",
)
@seconds_option(
    "--presence-every",
    0.1,
    3600,
    5.0,
    "Seconds between this worker's presence heartbeats (synckit workers ls); "
    "silent for three of them, it is shown as lost.",
)
@database_option
def worker_cmd(
    app_spec: str | None,
    concurrency: int,
    lease: str,
    poll_interval: float,
    grace: float,
    burst: bool,
    charge_at: str,
    metrics_port: int | None,
    metrics_host: str,
    loop_name: str,
    presence_every: float,
    database_url: str | None,
) -> None:
    """Run jobs until SIGTERM/SIGINT (or, with --burst, until the queue is idle)."""
    registry, database_url = load_registry(app_spec, database_url)
    # Traces: the app's own TracerProvider (set as its module loaded), else the OTEL_*
    # variables' (OTEL_TRACES_EXPORTER), else none and no cost.
    tracing.configure_from_env()
    lease_time = parse_duration(lease)
    loop = loop_factory(loop_name)
    if lease_time < timedelta(seconds=1):
        raise CliError(f"--lease {lease!r} is shorter than 1s")

    async def go(d: Database) -> WorkerStats:
        await require_openable_secrets(d)  # refuse to start rather than fail every cycle
        prepare_process()
        observers: list[OutcomeObserver] = [audit_observer()]
        server = None
        if metrics_port is not None:
            # prometheus_client only for a worker that serves /metrics.
            from synckit.runtime.observe.metrics import metrics_observer, start_metrics_server

            observers.append(metrics_observer())
            server = await start_metrics_server(metrics_port, d, host=metrics_host)
        w = Worker(
            d,
            registry,
            concurrency=concurrency,
            lease=lease_time,
            poll_interval=poll_interval,
            grace_period=grace,
            observers=observers,
            charge_at="claim" if charge_at == "claim" else "start",
            presence_every=presence_every,
        )
        received: list[signal.Signals] = []
        if not burst:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, _acknowledge, w, sig, grace, received)
        try:
            return await (w.run_until_idle() if burst else w.run())
        finally:
            if server is not None:
                await server.close()

    tune_gc()
    try:
        stats = run(go, database_url, loop=loop)
    finally:
        tracing.shutdown()  # the spans still batched go out before the process ends
    if burst:
        click.echo(json.dumps(vars(stats), sort_keys=True))


#: The worker process's collector thresholds (Python's defaults: 700, 10, 10).
GC_THRESHOLDS = (10_000, 50, 100)


def tune_gc() -> None:
    """Tune the collector for a long-running worker process, once its code is loaded.

    What is loaded now (modules, the app, its connectors) lives as long as the process:
    frozen, no collection traverses it again. A poll cycle allocates thousands of
    objects, so at Python's default thresholds the youngest generation was collected
    several times per cycle; at these, cyclic garbage (exceptions and their tracebacks,
    finished futures) waits at most 10,000 allocations. A trivial poll's CPU fell ~6%
    (0.96-0.98 -> 0.91-0.92 ms, ``bench.tenants``' connector on PostgreSQL).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _acknowledge(
    worker: Worker, sig: signal.Signals, grace: float, received: list[signal.Signals]
) -> None:
    """Say in the log that a signal arrived and what the worker does about it."""
    again = bool(received)
    received.append(sig)
    structlog.get_logger("synckit.worker").warning(
        "worker.signal_received",
        signal=sig.name,
        action="already stopping"
        if again
        else "stop claiming; in-flight jobs get the grace period, then go back to pending",
        grace_seconds=grace,
    )
    worker.stop()
