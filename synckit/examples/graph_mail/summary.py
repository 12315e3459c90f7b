"""The summary of a ``synckit demo`` run (:func:`summarise`): every figure from the tables
the worker wrote, the simulator's counters and the wire, as the dict ``--json`` prints
and :func:`~synckit.examples.graph_mail.report.render_summary` draws."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rich.text import Text

from synckit.examples.graph_mail.plan import (
    APP_SPEC,
    DB_URL,
    KEY_FILE,
    PLANS,
    Snapshot,
    Story,
    landed_ids,
    read_snapshot,
    resource_tenant,
    well_formed,
)
from synckit.examples.graph_mail.reads import DemoReader, summary_rows
from synckit.examples.graph_mail.report import short
from synckit.examples.graph_mail.wire import Wire, retry_after_report

if TYPE_CHECKING:
    from synckit.examples.graph_mail.simulator import GraphSimulator

__all__ = ["next_commands", "summarise"]


def summarise(
    reader: DemoReader,
    example: ModuleType,
    sim: GraphSimulator,
    wire: Wire,
    story: Story,
    enqueued: dict[str, list[str]],
    elapsed: float,
    unmet: list[str],
    db_path: Path,
) -> dict[str, Any]:
    """What happened, as the dict ``--json`` prints and :func:`render_summary` draws:
    every figure from the tables the worker wrote, the simulator's counters and the wire."""
    final = read_snapshot(reader, landed_ids)
    rows = reader.read(summary_rows)
    intents = {(r.tenant, r.intent_key): r for r in rows.intents}
    return {
        "converged": not unmet,
        "unmet": unmet,
        "elapsed_seconds": round(elapsed, 1),
        "database_url": DB_URL,
        "database_path": str(db_path),
        "tenants": _tenant_rows(rows, final, sim, enqueued, intents),
        "retry_reasons": [
            {"tenant": t, "error_class": cls, "reason": reason, "count": n}
            for (t, cls, reason), n in sorted(_retry_reasons(rows.jobs).items())
        ],
        "retry_after": retry_after_report(wire.calls),
        "breakers": [
            {
                "resource_key": r.resource_key,
                "tenant": resource_tenant(r.resource_key),
                "opened": len(story.openings.get(resource_tenant(r.resource_key), ())),
                "state": r.state,
                "last_error_class": r.last_error_class,
            }
            for r in rows.breakers
        ],
        "needs_reauth": _needs_reauth(
            final, sim, Counter(str(k) for k in rows.unfinished_resources)
        ),
        "dead_letters": [
            {
                "tenant": r.tenant,
                "kind": r.kind,
                "record_id": r.record_id,
                "error_class": r.error_class,
                "status": r.status,
                "attempts": r.attempt_count,
                "error": short(r.error_message, 200),
            }
            for r in rows.dead_letters
        ],
        "sent": _sent(example, sim, enqueued, intents),
        "lost_responses": sum(sim.stats.lost_sends[p.tenant] for p in PLANS),
        "events": [
            {"at": round(at, 1), "text": Text.from_markup(t).plain} for at, t in story.events
        ],
        "next_commands": next_commands(False),
    }


def _found(row: Any) -> bool:
    """An intent whose create's answer was lost and whose resource was found by its id."""
    return row is not None and isinstance(row.result, dict) and "id" in row.result


def _retry_reasons(job_rows: Any) -> Counter[tuple[str, str, str]]:
    """(tenant, error class, reason) of every retried attempt the jobs recorded."""
    reasons: Counter[tuple[str, str, str]] = Counter()
    for r in job_rows:
        tenant = r.payload.get("tenant") if isinstance(r.payload, dict) else None
        if not tenant:
            continue
        for e in r.errors or []:
            reasons[(str(tenant), str(e.get("error_class")), short(str(e.get("message", ""))))] += 1
    return reasons


def _tenant_rows(
    rows: Any,
    final: Snapshot,
    sim: GraphSimulator,
    enqueued: dict[str, list[str]],
    intents: dict[tuple[str, str], Any],
) -> list[dict[str, Any]]:
    audit: dict[str, dict[str, int]] = defaultdict(lambda: {"ok": 0, "failed": 0})
    for r in rows.audit:
        audit[r.tenant]["ok"] += int(r.ok)
        audit[r.tenant]["failed"] += int(r.failed)
    jobs_ok: Counter[str] = Counter(
        str(r.payload["tenant"])
        for r in rows.jobs
        if isinstance(r.payload, dict) and r.payload.get("tenant") and r.status == "succeeded"
    )
    stats = sim.stats
    out = []
    for plan in PLANS:
        t = plan.tenant
        status, reason = final.status.get(t, ("?", None))
        out.append(
            {
                "tenant": t,
                "role": plan.role,
                "status": status,
                "status_reason": reason,
                "breaker": final.breaker.get(t, ("?", None))[0],
                "synced": len(final.synced.get(t, ())),
                "in_mailbox": len(well_formed(sim, t)),
                "malformed": len(sim.mailbox(t).malformed_ids),
                "dead_letters": final.dlq[t],
                "checkpoint": _cursor_kind(final.cursor.get(t)),
                "requests": stats.requests[t],
                "throttled_429": stats.throttled[t],
                "server_errors_503": stats.server_errors[t],
                "retries": dict(sorted(final.retried.get(t, Counter()).items())),
                "token_refreshes": stats.token_refreshes[t],
                "token_refusals": sum(
                    n for k, n in stats.token_errors.items() if k.startswith(f"{t}:")
                ),
                "full_syncs": stats.full_syncs[t],
                "expired_delta_tokens": stats.expired_delta_tokens[t],
                "audit": dict(audit[t]),
                "jobs_succeeded": jobs_ok[t],
                "records_handled": audit[t]["ok"] - jobs_ok[t],
                "sends": {
                    "enqueued": len(enqueued[t]),
                    "done": final.sends_done[t],
                    "lost_responses": stats.lost_sends[t],
                    "found_after_lost_response": sum(
                        1 for key in enqueued[t] if _found(intents.get((t, key)))
                    ),
                    "send_calls": stats.sends[t],
                },
            }
        )
    return out


def _sent(
    example: ModuleType,
    sim: GraphSimulator,
    enqueued: dict[str, list[str]],
    intents: dict[tuple[str, str], Any],
) -> list[dict[str, Any]]:
    """Each send the demo enqueued: its intent, and its copies in Sent Items."""
    sent = []
    for plan in PLANS:
        for key in enqueued[plan.tenant]:
            row = intents.get((plan.tenant, key))
            imid = example.internet_message_id(plan.tenant, key)
            sent.append(
                {
                    "tenant": plan.tenant,
                    "key": key,
                    "internet_message_id": imid,
                    "intent_status": row.status if row is not None else None,
                    "intent_attempts": row.attempts if row is not None else 0,
                    "found_after_lost_response": _found(row),
                    "copies_in_sent_items": len(sim.find_sent(plan.tenant, imid)),
                }
            )
    return sent


def _needs_reauth(
    final: Snapshot, sim: GraphSimulator, waiting: Counter[str]
) -> list[dict[str, Any]]:
    """The tenants that need re-authorising, with the work waiting for them."""
    return [
        {
            "tenant": t,
            "reason": reason,
            "jobs_waiting": waiting.get(f"graph_mail:{t}", 0),
            "messages_not_synced": len(well_formed(sim, t) - final.synced.get(t, set())),
        }
        for t, (status, reason) in sorted(final.status.items())
        if status == "needs_reauth"
    ]


def next_commands(kept_key: bool) -> list[str]:
    """What to run on the demo's database afterwards; the console last, with its App (so
    "sync now", record replays and re-authorising work) and, when the demo made the key,
    the key read from the file it kept."""
    key = f"SYNCKIT_SECRET_KEY=$(cat {KEY_FILE}) " if kept_key else ""
    return [
        f"synckit status --database-url {DB_URL}",
        f"synckit dlq ls --database-url {DB_URL}",
        f"synckit tenants ls --database-url {DB_URL}",
        f"{key}synckit web --app {APP_SPEC} --database-url {DB_URL}",
    ]


def _cursor_kind(cursor: Any) -> str | None:
    if isinstance(cursor, dict):
        for kind in ("deltaLink", "nextLink"):
            if cursor.get(kind):
                return kind
    return None
