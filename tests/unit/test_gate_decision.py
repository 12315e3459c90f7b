"""The gate's named cases: each hold, until when, and why (the claim is held to the same
rule by tests/integration/test_gate.py; every reason is listed, for the console)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from synckit.errors.gate import Gate, Hold, LaneFacts, gate

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
EARLIER = NOW - timedelta(minutes=5)


def test_a_closed_lane_without_limits_runs_now() -> None:
    assert gate(LaneFacts(), NOW) == Gate()
    assert gate(LaneFacts(), NOW).open and gate(LaneFacts(), NOW).why is None


def test_a_pace_holds_until_it_ends_and_no_longer() -> None:
    held = gate(LaneFacts(next_available_at=LATER), NOW)
    assert (held.open, held.until, held.why) == (False, LATER, "paced")
    assert gate(LaneFacts(next_available_at=EARLIER), NOW).open


def test_an_open_breaker_holds_for_its_cool_down_then_lets_one_probe() -> None:
    held = gate(LaneFacts(state="open", cooldown_until=LATER), NOW)
    assert (held.open, held.until, held.why) == (False, LATER, "breaker")
    over = gate(LaneFacts(state="open", cooldown_until=EARLIER, max_in_flight=1, running=3), NOW)
    assert (over.open, over.probe, over.room) == (True, True, 1)


def test_a_live_probe_holds_a_half_open_lane_until_it_expires() -> None:
    live = gate(LaneFacts(state="half_open", probe_in_flight=True, probe_expires_at=LATER), NOW)
    assert (live.open, live.until, live.why) == (False, LATER, "probe")
    lost = gate(LaneFacts(state="half_open", probe_in_flight=True, probe_expires_at=EARLIER), NOW)
    assert (lost.open, lost.probe) == (True, True)


def test_the_in_flight_limit_holds_until_a_job_ends() -> None:
    full = gate(LaneFacts(max_in_flight=2, running=2), NOW)
    assert (full.open, full.until, full.why, full.room) == (False, None, "in_flight", 0)
    assert gate(LaneFacts(max_in_flight=3, running=1), NOW).room == 2


def test_the_longest_hold_is_the_why() -> None:
    much_later = LATER + timedelta(hours=1)
    g = gate(LaneFacts(state="open", cooldown_until=LATER, next_available_at=much_later), NOW)
    assert g.holds == (Hold("breaker", LATER), Hold("paced", much_later))
    assert (g.until, g.why) == (much_later, "paced")
    tie = gate(LaneFacts(state="open", cooldown_until=LATER, next_available_at=LATER), NOW)
    assert (tie.until, tie.why) == (LATER, "breaker")


def test_every_reason_is_listed_when_several_hold() -> None:
    g = gate(LaneFacts(next_available_at=LATER, max_in_flight=1, running=1), NOW)
    assert g.holds == (Hold("paced", LATER), Hold("in_flight", None))
    assert (g.open, g.until, g.why, g.room) == (False, LATER, "paced", 0)
