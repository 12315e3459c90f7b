"""What a process tells a refusal about the rate the API let through (issue 37): the
reading a learnt rate starts from (:class:`synckit.runtime.http.pacer._Shared`)."""

from __future__ import annotations

import time

import pytest

from synckit.runtime.http.pacer import ACCEPTED_SPAN, _Shared


def _sent(state: _Shared, *ago: float, bound: bool = False) -> None:
    now = time.monotonic()
    for a in ago:
        state.success(None, now - a, bound=bound)


def test_successes_count_by_when_they_were_sent_not_answered() -> None:
    """Three requests sent 0.6 s apart and answered together: the busiest second read by
    send time holds 2 (no second holds all three), not the 3 a count by answer would
    read."""
    state = _Shared()
    _sent(state, 1.3, 0.7, 0.1)
    assert state.accepted_rate() == 2.0


def test_a_reading_that_straddled_two_windows_is_held_to_the_previous_one() -> None:
    """An API allowing 3 a second: 3 sent before the first refusal; after its pace, 3 at
    a window's end and 3 at the next one's start read 6 in one second. The rate learns
    from the lower reading, 3; the previous reading is the first one's."""
    state = _Shared()
    _sent(state, 3.0, 2.95, 2.9)
    assert state.accepted_at_refusal() == 3.0
    state.refused_mono -= 1.0  # that refusal came a second ago, before the six
    _sent(state, 0.5, 0.45, 0.4, 0.1, 0.05, 0.01)
    assert state.accepted_rate(since=state.refused_mono) == 6.0
    assert state.accepted_at_refusal() == 3.0
    assert state.refused_reading == 6.0


def test_nothing_sent_since_the_previous_refusal_reads_nothing() -> None:
    """A refusal right after another (a burst answered together, or a limit counted per
    minute refusing every retry): nothing to learn from; the previous reading is kept."""
    state = _Shared()
    _sent(state, 0.3, 0.2, 0.1)
    assert state.accepted_at_refusal() == 3.0
    assert state.accepted_at_refusal() == 0.0
    assert state.refused_reading == 3.0


def test_an_old_reading_does_not_hold_a_new_one() -> None:
    state = _Shared()
    state.refused_reading, state.refused_mono = 1.0, time.monotonic() - ACCEPTED_SPAN - 1
    _sent(state, 0.3, 0.2)
    assert state.accepted_at_refusal() == 2.0


@pytest.mark.parametrize("bound", [True, False])
def test_only_requests_the_rate_held_back_raise_it(bound: bool) -> None:
    """A success counts for the streak and the reading either way; it raises the learnt
    rate only when the rate held its request back (a process sending slower than its
    rate has not tried it)."""
    state = _Shared()
    _sent(state, 0.1, bound=bound)
    assert state.successes == (1 if bound else 0)
    assert state.accepted_rate() == 1.0
