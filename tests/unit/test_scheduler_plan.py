"""The scheduler's decision for a tenant it has not seen as it is now (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from synckit.connectors.schedule import parse_schedule
from synckit.runtime.sync.poll import poll_key
from synckit.runtime.sync.scheduler import marker_of, plan_ticks

STATUSES = st.sampled_from(["active", "paused", "needs_reauth"])
SCHEDULES = st.sampled_from([None, "every 5m", "every 1h", "0 3 * * *"])
SEEN = st.one_of(st.none(), st.just("-"), SCHEDULES.map(lambda s: s or ""))
NOW = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)
STREAMS = [("a", parse_schedule("every 5m")), ("b", parse_schedule("0 3 * * *"))]


@given(status=STATUSES, schedule=SCHEDULES, seen=SEEN, now=NOW)
def test_plan_marks_what_was_seen_and_ticks_only_when_polling_changes(
    status: str, schedule: str | None, seen: str | None, now: datetime
) -> None:
    """The marker is what SQL's UNSCHEDULED compares; new and resumed tenants are due now,
    a new schedule starts after now, pausing keeps the ticks."""
    plan = plan_ticks(
        tenant="acme", status=status, schedule=schedule, seen=seen, streams=STREAMS, now=now
    )
    assert plan.marker == marker_of(status, schedule)
    assert plan.marker == ((schedule or "") if status == "active" else "-")
    ticks = dict(plan.ticks)
    if seen is None or (status == "active" and seen == "-"):
        assert ticks == {"a": now, "b": now}
    elif status != "active":
        assert ticks == {}
    else:
        assert set(ticks) == {"a", "b"}
        for name, sched in STREAMS:
            assert ticks[name] == sched.next_after(now, poll_key("acme", name))
            assert now < ticks[name] <= now + timedelta(days=1)
