"""``synckit status``: tenants, breakers, budgets, queue, alerts, dead letters and the
outbox at a glance, as rich tables (or one JSON object). What it shows is read by
:func:`synckit.runtime.admin.status.read_status`; this module only prints it.
"""

from __future__ import annotations

import functools
import json
import os
from datetime import datetime

import click

from synckit.cli.options import cell, database_option, page_options, run, without_rich
from synckit.cli.options import markup_escaped as escape  # control characters too
from synckit.clock import short_duration

# Read before rich is imported, and without it: structlog's dev renderer (which the
# alert rules' logging brings in) would otherwise import rich's traceback formatter and
# pygments, a tenth of this command's CPU, for tracebacks it never prints.
with without_rich():
    from synckit.runtime.admin.status import ALERTS_ON_THE_SPOT, Status, read_status
    from synckit.store.connections import CONNECTION_STATUSES
    from synckit.store.resources import BREAKER_STATES

from rich.console import Console
from rich.table import Table

from synckit.cli.options import console  # made on first use (rich): after the reads

__all__ = ["render_status", "status_cmd"]


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@page_options("Every tenant at once (slow with many).")
@database_option
def status_cmd(
    as_json: bool, limit: int, after: str | None, every: bool, database_url: str | None
) -> None:
    """Show tenants (breaker, lag, error budget, DLQ), queue depth and alerts at a glance.

    Tenants are summed by status and shown a page at a time, by name.
    """
    snapshot = run(
        functools.partial(read_status, limit=None if every else limit, after=after),
        database_url,
    )
    if as_json:
        click.echo(json.dumps(snapshot.to_json(), indent=2, sort_keys=True))
        return
    render_status(snapshot, _full_width(console))


#: A pipe's width: a table is as wide as its cells, never cut to a terminal's 80 columns.
PIPE_WIDTH = 10_000


def _full_width(out: Console) -> Console:
    """``out``, or, when stdout is no terminal and ``$COLUMNS`` says no width, a console
    as wide as the tables (rich would squeeze every column into 80 characters, cutting
    names and reasons to a few letters in ``synckit status | grep acme`` or a log)."""
    if out.is_terminal or os.environ.get("COLUMNS"):
        return out
    return Console(width=PIPE_WIDTH, no_color=True, highlight=False)


_QUEUE_STATUSES = ("pending", "running", "succeeded", "dead", "cancelled", "discarded")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return short_duration(seconds)


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else "-"


def _marked(value: str, known: frozenset[str]) -> str:
    """A stored status for a rich line: escaped, and marked when the runtime never
    writes it (a corrupt row)."""
    return escape(value) if value in known else escape(f"{value} (unknown)")


#: Unreadable values the tenants table shows in their own cell.
_SHOWN_UNREADABLE = frozenset({"status", "breaker", "next_available_at"})


def _render_subscriptions(status: Status, console: Console) -> None:
    """Webhook subscriptions by state; those lapsed or failed named, with why."""
    if not status.subscriptions_by_state:
        return
    counts = ", ".join(f"{n} {escape(k)}" for k, n in sorted(status.subscriptions_by_state.items()))
    console.print(f"Webhook subscriptions: {counts}")
    for s in status.subscriptions_down:
        console.print(
            f"[bold red]subscription {escape(s.state)}[/bold red]: "
            f"{escape(s.tenant)}/{escape(s.stream)} ({escape(s.connector)}), "
            f"{s.failures} failure(s), next try {_when(s.next_at)}; the stream is polled "
            f"on its schedule. Last error: {escape((s.last_error or '-')[:200])}"
        )


def render_status(status: Status, console: Console) -> None:
    """Print ``status`` as rich tables: tenants, queue, alerts, dead letters and outbox.

    Every stored text (tenant names, reasons, alert messages) is escaped: it is data,
    never rich markup.
    """
    _render_header(status, console)
    _render_tenants(status, console)
    _render_queue(status, console)
    _render_subscriptions(status, console)
    _render_alerts(status, console)
    dlq = ", ".join(f"{escape(k)} {v}" for k, v in sorted(status.dead_letters.items())) or "empty"
    console.print(f"Dead letters: {dlq}    Outbox pending: {status.outbox_pending}")


def _render_header(status: Status, console: Console) -> None:
    """The database, the moment, and the tenants and breakers by state."""
    console.print(
        f"[bold]synckit[/bold] {escape(status.database)}  at {_when(status.generated_at)}"
    )
    total = sum(status.tenants_by_status.values())
    if total:
        parts = ", ".join(
            f"{n} {_marked(k, CONNECTION_STATUSES)}"
            for k, n in sorted(status.tenants_by_status.items())
        )
        open_ = {k: n for k, n in status.breakers_by_state.items() if k != "closed"}
        breakers = (
            ", ".join(f"{n} {_marked(k, BREAKER_STATES)}" for k, n in sorted(open_.items()))
            or "all closed"
        )
        console.print(f"Tenants: {total} ({parts})    Breakers: {breakers}")


def _render_tenants(status: Status, console: Console) -> None:
    """The page of tenants, one row each, and what a row holds that no cell shows."""
    total = sum(status.tenants_by_status.values())
    hours = status.budget_window_seconds / 3600
    tenants = Table(title="Tenants")
    for col in (
        "tenant",
        "connector",
        "status",
        "breaker",
        "next available",
        "last success",
        "lag",
        f"failed/ops ({hours:g}h)",
        f"budget burn ({status.budget:.2%})",
        "DLQ pending",
        "DLQ review",
    ):
        tenants.add_column(col)
    colour = {"healthy": "green", "watch": "yellow", "alert": "bold red"}
    for t in status.tenants:
        bad = dict(t.unreadable)
        shown = f"{t.status} (unknown)" if "status" in bad else t.status
        state = shown if not t.status_reason else f"{shown}: {t.status_reason[:40]}"
        breaker = escape(f"{t.breaker} (unknown)" if "breaker" in bad else t.breaker)
        if t.breaker != "closed":
            breaker = f"[bold red]{breaker}[/bold red]"
        available = "<unreadable>" if "next_available_at" in bad else _when(t.next_available_at)
        level = t.budget_level
        burn = f"[{colour.get(level, 'white')}]{t.budget_burn:.0%} {escape(level)}[/]"
        tenants.add_row(
            escape(t.tenant),
            escape(t.connector or "-"),
            escape(state),
            breaker,
            available,
            _when(t.last_success_at),
            _ago(t.lag_seconds),
            f"{t.failed}/{t.ok + t.failed}",
            burn,
            str(t.dlq_pending),
            str(t.dlq_review),
        )
    if not status.tenants:
        tenants.caption = "no tenants yet" if not total else "no tenants on this page"
    elif status.next_after is not None:
        tenants.caption = escape(
            f"{len(status.tenants)} of {total}; next page: --after {status.next_after}"
        )
    console.print(tenants)
    # What a row holds that no cell shows (created_at, last success), named per tenant.
    for t in status.tenants:
        hidden = [(f, r) for f, r in t.unreadable if f not in _SHOWN_UNREADABLE]
        if hidden:
            said = "; ".join(f"{f} ({r})" for f, r in hidden)
            console.print(f"unreadable in tenant {escape(t.tenant)}: {escape(said)}")


def _render_queue(status: Status, console: Console) -> None:
    """Jobs by kind and status, and the pending jobs whose run_at cannot be read."""
    queue = Table(title="Queue")
    queue.add_column("kind")
    for s in _QUEUE_STATUSES:
        queue.add_column(s, justify="right")
    for kind, counts in sorted(status.queue.items()):
        queue.add_row(escape(kind), *(str(counts.get(s, 0)) for s in _QUEUE_STATUSES))
    if not status.queue:
        queue.caption = "no jobs yet"
    console.print(queue)
    if status.unreadable_jobs:
        ids = ", ".join(str(j.id) for j in status.stuck_jobs)
        more = "" if status.unreadable_jobs <= len(status.stuck_jobs) else ", ..."
        console.print(
            f"[bold red]{status.unreadable_jobs} pending job(s) never run[/bold red]: "
            f"their run_at cannot be read (ids {ids}{more}); "
            "see `synckit jobs ls --unreadable`"
        )


def _render_alerts(status: Status, console: Console) -> None:
    """Alerts firing now and those the worker sent."""
    alerts = Table(title="Alerts")
    for col in ("", "severity", "rule", "subject", "since", "message"):
        alerts.add_column(col)
    for a in status.alerts_firing:
        alerts.add_row(
            "firing", a.severity.value, escape(a.rule), escape(a.subject), "now", cell(a.message)
        )
    for a in status.alerts_recent:
        alerts.add_row(
            "sent",
            a.severity.value,
            escape(a.rule),
            escape(a.subject),
            _when(a.fired_at),
            cell(a.message),
        )
    if not status.alerts_evaluated:
        alerts.caption = (
            f"more than {ALERTS_ON_THE_SPOT} tenants: the rules were not evaluated here; "
            "alerts the worker sent are shown"
        )
    elif not status.alerts_firing and not status.alerts_recent:
        alerts.caption = "no alerts"
    console.print(alerts)
