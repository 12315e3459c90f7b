"""The hostile fake API answers as its behaviour says, and counts what it answered."""

from __future__ import annotations

import httpx

from synckit.testing.hostile import Behaviour, HostileAPI


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def client(api: HostileAPI) -> httpx.Client:
    return httpx.Client(transport=api.fake.transport(), base_url="http://api.test")


def test_the_limit_refuses_past_the_window_and_says_when_it_resets() -> None:
    """Limit 2/s: the third request of a second is refused with Remaining 0, the reset at
    the window's end and a fractional Retry-After; the next second serves again."""
    clock = Clock(1000.25)
    api = HostileAPI(
        Behaviour(pages=5, records=1, limit=2, limit_status=403, retry_after="fractional"),
        clock=clock,
    )
    with client(api) as c:
        first, second, third = (c.get("/t/a/items", params={"page": 1}) for _ in range(3))
        clock.now = 1001.0
        fourth = c.get("/t/a/items", params={"page": 1})
    assert [first.status_code, second.status_code, third.status_code] == [200, 200, 403]
    assert second.headers["X-RateLimit-Remaining"] == "0"
    assert third.headers["X-RateLimit-Reset"] == "1001"
    assert third.headers["Retry-After"] == "0.750"
    assert fourth.status_code == 200 and fourth.headers["X-RateLimit-Remaining"] == "1"
    assert api.stats.rate_limited == 1 and api.stats.requests == 4


def test_an_outage_answers_503_with_the_seconds_left_and_recovery_is_measured() -> None:
    clock = Clock(50.0)
    api = HostileAPI(Behaviour(pages=2, records=1), clock=clock)
    api.start_outage(3.0, after=1.0)
    with client(api) as c:
        assert c.get("/t/a/items").status_code == 200
        clock.now = 51.5
        down = c.get("/t/a/items", params={"page": 2})
        clock.now = 54.7
        assert c.get("/t/a/items", params={"page": 2}).json()["next"] is None
    assert (down.status_code, down.headers["Retry-After"]) == (503, "3")
    assert api.stats.outage_503 == 1
    assert api.stats.recovery_s() == {"a": 54.7 - 54.0}


def test_random_429s_are_about_their_share_and_reproducible() -> None:
    def statuses() -> list[int]:
        api = HostileAPI(Behaviour(pages=1000, records=0, random_429=0.05, seed=7))
        with client(api) as c:
            return [c.get("/t/a/items", params={"page": i}).status_code for i in range(1, 401)]

    first = statuses()
    assert first == statuses()
    assert 8 <= first.count(429) <= 35
