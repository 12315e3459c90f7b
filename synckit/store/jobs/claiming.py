"""Claiming jobs, fairly across lanes.

Claiming is fair across *lanes*. A lane is a resource key (a tenant's connection, say);
jobs without a key share one more lane. A claim picks the lanes that have due work and
whose resource is available (breaker not open, ``next_available_at`` passed, connection
active), least recently served first, and takes at most an even share of the batch from
each, bounded by the resource's ``max_in_flight``. A tenant with a backlog of 100,000 jobs
therefore delays another tenant by at most one claim batch. On PostgreSQL the lane rows and
the job rows are locked with ``FOR UPDATE SKIP LOCKED``, so concurrent workers never wait
on each other and never claim one job twice; on SQLite the claim runs in one
``BEGIN IMMEDIATE`` transaction, which SQLite serialises.

Every claim stamps its rows with a fresh ``claim_token``; completing checks it, so a
handler that outlived its lease cannot overwrite what happened after the rescue (fencing).

An attempt is charged when a job *starts* (:func:`start_many`, or at claim for the
jobs the worker starts at once), not when it is claimed ahead: a claimed job that has not
started has ``started_at`` NULL and a short lease, and a rescue gives it back to others
with its attempts unchanged.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import structlog
from sqlalchemy import (
    Integer,
    Row,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection

from synckit.clock import utcnow
from synckit.errors.breaker import BreakerPolicy, BreakerSnapshot, BreakerState, breaker_claim_probe
from synckit.errors.gate import LaneFacts, gate
from synckit.store import leases
from synckit.store import resources as lanes
from synckit.store.db import Database
from synckit.store.jobs._base import JOB_LEASE, PENDING, RUNNING, START_LEASE, ClaimedJob
from synckit.store.jobs.outcomes import start_many_sync
from synckit.store.moments import (
    MOMENT_HI,
    MOMENT_LO,
    OUT_OF_RANGE_SQL,
    from_row,
    guarded_moment,
    read_moment,
    read_payload,
)
from synckit.store.tables import connections, jobs, resources

_log = structlog.get_logger("synckit.jobs")


def _later(col: Any, now: Any) -> Any:
    """SQL: the timestamp ``col`` is set, readable and after ``now``. A value no datetime
    can hold ('garbage' on SQLite, year 20000 on PostgreSQL) reads as None everywhere
    (:func:`read_moment`), so here too it holds nothing back."""
    return and_(col.is_not(None), col > now, col <= literal_column(MOMENT_HI))


def _breaker_denies(r: Any, now: Any) -> Any:
    """SQL: the row ``r``'s breaker holds it (:func:`~synckit.errors.gate.gate`'s
    ``breaker`` and ``probe`` holds; a property test holds the claim and the gate
    together on both engines)."""
    return or_(
        and_(r.c.state == "open", _later(r.c.cooldown_until, now)),
        and_(
            r.c.state == "half_open",
            r.c.probe_job_id.is_not(None),
            _later(r.c.probe_expires_at, now),
        ),
    )


def _resource_blocked(r: Any, now: Any) -> Any:
    """SQL: the gate holds the resource row ``r`` until a moment (pacing, an open
    breaker, a live probe): :func:`~synckit.errors.gate.gate` for the database."""
    # Every term is NULL-safe, so that NOT (...) means "available" and never "unknown".
    return or_(_later(r.c.next_available_at, now), _breaker_denies(r, now))


@dataclass(frozen=True)
class Unreadable:
    """A claimed job whose row cannot be read: it is quarantined, not handed out."""

    id: int
    reason: str


# What a claim returns of each job: the fields of a ClaimedJob. The payload comes back as
# text and the run time guarded, both parsed per row (:func:`_claimed`), so one row that
# cannot be read is quarantined instead of failing every claim.
_CLAIMED_COLUMNS = (
    jobs.c.id,
    jobs.c.kind,
    # As text: the PostgreSQL driver decodes JSONB itself, where one bad row would fail all.
    cast(jobs.c.payload, Text).label("payload"),
    jobs.c.resource_key,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.priority,
    jobs.c.trace_id,
    jobs.c.trace_parent,
    guarded_moment(jobs.c.run_at),
)
_PG_CLAIMED_SQL = (
    "jobs.id, jobs.kind, CAST(jobs.payload AS text) AS payload, jobs.resource_key,"
    " jobs.attempts, jobs.max_attempts, jobs.priority, jobs.trace_id, jobs.trace_parent,"
    f" CASE WHEN jobs.run_at >= {MOMENT_LO} AND jobs.run_at"
    f" <= {MOMENT_HI} THEN jobs.run_at ELSE {OUT_OF_RANGE_SQL} END AS run_at"
)


def _claim_statement(keyed: bool) -> Any:
    """The claim of one lane, built once: parameters ``now``, ``lim``, ``lane``, ``worker``,
    ``token``, ``until`` (the lease's end), ``charge`` (1 when the claimed jobs start now,
    else 0) and ``started`` (``now`` or NULL). Prebuilt so that a claim costs no SQL
    construction or cache-key computation, only execution. The locked ids are taken once
    and the jobs found by primary key (:func:`~synckit.store.leases.picked`)."""
    lane_cond = jobs.c.resource_key == bindparam("lane") if keyed else jobs.c.resource_key.is_(None)
    lane_jobs = (
        select(jobs.c.id)
        .where(jobs.c.status == PENDING, jobs.c.run_at <= bindparam("now"), lane_cond)
        .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(bindparam("lim", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    return _claiming(leases.picked(jobs.c.id, lane_jobs))


def _claiming(which: Any) -> Any:
    """The claim's UPDATE of the jobs ``which`` selects (parameters as for
    :func:`_claim_statement`), returning the claimed columns."""
    return (
        update(jobs)
        .where(which)
        .values(
            status="running",
            attempts=jobs.c.attempts + bindparam("charge", type_=Integer),
            **JOB_LEASE.holding(bindparam("token"), bindparam("until"), bindparam("worker")),
            heartbeat_at=bindparam("now"),
            started_at=bindparam("started", type_=jobs.c.started_at.type),
            updated_at=bindparam("now"),
        )
        .returning(*_CLAIMED_COLUMNS)
    )


_CLAIM_KEYED = _claim_statement(keyed=True)
_CLAIM_UNKEYED = _claim_statement(keyed=False)


def _claim_ones_statement() -> Any:
    """SQLite: the claim of one job in each of many lanes (``lanes``, a JSON array of
    keys), in one statement: each lane's first due job by the per-lane claim's order and
    index. Other parameters as for :func:`_claim_statement`. A claim over many tenants
    asks one job of most lanes; a statement per lane was ~10% of a SQLite worker's CPU
    (``bench.tenants``)."""
    lane = func.json_each(bindparam("lanes")).table_valued("value").alias("lane")
    j = jobs.alias("j")
    first = (
        select(j.c.id)
        .where(
            j.c.status == PENDING, j.c.resource_key == lane.c.value, j.c.run_at <= bindparam("now")
        )
        .order_by(j.c.priority.desc(), j.c.run_at, j.c.id)
        .limit(1)
        .scalar_subquery()
    )
    return _claiming(jobs.c.id.in_(select(first).select_from(lane)))


_CLAIM_ONES_SQLITE = _claim_ones_statement()


def _claim_lane_rows(
    conn: Connection,
    *,
    lane: str | None,
    limit: int,
    now: datetime,
    worker_id: str,
    token: int,
    terms: dict[str, Any],
) -> list[Row[Any]]:
    params = {"now": now, "lim": limit, "worker": worker_id, "token": token, **terms}
    if lane is None:
        return list(conn.execute(_CLAIM_UNKEYED, params))
    return list(conn.execute(_CLAIM_KEYED, {**params, "lane": lane}))


def _lanes_statement() -> Any:
    """Lanes marked due whose resource allows a call now, least recently claimed first.

    The marked lanes are walked in fairness order through ``ix_resources_lanes`` (a partial
    index on ``last_claimed_at`` of the rows with a ``due_at``), so the LIMIT stops the walk
    early: the connection, parent and in-flight checks run per row walked, never over
    every lane. A lane whose mark is stale is returned and costs one empty look.

    Built once (parameters ``now`` and ``lim``): building it per claim cost more than
    running it.
    """
    now = bindparam("now", type_=jobs.c.run_at.type)
    parent = resources.alias("parent")
    running = (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.status == RUNNING, jobs.c.resource_key == resources.c.resource_key)
        .scalar_subquery()
    )
    # OFFSET 0 keeps PostgreSQL from turning these checks into anti-joins: it expects few
    # blocked parents and inactive connections, so it would scan every resource and every
    # connection once per claim to find them. As subplans they are one index probe per
    # lane walked (the primary key, ix_connections_resource_key).
    parent_blocked = (
        select(literal_column("1"))
        .where(parent.c.resource_key == resources.c.parent_key, _resource_blocked(parent, now))
        .offset(literal_column("0"))
        .exists()
    )
    conn_inactive = (
        select(literal_column("1"))
        .where(
            connections.c.resource_key == resources.c.resource_key,
            connections.c.status != "active",
        )
        .offset(literal_column("0"))
        .exists()
    )
    return (
        select(
            resources.c.resource_key,
            resources.c.state,
            resources.c.cooldown_until,
            resources.c.max_in_flight,
            # Only a capped lane needs its running jobs counted.
            case((resources.c.max_in_flight.is_not(None), running)).label("running"),
        )
        .where(
            resources.c.due_at <= now,
            ~_resource_blocked(resources, now),
            ~parent_blocked,
            ~conn_inactive,
        )
        # Never-claimed lanes first: NULLS FIRST, as ix_resources_lanes is ordered.
        .order_by(resources.c.last_claimed_at.asc().nulls_first())
        .limit(bindparam("lim", type_=Integer))
        .with_for_update(skip_locked=True, of=resources)
    )


_LANES = _lanes_statement()


# PostgreSQL: many lanes' claims in one statement (and one round trip), each lane its own
# LIMIT under FOR UPDATE SKIP LOCKED. With a thousand tenants a claim used to cost a
# round trip per lane. The locked ids are an ARRAY(SELECT ...), run once as an init plan,
# and the jobs updated through their primary key, as one lane's claim (leases.picked
# says why). As ``jobs.id IN (SELECT ...)`` the locking LATERAL could be run again for
# every row of jobs, which right after a bulk enqueue spun one claim for minutes; as a
# join with a CTE of the ids, the planner, expecting thousands of them, hashed a scan of
# every row of jobs.
_CLAIM_LANES_PG: Any = (
    text(
        "UPDATE jobs SET status = 'running', attempts = jobs.attempts + :charge, "
        + JOB_LEASE.holding_sql(":token", ":until", ":worker")
        + ", heartbeat_at = :now, started_at = :started, updated_at = :now"
        " WHERE jobs.id = ANY(ARRAY(SELECT p.id FROM unnest(CAST(:lanes AS varchar[]),"
        " CAST(:wants AS int[])) AS l(key, want) CROSS JOIN LATERAL (SELECT j.id FROM jobs j"
        " WHERE j.status = 'pending' AND j.resource_key = l.key AND j.run_at <= :now"
        " ORDER BY j.priority DESC, j.run_at, j.id LIMIT l.want FOR UPDATE SKIP LOCKED)"
        " AS p)) RETURNING " + _PG_CLAIMED_SQL
    )
    .bindparams(
        bindparam("now", type_=jobs.c.run_at.type),
        bindparam("until", type_=jobs.c.run_at.type),
        bindparam("started", type_=jobs.c.started_at.type),
        bindparam("charge", type_=Integer),
    )
    .columns(
        *_CLAIMED_COLUMNS[:2],
        column("payload", Text),
        *_CLAIMED_COLUMNS[3:-1],
        column("run_at", Text),
    )
)


def _claim_lanes(
    conn: Connection,
    wants: Sequence[tuple[str | None, int]],
    *,
    now: datetime,
    worker_id: str,
    token: int,
    terms: dict[str, Any],
) -> dict[str | None, list[Row[Any]]]:
    """Claim up to ``want`` due jobs of each lane; the rows claimed, per lane."""
    got: dict[str | None, list[Row[Any]]] = {key: [] for key, _ in wants}
    keyed = [(k, w) for k, w in wants if k is not None]
    batched = conn.dialect.name == "postgresql" and len(keyed) > 1
    if batched:
        params = {
            "now": now,
            **terms,
            "worker": worker_id,
            "token": token,
            "lanes": [k for k, _ in keyed],
            "wants": [w for _, w in keyed],
        }
        for row in conn.execute(_CLAIM_LANES_PG, params):
            got[row.resource_key].append(row)
        # RETURNING has no order: each lane's jobs in claim order, as one lane's claim.
        for rows in got.values():
            rows.sort(key=lambda r: (-r.priority, r.run_at, r.id))
    # SQLite: the lanes asked for one job each in one statement, the others one by one.
    one_each: set[str] = set()
    ones = [k for k, w in keyed if w == 1] if conn.dialect.name == "sqlite" else []
    if len(ones) > 1:
        params = {"now": now, "worker": worker_id, "token": token, **terms}
        for row in conn.execute(_CLAIM_ONES_SQLITE, {**params, "lanes": json.dumps(ones)}):
            got[row.resource_key].append(row)
        one_each = set(ones)
    for key, want in wants:
        if key is None or (not batched and key not in one_each):
            # SQLite: in-process statements, one per lane (but one for the one-job lanes)
            got[key] = _claim_lane_rows(
                conn, lane=key, limit=want, now=now, worker_id=worker_id, token=token, terms=terms
            )
    return got


def _available_lanes(conn: Connection, now: datetime, max_lanes: int) -> list[Row[Any]]:
    return list(conn.execute(_LANES, {"now": now, "lim": max_lanes}))


async def claim(
    db: Database,
    worker_id: str,
    limit: int,
    *,
    now: datetime | None = None,
    lease: timedelta = timedelta(seconds=60),
    start: int | None = None,
    start_lease: timedelta = START_LEASE,
    breaker_policy: BreakerPolicy | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` due jobs for ``worker_id``, fairly across lanes.

    Each claimed job is ``running`` with a fresh claim token. The first ``start`` of them
    (all when None) start now: their attempt is charged and their lease runs until
    ``now + lease``. The others are claimed ahead: attempt not charged, lease until
    ``now + start_lease``, until :func:`start_many` starts them. A resource whose breaker
    waits for a probe gives exactly one job, marked ``probe``, and the probe is presumed
    lost after ``breaker_policy.probe_timeout``.
    """
    if limit <= 0:
        return []
    now = now or utcnow()
    token = secrets.randbits(62)
    claimed, unreadable = await db.write(
        _claim_sync,
        worker_id,
        limit,
        now,
        lease,
        token,
        limit if start is None else max(0, start),
        start_lease,
        breaker_policy or BreakerPolicy(),
    )
    for u in unreadable:
        _log.warning("job.unreadable", job_id=u.id, reason=u.reason, status="dead")
    return claimed


def _claim_sync(
    conn: Connection,
    worker_id: str,
    limit: int,
    now: datetime,
    lease: timedelta,
    token: int,
    start: int,
    start_lease: timedelta,
    policy: BreakerPolicy,
) -> tuple[list[ClaimedJob], list[Unreadable]]:
    # Every job the claim may return starts now: charged in the claim statement itself.
    # Otherwise all are claimed ahead, and the first ``start`` are started below.
    all_start = start >= limit
    terms: dict[str, Any] = {
        "until": now + (lease if all_start else start_lease),
        "charge": 1 if all_start else 0,
        "started": now if all_start else None,
    }
    claimed: list[ClaimedJob] = []
    unreadable: list[Unreadable] = []
    room_of, probes, room_state = _rooms(_available_lanes(conn, now, max_lanes=limit), now)
    served: set[str] = set()
    # Lanes that gave fewer jobs than asked: no due job left there now.
    short: set[str] = set()
    # Even shares first; lanes that filled their share split what is left, and so on.
    open_lanes = [k for k, room in room_of.items() if room is None or room > 0]
    while open_lanes and len(claimed) + len(unreadable) < limit:
        wants = _wants(open_lanes, room_of, limit - len(claimed) - len(unreadable))
        got = _claim_lanes(conn, wants, now=now, worker_id=worker_id, token=token, terms=terms)
        still_open: list[str | None] = []
        for key, want in wants:
            rows = got[key]
            cap = room_of[key]
            if key is not None and len(rows) < want:
                short.add(key)
            if not rows:
                continue
            probe = key in probes
            if key is not None:
                served.add(key)
                if probe:
                    held = BreakerSnapshot(state=BreakerState(room_state[key]))
                    taken = breaker_claim_probe(held, now, policy)
                    lanes.claim_probe_sync(conn, key, taken, job_id=rows[0].id, now=now)
            for r in rows:
                job = _claimed(r, token, probe, all_start)
                if isinstance(job, Unreadable):
                    unreadable.append(job)
                else:
                    claimed.append(job)
            if cap is not None:
                room_of[key] = cap - len(rows)
            if len(rows) == want and not probe and (cap is None or cap > len(rows)):
                still_open.append(key)
        open_lanes = still_open
    lanes.after_claim(conn, served, short, now)
    if unreadable:
        _quarantine(conn, unreadable, token, now)
    if not all_start and start and claimed:
        _start_first(conn, claimed, start, token, now, lease)
    return claimed, unreadable


def _rooms(
    lanes_rows: Sequence[Row[Any]], now: datetime
) -> tuple[dict[str | None, int | None], set[str], dict[str, str]]:
    """Room per lane, as the gate says: 1 for a breaker probe, else what max_in_flight
    leaves (None: no cap); the lanes that give a probe; each lane's breaker state. The
    lanes' SQL has already left out those held until a moment (the same gate, written for
    the database), so only the state and the in-flight count are read here."""
    room_of: dict[str | None, int | None] = {}
    probes: set[str] = set()
    states: dict[str, str] = {}
    for r in lanes_rows:
        states[r.resource_key] = r.state
        g = gate(LaneFacts(r.state, max_in_flight=r.max_in_flight, running=r.running or 0), now)
        room_of[r.resource_key] = g.room
        if g.probe:
            probes.add(r.resource_key)
    room_of[None] = None  # the lane of jobs without a resource key
    return room_of, probes, states


def _wants(
    open_lanes: Sequence[str | None], room_of: Mapping[str | None, int | None], budget: int
) -> list[tuple[str | None, int]]:
    """One round's wants: an even share of ``budget`` for each open lane, within the
    batch and each lane's cap."""
    share = max(1, math.ceil(budget / len(open_lanes)))
    wants: list[tuple[str | None, int]] = []
    for key in open_lanes:
        if budget <= 0:
            break
        cap = room_of[key]
        want = min(share, budget, cap if cap is not None else budget)
        wants.append((key, want))
        budget -= want
    return wants


def _start_first(
    conn: Connection,
    claimed: list[ClaimedJob],
    start: int,
    token: int,
    now: datetime,
    lease: timedelta,
) -> None:
    """Charge the first ``start`` claimed jobs, which the worker starts at once, in the
    claim's own transaction (``claimed`` is updated in place)."""
    first = claimed[:start]
    marked = start_many_sync(conn, [(j.id, token) for j in first], now=now, lease=lease)
    claimed[: len(first)] = [
        replace(j, attempts=j.attempts + 1, started=True) if j.id in marked else j for j in first
    ]


def _claimed(r: Row[Any], token: int, probe: bool, started: bool) -> ClaimedJob | Unreadable:
    try:
        payload = read_payload(r.payload)
    except ValueError as exc:
        return Unreadable(r.id, str(exc))
    try:
        run_at = read_moment(r.run_at)
    except ValueError as exc:
        return Unreadable(r.id, f"run_at: {exc}")
    assert run_at is not None  # NOT NULL
    return from_row(
        ClaimedJob,
        r,
        payload=payload,
        run_at=run_at,
        claim_token=token,
        probe=probe,
        started=started,
    )


_QUARANTINE: Any = (
    update(jobs)
    .where(jobs.c.id == bindparam("job_id"), leases.held(jobs, bindparam("token"), JOB_LEASE))
    .values(
        status="dead",
        last_error=bindparam("reason"),
        error_class="validation",
        **JOB_LEASE.released(),
        finished_at=bindparam("now"),
        updated_at=bindparam("now"),
    )
)


def _quarantine(conn: Connection, bad: Sequence[Unreadable], token: int, now: datetime) -> None:
    """Jobs whose row cannot be read end dead, in the claim's transaction, naming why
    (no dead letter: what it would hold is what cannot be read)."""
    conn.execute(
        _QUARANTINE,
        [
            {"job_id": u.id, "token": token, "reason": f"unreadable row: {u.reason}", "now": now}
            for u in bad
        ],
    )


# --- outcomes -----------------------------------------------------------------------


class ClaimStore(Protocol):
    """The operation the worker's claim loop takes jobs with: this module is one
    (:func:`claim`); a unit test's in-memory fake is another."""

    async def claim(
        self,
        db: Database,
        worker_id: str,
        limit: int,
        *,
        now: datetime | None = None,
        lease: timedelta = ...,
        start: int | None = None,
        start_lease: timedelta = ...,
        breaker_policy: BreakerPolicy | None = None,
    ) -> list[ClaimedJob]: ...


__all__ = [
    "ClaimStore",
    "Unreadable",
    "claim",
]
