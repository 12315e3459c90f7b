"""Recording outcomes: one outcome never stalls the batch; the claim's SQL is the breaker's
pure decision."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select

from synckit.errors import BreakerSnapshot, BreakerState, RetryableError, breaker_allows
from synckit.runtime.handlers import JobContext, Registry
from synckit.runtime.worker import Worker
from synckit.store import jobs as store
from synckit.store.db import Database
from synckit.store.jobs import JobSpec
from synckit.store.tables import resources


async def test_a_3_000_000_day_wait_is_clamped_and_the_batch_beside_it_records(
    db: Database,
) -> None:
    """Ten normal jobs and one asking for a 3,000,000-day wait: all recorded, the wait 24 h."""
    reg = Registry()

    @reg.handler("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    @reg.handler("huge")
    async def huge(ctx: JobContext) -> None:
        raise RetryableError("come back much later", retry_after=timedelta(days=3_000_000))

    await store.enqueue_many(db, [JobSpec("ok") for _ in range(10)] + [JobSpec("huge")])
    before = datetime.now(UTC)
    stats = await Worker(db, reg, concurrency=4).run_until_idle()
    assert (stats.succeeded, stats.retried) == (10, 1)
    [info] = await store.list_jobs(db, kind="huge")
    assert info.status == "pending" and info.attempts == 1
    assert before + timedelta(hours=23) < info.run_at <= datetime.now(UTC) + timedelta(hours=24)


async def test_an_outcome_the_database_refuses_is_recorded_as_a_failure(db: Database) -> None:
    """An error text with NUL bytes (refused by PostgreSQL) fails only its own job."""
    reg = Registry()

    @reg.handler("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    @reg.handler("nul")
    async def nul(ctx: JobContext) -> None:
        raise RuntimeError("bad \x00 byte")

    await store.enqueue_many(db, [JobSpec("ok") for _ in range(5)] + [JobSpec("nul")])
    stats = await Worker(db, reg, concurrency=2).run_until_idle()
    assert stats.succeeded == 5
    [info] = await store.list_jobs(db, kind="nul")
    assert info.status == "pending" and info.attempts == 1 and info.last_error


_moments = st.one_of(
    st.none(),
    st.integers(min_value=-3600, max_value=3600).map(
        lambda s: datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=s)
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    state=st.sampled_from(list(BreakerState)),
    cooldown_until=_moments,
    probe=st.booleans(),
    probe_expires_at=_moments,
)
async def test_the_claims_breaker_sql_is_breaker_allows(
    db: Database,
    state: BreakerState,
    cooldown_until: datetime | None,
    probe: bool,
    probe_expires_at: datetime | None,
) -> None:
    """For any stored breaker, the claim's SQL denies exactly when breaker_allows does."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    snapshot = BreakerSnapshot(
        state=state,
        cooldown_until=cooldown_until,
        probe_in_flight=probe,
        probe_expires_at=probe_expires_at,
    )
    async with db.begin() as conn:
        await conn.execute(delete(resources))
        await conn.execute(
            insert(resources).values(
                resource_key="r",
                state=state.value,
                cooldown_until=cooldown_until,
                probe_job_id=1 if probe else None,
                probe_expires_at=probe_expires_at,
                updated_at=now,
            )
        )
        denied = (await conn.execute(select(store._breaker_denies(resources, now)))).scalar()
    assert bool(denied) == (breaker_allows(snapshot, now) == "deny")


async def test_a_needs_reauth_reason_is_stored_redacted(db: Database) -> None:
    """The reason a connection needs re-authorisation passes the redaction step."""
    from synckit.errors.exceptions import NeedsReauth
    from synckit.store.tables import connections

    reg = Registry()

    @reg.handler("call")
    async def call(ctx: JobContext) -> None:
        raise NeedsReauth("refused https://api.example.com/me?access_token=tok_SEEKRIT_4242")

    now = datetime.now(UTC)
    async with db.begin() as conn:
        await conn.execute(
            insert(connections).values(
                tenant="acme",
                connector="c",
                resource_key="c:acme",
                status="active",
                created_at=now,
                updated_at=now,
            )
        )
    await store.enqueue(db, "call", {}, resource_key="c:acme")
    await Worker(db, reg, concurrency=1).run_until_idle()
    async with db.begin() as conn:
        row = (await conn.execute(select(connections.c.status, connections.c.status_reason))).one()
    assert row.status == "needs_reauth"
    assert "tok_SEEKRIT_4242" not in row.status_reason and "access_token" in row.status_reason
