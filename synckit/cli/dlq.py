"""``synckit dlq ...``: list, show, replay, resolve, ignore, purge and export dead letters.

Every command that walks rows streams them (keyset pages, see :mod:`synckit.store.dead_letters`),
so a filter matching 100,000 rows never holds them all in memory.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import IO, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from synckit.cli.app_loader import app_option_saying, load_replay_target
from synckit.cli.options import (
    ROW_ID,
    CliError,
    cell,
    console,
    count_option,
    database_option,
    parse_duration,
    print_unreadable,
    run,
    seconds_option,
)
from synckit.clock import utcnow
from synckit.dlq.outcomes import ReplayResult
from synckit.dlq.replay import ReplayProcessor, ReplaySummary, replayers_from_app
from synckit.redaction import redact
from synckit.runtime.admin.actions import NO_APP_REASON
from synckit.store.db import Database
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters.rows import STATUSES, DeadLetter, DlqFilter

GROUPS = ("tenant", "connector", "kind", "class", "status")


def _split(values: Iterable[str]) -> tuple[str, ...]:
    """``--x a,b --x c`` -> ("a", "b", "c")."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def filter_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The row filters every command shares."""
    options = [
        click.option("--tenant", "tenants", multiple=True, help="Only these tenants (a,b)."),
        click.option("--connector", "connectors", multiple=True, help="Only these connectors."),
        click.option(
            "--kind", "kinds", multiple=True, help="Only these kinds; 'record:*' is a prefix."
        ),
        click.option("--class", "error_classes", multiple=True, help="Only these error classes."),
        click.option(
            "--status",
            "statuses",
            multiple=True,
            help=f"Only these statuses ({', '.join(STATUSES)}).",
        ),
        click.option("--since", help="Failed or replayed within this long (e.g. 1h, 2d)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_filter(ids: Iterable[int] = (), **kw: Any) -> DlqFilter:
    statuses = _split(kw.get("statuses") or ())
    unknown = [s for s in statuses if s not in STATUSES]
    if unknown:
        raise CliError(f"unknown status {', '.join(unknown)}: choose among {', '.join(STATUSES)}")
    since = kw.get("since")
    return DlqFilter(
        ids=tuple(ids),
        tenants=_split(kw.get("tenants") or ()),
        connectors=_split(kw.get("connectors") or ()),
        kinds=_split(kw.get("kinds") or ()),
        error_classes=_split(kw.get("error_classes") or ()),
        statuses=statuses,
        since=utcnow() - parse_duration(since) if since else None,
    )


def _selection(ids: tuple[int, ...], all_rows: bool, filters: dict[str, Any]) -> DlqFilter:
    """The rows a changing command applies to: ids and/or filters, or --all explicitly."""
    flt = build_filter(ids, **filters)
    if flt.is_empty and not all_rows:
        raise CliError("give dead letter ids, a filter (e.g. --tenant acme), or --all")
    return flt


def _ts(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _when(row: DeadLetter, name: str, *, why: bool = False) -> str:
    """The timestamp column ``name`` of ``row``, or what stands in for one that cannot be
    read (with ``why``: the reason too)."""
    reason = row.unreadable.get(name)
    if reason is None:
        return _ts(getattr(row, name))
    return f"<unreadable: {reason}>" if why else "<unreadable>"


def _short(text: str | None, width: int = 50) -> Any:
    return cell(text, width)


def _dumps(data: Any) -> str:
    # Everything printed passes the redaction step: payloads and error texts may quote
    # what an API echoed back, stored before redaction covered its shape.
    return json.dumps(redact(data), sort_keys=True, default=str)


@click.group()
def dlq() -> None:
    """Inspect, replay, resolve, ignore, purge and export dead letters."""


# --- ls / show ------------------------------------------------------------------------------


@dlq.command("ls")
@filter_options
@click.option(
    "--group-by", help=f"Count rows per these columns ({', '.join(GROUPS)}), e.g. tenant,class."
)
@click.option(
    "--limit",
    type=click.IntRange(0, 100_000),
    help="At most this many rows (default: 50 in the table, all with --json; 0: all).",
)
@click.option("--before", type=ROW_ID, help="Rows older than this id (the last one shown).")
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one row (or group) a line.")
@database_option
def ls(
    group_by: str | None,
    limit: int | None,
    before: int | None,
    as_json: bool,
    database_url: str | None,
    **filters: Any,
) -> None:
    """List dead letters, newest first, or count them per group; a page that is cut short
    says how to ask for the next (``--before`` the last id shown)."""
    flt = build_filter(**filters)
    if group_by:
        columns = list(_split([group_by]))
        if not columns or any(c not in GROUPS for c in columns):
            raise CliError(f"--group-by {group_by!r}: choose among {', '.join(GROUPS)}")
        _ls_groups(columns, flt, as_json, database_url)
    elif as_json:
        _ls_json(flt, limit, before, database_url)
    else:
        _ls_table(flt, 50 if limit is None else limit, before, database_url)


def _next_page(last: int) -> str:
    return f"next page: --before {last}"


def _ls_groups(columns: list[str], flt: DlqFilter, as_json: bool, database_url: str | None) -> None:
    groups = run(lambda d: dlq_reads.group_counts(d, columns, flt), database_url)
    if as_json:
        for g in groups:
            click.echo(_dumps({**dict(zip(columns, g.key, strict=True)), "count": g.count}))
        return
    table = Table(title=f"Dead letters by {', '.join(columns)}")
    for c in columns:
        table.add_column(c)
    table.add_column("count", justify="right")
    for g in groups:
        table.add_row(*(cell(k) for k in g.key), str(g.count))
    table.caption = f"{sum(g.count for g in groups)} rows in {len(groups)} groups"
    console.print(table)


def _ls_json(
    flt: DlqFilter, limit: int | None, before: int | None, database_url: str | None
) -> None:
    # Streamed: each page is printed before the next is read. One row past the page is
    # read, so that a next page is offered only when there is one.
    async def stream(d: Database) -> int | None:
        """Print the page; return its last id if a row follows it."""
        printed, last = 0, None
        wanted = limit + 1 if limit else None
        async for row in dlq_reads.iter_rows(
            d, flt, newest_first=True, limit=wanted, after_id=before
        ):
            if limit and printed == limit:
                return last
            click.echo(_dumps(row.to_json()))
            printed, last = printed + 1, row.id
        return None

    if (last := run(stream, database_url)) is not None:
        click.echo(_next_page(last), err=True)


def _ls_table(flt: DlqFilter, shown: int, before: int | None, database_url: str | None) -> None:
    # One row past the page is read, so that a next page is offered only when there is one.
    async def page(d: Database) -> tuple[list[DeadLetter], int]:
        found = dlq_reads.iter_rows(
            d, flt, newest_first=True, limit=shown + 1 if shown else None, after_id=before
        )
        return [r async for r in found], await dlq_reads.count(d, flt)

    rows, total = run(page, database_url)
    more = bool(shown) and len(rows) > shown
    rows = rows[:shown] if shown else rows
    table = Table(title="Dead letters")
    for col in (
        "id",
        "status",
        "tenant",
        "connector",
        "kind",
        "record",
        "class",
        "tries",
        "last failure",
        "next retry",
        "error / reason",
    ):
        table.add_column(col, justify="right" if col in ("id", "tries") else "left")
    for r in rows:
        table.add_row(
            str(r.id),
            cell(r.status),
            cell(r.tenant),
            cell(r.connector),
            cell(r.kind),
            _short(r.record_id, 24),
            cell(r.error_class),
            f"{r.attempt_count}/{r.replay_attempts}",
            cell(_when(r, "last_attempt_at")),
            cell(_when(r, "next_retry_at")) if r.status == "pending" else "-",
            _short(
                r.status_reason if r.status != "pending" and r.status_reason else r.error_message
            ),
        )
    table.caption = (
        f"{len(rows)} of {total} matching (tries: failures/replays)"
        + (f"; {_next_page(rows[-1].id)}" if more else "")
        if rows
        else "no dead letters match"
    )
    console.print(table)
    print_unreadable(console, rows, "dead letter")


@dlq.command("show")
@click.argument("row_id", type=ROW_ID)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@database_option
def show(row_id: int, as_json: bool, database_url: str | None) -> None:
    """Show one dead letter: its payload, error history and traceback."""
    row = run(lambda d: dlq_reads.get(d, row_id), database_url)
    if as_json:
        click.echo(json.dumps(redact(row.to_json()), indent=2, sort_keys=True, default=str))
        return
    title = Text.assemble(
        (f"dead letter {row.id}", "bold"),
        "  ",
        cell(row.status),
        *((" — ", cell(row.status_reason)) if row.status_reason else ()),
    )
    console.print(title)
    facts = Table.grid(padding=(0, 2))
    for name, value in (
        ("tenant", row.tenant),
        ("connector", row.connector),
        ("kind", row.kind),
        ("record", row.record_id),
        ("resource", row.resource_key),
        ("error", f"{row.error_class}: {row.error_message}"),
        ("failures", str(row.attempt_count)),
        ("replays", str(row.replay_attempts)),
        ("first failed", _when(row, "first_failed_at", why=True)),
        ("last attempt", _when(row, "last_attempt_at", why=True)),
        ("next retry", _when(row, "next_retry_at", why=True)),
        ("resolved", _when(row, "resolved_at", why=True)),
        ("trace id", row.trace_id or "-"),
    ):
        facts.add_row(Text(name, "dim"), cell(value))
    console.print(facts)
    console.print("[bold]payload[/bold]")
    if row.payload_error is not None:
        console.print(cell(f"does not parse: {row.payload_error}"), style="red")
        console.print(cell(row.payload_raw))
    else:
        console.print(Syntax(json.dumps(redact(row.payload), indent=2, default=str), "json"))
    if "history" in row.unreadable:
        console.print(cell(f"history unreadable: {row.unreadable['history']}"), style="red")
    history = Table(title="history (oldest first)")
    for col in ("at", "source", "class", "message"):
        history.add_column(col)
    for h in row.history:
        history.add_row(
            cell(h.get("at")),
            cell(h.get("source")),
            cell(h.get("error_class")),
            _short(str(h.get("message", "")), 80),
        )
    console.print(history)
    console.print("[bold]traceback[/bold]")
    console.print(cell(row.traceback), highlight=False)


# --- replay ---------------------------------------------------------------------------------


def _summary_tables(summary: ReplaySummary, title: str) -> list[Any]:
    outcomes = Table(title=title)
    outcomes.add_column("outcome")
    outcomes.add_column("rows", justify="right")
    for name, n in summary.counts().items():
        if name != "claimed":
            outcomes.add_row(name, str(n))
    tables: list[Any] = [outcomes]
    if summary.reasons:
        reasons = Table(title="Why rows were ignored, skipped, deferred or left unchanged")
        for col in ("outcome", "reason", "rows"):
            reasons.add_column(col, justify="right" if col == "rows" else "left")
        ranked = sorted(summary.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        for (outcome, reason), n in ranked[:20]:
            reasons.add_row(outcome, _short(reason, 90), str(n))
        tables.append(reasons)
    if summary.reviews:
        reviews = Table(title="Sent to review")
        for col in ("tenant", "class", "rows"):
            reviews.add_column(col, justify="right" if col == "rows" else "left")
        for (tenant, cls), n in sorted(summary.reviews.items()):
            reviews.add_row(cell(tenant), cell(cls), str(n))
        tables.append(reviews)
    return tables


@dlq.command("replay")
@click.argument("ids", nargs=-1, type=ROW_ID)
@filter_options
@click.option("--all", "all_rows", is_flag=True, help="Every pending and review row.")
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@app_option_saying(
    "A job Registry or Replayers will do too. Without it, dead jobs are re-run as jobs "
    "and record rows are reported as needing --app."
)
@count_option("--max-attempts", 1, 10_000, 10, "Replays before review.")
@seconds_option("--timeout", 0, 86_400, 60.0, "Seconds per replay.", min_open=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@database_option
def replay(
    ids: tuple[int, ...],
    all_rows: bool,
    dry_run: bool,
    app_spec: str | None,
    max_attempts: int,
    timeout: float,
    as_json: bool,
    database_url: str | None,
    **filters: Any,
) -> None:
    """Replay dead letters now, whenever they were due: the IDS given, or those matching
    the filters (pending and review rows only)."""
    flt = _selection(ids, all_rows, filters)
    target = load_replay_target(app_spec) if app_spec else None

    def processor(d: Database) -> ReplayProcessor:
        if target is None:
            return ReplayProcessor(
                d,
                max_attempts=max_attempts,
                timeout=timeout,
                missing_replayer="skip",
                skip_reason=NO_APP_REASON,
            )
        replayers, registry = replayers_from_app(target, d)
        return ReplayProcessor(
            d, replayers, registry=registry, max_attempts=max_attempts, timeout=timeout
        )

    if dry_run:
        _replay_preview(processor, flt, as_json, database_url)
        return
    summary = _replay_with_progress(processor, flt, as_json, database_url)
    if as_json:
        click.echo(
            _dumps(
                {
                    **summary.counts(),
                    "reasons": [
                        {"outcome": o, "reason": r, "rows": n}
                        for (o, r), n in sorted(summary.reasons.items())
                    ],
                    "reviews": [
                        {"tenant": t, "class": c, "rows": n}
                        for (t, c), n in sorted(summary.reviews.items())
                    ],
                }
            )
        )
    else:
        for table in _summary_tables(summary, f"Replay of {summary.claimed} dead letters"):
            console.print(table)
    if summary.blocked:
        raise CliError(blocked_text(summary))


def _replay_preview(
    processor: Callable[[Database], ReplayProcessor],
    flt: DlqFilter,
    as_json: bool,
    database_url: str | None,
) -> None:
    """``--dry-run``: what replaying would do, counted per plan and kind."""

    async def preview(d: Database) -> Counter[tuple[str, str]]:
        plans: Counter[tuple[str, str]] = Counter()
        async for row, plan in processor(d).preview(flt):
            plans[(plan.describe(), row.kind)] += 1
        return plans

    plans = run(preview, database_url)
    total = sum(plans.values())
    if as_json:
        click.echo(
            _dumps(
                {
                    "dry_run": True,
                    "rows": total,
                    "plans": [
                        {"plan": p, "kind": k, "rows": n} for (p, k), n in sorted(plans.items())
                    ],
                }
            )
        )
        return
    table = Table(title=f"Dry run: {total} dead letters would be replayed")
    for col in ("plan", "kind", "rows"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for (p, k), n in sorted(plans.items()):
        table.add_row(_short(p, 90), cell(k), str(n))
    console.print(table)


def _replay_with_progress(
    processor: Callable[[Database], ReplayProcessor],
    flt: DlqFilter,
    as_json: bool,
    database_url: str | None,
) -> ReplaySummary:
    """Replay the matching rows, a progress bar on a terminal's stderr."""
    err = Console(stderr=True)

    async def go(d: Database) -> ReplaySummary:
        total = await dlq_reads.count(d, flt.narrowed(("pending", "review")))
        with Progress(
            TextColumn("replaying"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            disable=as_json or not err.is_terminal,
        ) as bar:
            task = bar.add_task("replay", total=total)

            def advance(_result: ReplayResult) -> None:
                bar.advance(task)

            return await processor(d).replay_matching(flt, progress=advance)

    return run(go, database_url)


def blocked_text(summary: ReplaySummary) -> str:
    """One line for the rows a replay left unchanged because of configuration."""
    why = sorted({r for (o, r), _n in summary.reasons.items() if o == "blocked"})
    return f"{summary.blocked} dead letter(s) not replayed and left unchanged: " + "; ".join(
        why[:3]
    )


# --- resolve / ignore / purge / export ------------------------------------------------------


def _closing_command(
    name: str, past: str, doc: str, all_help: str, change: Callable[..., Awaitable[int]]
) -> click.Command:
    """``dlq resolve`` and ``dlq ignore``: ``change`` (a close of dead letters, with a
    reason) on the IDS given or the rows matching, then how many it closed (``past``)."""

    @dlq.command(name, help=doc)
    @click.argument("ids", nargs=-1, type=ROW_ID)
    @filter_options
    @click.option("--all", "all_rows", is_flag=True, help=all_help)
    @click.option("--reason", default=f"{past} by operator", show_default=True)
    @database_option
    def command(
        ids: tuple[int, ...], all_rows: bool, reason: str, database_url: str | None, **filters: Any
    ) -> None:
        flt = _selection(ids, all_rows, filters)
        n = run(lambda d: change(d, flt, reason=reason, now=utcnow()), database_url)
        click.echo(f"{n} dead letter{'s' if n != 1 else ''} {past}")

    return command


resolve = _closing_command(
    "resolve",
    "resolved",
    "Mark dead letters resolved (fixed by hand): the IDS given, or those matching.",
    "Every row not resolved yet.",
    dlq_replay.resolve_matching,
)
ignore = _closing_command(
    "ignore",
    "ignored",
    "Mark pending and review dead letters ignored, with a reason.",
    "Every pending and review row.",
    dlq_replay.ignore_matching,
)


@dlq.command("purge")
@click.option("--older-than", default="30d", show_default=True, help="Closed before this long ago.")
@database_option
def purge(older_than: str, database_url: str | None) -> None:
    """Delete resolved and ignored dead letters closed before --older-than (never pending or
    review ones), in batches."""
    age = parse_duration(older_than)
    n = run(lambda d: dlq_replay.purge(d, older_than=age, now=utcnow()), database_url)
    click.echo(f"{n} resolved or ignored dead letter{'s' if n != 1 else ''} purged")


@dlq.command("export")
@filter_options
@click.option("--output", "-o", default="-", help="File to write (default: stdout).")
@database_option
def export(output: str, database_url: str | None, **filters: Any) -> None:
    """Write matching dead letters as JSON lines (payload, history and traceback included),
    streamed in id order."""
    flt = build_filter(**filters)
    try:
        out: IO[str] = sys.stdout if output == "-" else open(output, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc}") from exc

    async def go(d: Database) -> int:
        n = 0
        async for row in dlq_reads.iter_rows(d, flt, full=True):
            out.write(_dumps(row.to_json()) + "\n")
            n += 1
        return n

    try:
        n = run(go, database_url)
    finally:
        if out is sys.stdout:
            out.flush()
        else:
            out.close()
    if output != "-":
        click.echo(f"{n} dead letter{'s' if n != 1 else ''} written to {output}", err=True)
