"""One gate: the claim (its SQL, and the room per lane it reads from the gate) takes a
lane's jobs exactly when :func:`synckit.errors.gate.gate` says the lane may run, as many
as its room, the probe marked, for any breaker, pace, probe and in-flight state, on both
engines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, update

from synckit.errors.gate import LaneFacts, gate
from synckit.store.db import Database
from synckit.store.jobs import claiming, enqueueing
from synckit.store.tables import jobs, resources

NOW = datetime(2030, 1, 1, tzinfo=UTC)
PENDING = 2

_moments = st.one_of(
    st.none(),
    st.integers(min_value=-3600, max_value=3600).map(lambda s: NOW + timedelta(seconds=s)),
)

_facts = st.builds(
    LaneFacts,
    state=st.sampled_from(["closed", "open", "half_open"]),
    cooldown_until=_moments,
    next_available_at=_moments,
    probe_in_flight=st.booleans(),
    probe_expires_at=_moments,
    max_in_flight=st.one_of(st.none(), st.integers(min_value=1, max_value=3)),
    running=st.integers(min_value=0, max_value=3),
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(facts=_facts)
async def test_the_claim_takes_what_the_gate_lets_through(db: Database, facts: LaneFacts) -> None:
    async with db.begin() as conn:
        await conn.execute(delete(jobs))
        await conn.execute(delete(resources))
    for _ in range(facts.running + PENDING):
        await enqueueing.enqueue(db, "work", {}, resource_key="lane")
    async with db.begin() as conn:
        running = (await conn.execute(jobs.select().order_by(jobs.c.id))).all()[: facts.running]
        if running:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id.in_([r.id for r in running]))
                .values(status="running", locked_by="elsewhere", claim_token=1)
            )
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == "lane")
            .values(
                state=facts.state,
                cooldown_until=facts.cooldown_until,
                next_available_at=facts.next_available_at,
                probe_job_id=running[0].id
                if facts.probe_in_flight and running
                else (10**9 if facts.probe_in_flight else None),
                probe_expires_at=facts.probe_expires_at,
                max_in_flight=facts.max_in_flight,
            )
        )
    decided = gate(facts, NOW)

    claimed = await claiming.claim(db, "w", 5, now=NOW)

    room = PENDING if decided.room is None else decided.room
    expected = min(PENDING, room) if decided.open else 0
    assert len(claimed) == expected, (decided, claimed)
    assert all(j.probe == decided.probe for j in claimed)
    if decided.probe and claimed:
        async with db.begin() as conn:
            row = (
                await conn.execute(resources.select().where(resources.c.resource_key == "lane"))
            ).one()
        assert row.state == "half_open" and row.probe_job_id == claimed[0].id
