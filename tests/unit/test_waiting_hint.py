"""`synckit sync --wait`'s hint names what a pending cycle waits for (issue 34): a retry
after an error is not "is a worker running?"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from synckit.runtime.admin.actions import waiting_hint

NOW = datetime(2026, 11, 28, 15, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=2)


@pytest.mark.parametrize(
    ("run_at", "error", "alive", "said"),
    [
        (
            LATER,
            "502 Bad Gateway",
            1,
            "waiting to retry at 2026-11-28T15:02:00+00:00 after server_error: 502 Bad Gateway"
            " (attempt 2 of 10)",
        ),
        (
            LATER,
            "502 Bad Gateway",
            0,
            "waiting to retry at 2026-11-28T15:02:00+00:00 after server_error: 502 Bad Gateway"
            " (attempt 2 of 10); no worker is alive to claim it (`synckit worker --app ...`)",
        ),
        (LATER, None, 2, "due at 2026-11-28T15:02:00+00:00"),
        (NOW, None, 0, "due now; no worker is alive to claim it (`synckit worker --app ...`)"),
        (
            NOW - timedelta(seconds=30),
            None,
            2,
            "due now, not claimed yet by the 2 worker(s) alive: its tenant waits (paced, "
            "breaker open or in-flight limit; see `synckit tenants show`)",
        ),
    ],
)
def test_the_hint_names_what_the_cycle_waits_for(
    run_at: datetime, error: str | None, alive: int, said: str
) -> None:
    assert (
        waiting_hint(
            run_at=run_at,
            last_error=error,
            error_class="server_error" if error else None,
            attempts=2,
            max_attempts=10,
            workers_alive=alive,
            now=NOW,
        )
        == said
    )
