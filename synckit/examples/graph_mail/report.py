"""The demo's summary as rich tables (:func:`render_summary`): what ``synckit demo``
prints after the run, from the summary dict the run built (the same dict ``--json``
prints)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["colour", "render_summary", "short"]


def _table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    return table


def colour(text: str, good: bool) -> str:
    return f"[green]{text}[/]" if good else f"[red]{text}[/]"


_HOST = re.compile(r"https?://[^/\s]+(/v1\.0)?")


_NEEDS_REAUTH = re.compile(r"^(NeedsReauth: )?tenant '[^']*' needs re-authorisation: ")


def short(text: str, limit: int = 90) -> str:
    """One line, without the simulator's address or the tenant's name repeated."""
    text = _NEEDS_REAUTH.sub(r"\1", _HOST.sub("", " ".join(text.split())))
    text = text.split("; run `synckit tenants reauth", 1)[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_summary(summary: dict[str, Any], out: Console) -> None:
    """The tables printed after the run."""
    out.print()
    verdict = "[green]converged[/]" if summary["converged"] else "[red]did NOT converge[/]"
    out.print(f"[bold]What happened[/] ({summary['elapsed_seconds']}s, {verdict})")
    out.print(_tenants(summary["tenants"]))
    if summary.get("change_feed"):
        out.print(_change_feed(summary["change_feed"]))
    out.print(
        _table(
            "Retries, and why (jobs.errors)",
            ("tenant", "class", "reason", "count"),
            (
                (r["tenant"], r["error_class"], r["reason"], str(r["count"]))
                for r in summary["retry_reasons"]
            ),
        )
    )
    if summary["retry_after"]["answers"]:
        out.print(_retry_after_line(summary["retry_after"]))
    out.print(
        _table(
            "Circuit breakers (resources)",
            ("resource", "times opened", "state now", "last error class"),
            (
                (b["resource_key"], str(b["opened"]), b["state"], b["last_error_class"] or "-")
                for b in summary["breakers"]
            ),
        )
    )
    out.print(
        _table(
            "Needs re-authorisation (connections)",
            ("tenant", "reason", "jobs waiting", "messages waiting"),
            (
                (
                    n["tenant"],
                    short(n["reason"] or "", 100),
                    str(n["jobs_waiting"]),
                    str(n["messages_not_synced"]),
                )
                for n in summary["needs_reauth"]
            ),
        )
    )
    out.print(_dead_letters(summary["dead_letters"]))
    _render_sends(summary, out)
    out.print()
    out.print("See for yourself:")
    for command in summary["next_commands"]:
        out.print(f"  {command}", highlight=False)


def _tenants(tenants: list[dict[str, Any]]) -> Table:
    columns = (
        "tenant", "connection", "synced", "dead letters", "requests", "429s", "503s",
        "retries", "token refreshes", "full syncs",
    )  # fmt: skip
    return _table(
        "Tenants",
        columns,
        (
            (
                row["tenant"],
                colour(row["status"], row["status"] == "active"),
                f"{row['synced']} of {row['in_mailbox']}",
                str(row["dead_letters"]),
                str(row["requests"]),
                str(row["throttled_429"]),
                str(row["server_errors_503"]),
                str(sum(row["retries"].values())),
                str(row["token_refreshes"])
                + (f" ({row['token_refusals']} refused)" if row["token_refusals"] else ""),
                str(row["full_syncs"]),
            )
            for row in tenants
        ),
    )


def _change_feed(feed: list[dict[str, Any]]) -> Table:
    return _table(
        "The app reads what changed: app.records(tenant, 'messages').changes(since=...)",
        ("tenant", "added", "updated", "deleted", "feed pages", "cursor now"),
        (
            (
                f["tenant"],
                str(f.get("added", 0)),
                str(f.get("updated", 0)),
                str(f.get("deleted", 0)),
                str(f["pages"]),
                str(f["cursor"]),
            )
            for f in feed
        ),
    )


def _retry_after_line(ra: dict[str, Any]) -> str:
    shortest = ra["shortest_wait_seconds"]
    return (
        f"Retry-After honoured: {ra['honoured']} of {ra['answers']} 429 answers asked for "
        f"{' or '.join(f'{a:g}s' for a in ra['asked_seconds'])} and got it"
        + (
            f": the tenant's next request came {shortest}s later at the soonest"
            if shortest is not None
            else ""
        )
        + (f"; [red]{ra['not_honoured']} did not[/]" if ra["not_honoured"] else "")
        + (f"; {ra['no_later_request']} had no later request" if ra["no_later_request"] else "")
        + (
            f"; {ra['requests_already_in_flight']} request(s) were already on their way"
            if ra["requests_already_in_flight"]
            else ""
        )
    )


def _dead_letters(dead: list[dict[str, Any]]) -> Table:
    return _table(
        "Dead letters (dead_letters)",
        ("tenant", "record", "class", "status", "error"),
        (
            (d["tenant"], short(d["record_id"], 20), d["error_class"], d["status"],
             short(d["error"], 70))
            for d in dead
        ),
    )  # fmt: skip


def _render_sends(summary: dict[str, Any], out: Console) -> None:
    sent = summary["sent"]
    out.print(
        _table(
            "Mail sent exactly once (intents; Sent Items)",
            ("tenant", "send", "attempts", "answer lost, found by id", "copies in Sent Items"),
            (
                (
                    s["tenant"],
                    s["key"],
                    str(s["intent_attempts"]),
                    "yes" if s["found_after_lost_response"] else "-",
                    colour(str(s["copies_in_sent_items"]), s["copies_in_sent_items"] == 1),
                )
                for s in sent
            ),
        )
    )
    out.print(
        f"{summary['lost_responses']} sendMail answers were lost; "
        f"{sum(1 for s in sent if s['copies_in_sent_items'] == 1)} of "
        f"{len(sent)} mails are in Sent Items exactly once."
    )
