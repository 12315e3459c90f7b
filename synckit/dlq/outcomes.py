"""What a replay run made of each row, and the writing of it.

The replay phase (:mod:`synckit.dlq.replay`) runs no SQL of its own while replays run:
it ends with a :class:`Verdict` per row, and :func:`record` writes the verdicts of a
batch in one transaction, each fenced by the batch's lease token, so a row that was
re-captured, resolved or ignored meanwhile keeps its newer state (``skipped``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from synckit.errors.exceptions import PayloadError
from synckit.store.db import Conn, Database
from synckit.store.dead_letters import replay as store
from synckit.store.dead_letters.replay import ReplayError
from synckit.store.dead_letters.rows import DeadLetter
from synckit.store.jobs import enqueueing as jobs

Outcome = Literal[
    "resolved", "not_rerun", "retry", "review", "ignored", "deferred", "skipped", "blocked"
]
OUTCOMES: tuple[Outcome, ...] = (
    "resolved",
    "not_rerun",
    "retry",
    "review",
    "ignored",
    "deferred",
    "skipped",
    "blocked",
)
#: How long a row without a replayer waits when the processor is told to skip such rows.
SKIP_WAIT = timedelta(hours=1)
_FENCED = "changed while replaying (re-captured, resolved or ignored)"


@dataclass(frozen=True)
class ReplayResult:
    """What became of one row in a replay run."""

    id: int
    tenant: str
    kind: str
    outcome: Outcome
    reason: str = ""
    error_class: str | None = None


@dataclass
class Verdict:
    """The replay phase's verdict on one row, before it is written."""

    row: DeadLetter
    action: Literal[
        "resolve",
        "resolve_job",
        "not_rerun",
        "enqueue",
        "retry",
        "review",
        "ignore",
        "skip",
        "blocked",
    ]
    reason: str = ""
    error: ReplayError | None = None
    next_retry_at: datetime | None = None
    replayed: bool = True


async def record(
    db: Database,
    verdicts: list[Verdict],
    *,
    token: str,
    originals: dict[int, DeadLetter],
    now: datetime,
) -> list[ReplayResult]:
    """Write ``verdicts`` in one transaction under the lease ``token``; one result each.

    ``originals`` are the rows of an operator's replay as they were before the claim: a
    blocked one is given back as it was, where an automatic one waits :data:`SKIP_WAIT`.
    """
    async with db.begin() as conn:
        rec = _Recorder(conn, token, now, originals)
        await rec.resolve_replayed([v for v in verdicts if v.action == "resolve"])
        for v in verdicts:
            if v.action != "resolve":
                await rec.write(v)
    return rec.results


class _Recorder:
    """The writes of one batch's verdicts, each fenced by its lease, and their results."""

    def __init__(
        self, conn: Conn, token: str, now: datetime, originals: dict[int, DeadLetter]
    ) -> None:
        self.conn, self.token, self.now, self.originals = conn, token, now, originals
        self.results: list[ReplayResult] = []

    def result(
        self,
        v: Verdict,
        outcome: Outcome,
        reason: str | None = None,
        ok: bool = True,
        error_class: str | None = None,
    ) -> None:
        """``v``'s result, or ``skipped`` when the write found the row changed (not ok)."""
        if error_class is None and v.error is not None:
            error_class = v.error.error_class
        if not ok:
            outcome, reason = "skipped", _FENCED
        row = v.row
        shown = v.reason if reason is None else reason
        self.results.append(ReplayResult(row.id, row.tenant, row.kind, outcome, shown, error_class))

    async def resolve_replayed(self, verdicts: list[Verdict]) -> None:
        """Successful replays, one statement per reason."""
        by_reason: dict[str, list[Verdict]] = {}
        for v in verdicts:
            by_reason.setdefault(v.reason, []).append(v)
        for reason, group in by_reason.items():
            hit = set(
                await store.mark_resolved(
                    self.conn,
                    [v.row.id for v in group],
                    now=self.now,
                    reason=reason,
                    token=self.token,
                    replayed=True,
                )
            )
            for v in group:
                self.result(v, "resolved", ok=v.row.id in hit)

    async def write(self, v: Verdict) -> None:
        conn, row, now, token = self.conn, v.row, self.now, self.token
        if v.action in ("resolve_job", "not_rerun"):
            resolved = await store.mark_resolved(
                conn,
                [row.id],
                now=now,
                reason=v.reason,
                token=token,
                replayed=v.replayed,
                next_retry_at=v.next_retry_at,
            )
            outcome: Outcome = "resolved" if v.action == "resolve_job" else "not_rerun"
            self.result(v, outcome, ok=bool(resolved))
        elif v.action == "enqueue":
            await self.enqueue(v)
        elif v.action == "retry":
            assert v.next_retry_at is not None
            ok = await store.schedule_retry(
                conn, row, v.next_retry_at, now=now, error=v.error, token=token
            )
            self.result(v, "retry", ok=ok)
        elif v.action == "review":
            ok = await store.mark_review(
                conn, row, v.reason, now=now, error=v.error, token=token, replayed=v.replayed
            )
            fallback = row.error_class if ok and v.error is None else None
            self.result(v, "review", ok=ok, error_class=fallback)
        elif v.action == "blocked":
            await self.give_back(v)
        elif v.action == "ignore":
            ignored = await store.mark_ignored(conn, [row.id], v.reason, now=now, token=token)
            self.result(v, "ignored", ok=bool(ignored))
        else:  # skip: leave it for later without spending an attempt
            assert v.next_retry_at is not None
            ok = await store.schedule_retry(
                conn, row, v.next_retry_at, now=now, token=token, replayed=False
            )
            self.result(v, "deferred", v.reason, ok=ok)

    async def give_back(self, v: Verdict) -> None:
        """A replay that could not run here (configuration): an operator's row goes back
        as it was; an automatic one tries again later, no attempt spent."""
        row = v.row
        if row.id in self.originals:
            ok = bool(await store.restore(self.conn, [self.originals[row.id]], token=self.token))
        else:
            ok = await store.schedule_retry(
                self.conn,
                row,
                self.now + SKIP_WAIT,
                now=self.now,
                token=self.token,
                replayed=False,
            )
        self.result(v, "blocked", ok=ok)

    async def enqueue(self, v: Verdict) -> None:
        """A dead job whose job row is gone: a new job of its kind and payload."""
        conn, row, now, token = self.conn, v.row, self.now, self.token
        if not await store.still_held(conn, row.id, token):
            self.result(v, "skipped", ok=False)
            return
        try:
            new = await jobs.enqueue(
                conn,
                row.kind,
                row.payload,
                resource_key=row.resource_key,
                trace_id=row.trace_id,
                now=now,
            )
        except PayloadError as exc:
            await store.mark_ignored(conn, [row.id], str(exc), now=now, token=token)
            self.result(v, "ignored", str(exc))
            return
        reason = f"re-enqueued as job {new.id}"
        await store.mark_resolved(
            conn, [row.id], now=now, reason=reason, token=token, replayed=True
        )
        self.result(v, "resolved", reason)
