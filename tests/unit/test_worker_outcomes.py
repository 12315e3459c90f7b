"""The recorder's routing of a job's outcome, on an in-memory fake of the job store.

``Worker._record_other`` decides what a failure, a rate limit, a snooze, a cancel or a
discard writes (retry when, dead or not, attempt charged or not, what text is stored);
``Worker.outcomes`` (the :class:`~synckit.store.jobs.outcomes.OutcomeStore` operations) is where it
writes. Here a fake keeps each call, so the decisions are pinned without a database. The
same paths run on both engines in tests/integration/test_recording.py, test_queue.py and
test_poll.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from synckit.errors import RetryPolicy
from synckit.errors.exceptions import PermanentError, RateLimited, RetryableError
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.jobs.worker import Worker, _Outcome
from synckit.store.jobs._base import ClaimedJob

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class FakeOutcomes:
    """The job store's outcome writes, kept in order; each answers ``answer``."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    answer: str = "pending"

    def fail_sync(self, conn: Any, job: ClaimedJob, **kw: Any) -> str | None:
        self.calls.append(("fail", kw))
        return self.answer if kw["retry_at"] is not None else "dead"

    def snooze_sync(self, conn: Any, job: ClaimedJob, **kw: Any) -> bool:
        self.calls.append(("snooze", kw))
        return True

    def finish_sync(self, conn: Any, job: ClaimedJob, **kw: Any) -> bool:
        self.calls.append(("finish", kw))
        return True


def _worker(fake: FakeOutcomes) -> Worker:
    class OnFake(Worker):
        outcomes = fake

    return OnFake(
        db=None,  # type: ignore[arg-type]
        registry=Registry(),
        retry_policy=RetryPolicy(),
    )


def _job(attempts: int = 1, max_attempts: int = 5) -> ClaimedJob:
    return ClaimedJob(7, "k", {}, None, attempts, max_attempts, 0, None, NOW, 1, started=True)


def _record(fake: FakeOutcomes, o: _Outcome) -> str | None:
    return _worker(fake)._record_other(None, o, NOW)  # type: ignore[arg-type]


def test_a_retryable_failure_is_retried_later_and_charged() -> None:
    fake = FakeOutcomes()
    status = _record(fake, _Outcome(_job(), "failure", exc=RetryableError("HTTP 502")))
    [(what, kw)] = fake.calls
    assert what == "fail" and status == "pending"
    assert kw["retry_at"] is not None and kw["retry_at"] > NOW
    assert kw["count_attempt"] is True


def test_a_permanent_failure_goes_dead_at_once() -> None:
    fake = FakeOutcomes()
    status = _record(fake, _Outcome(_job(), "failure", exc=PermanentError("HTTP 422 bad id")))
    [(_, kw)] = fake.calls
    assert kw["retry_at"] is None and status == "dead"


def test_the_last_attempt_goes_dead() -> None:
    fake = FakeOutcomes()
    _record(fake, _Outcome(_job(attempts=5), "failure", exc=RetryableError("HTTP 502")))
    [(_, kw)] = fake.calls
    assert kw["retry_at"] is None and kw["count_attempt"] is True


def test_an_attempt_that_committed_work_is_retried_free_even_at_the_limit() -> None:
    fake = FakeOutcomes()
    o = _Outcome(_job(attempts=5), "failure", exc=RetryableError("HTTP 502"), progress=True)
    _record(fake, o)
    [(_, kw)] = fake.calls
    assert kw["retry_at"] is not None and kw["count_attempt"] is False


def test_a_rate_limit_paces_without_spending_the_attempt() -> None:
    fake = FakeOutcomes()
    exc = RateLimited("HTTP 429", retry_after=timedelta(seconds=30))
    status = _record(fake, _Outcome(_job(attempts=5), "failure", exc=exc))
    [(_, kw)] = fake.calls
    assert status == "paced" and kw["count_attempt"] is False
    assert kw["retry_at"] >= NOW + timedelta(seconds=30)


def test_a_handler_wait_of_3_000_000_days_is_clamped() -> None:
    fake = FakeOutcomes()
    exc = RetryableError("come back later", retry_after=timedelta(days=3_000_000))
    _record(fake, _Outcome(_job(), "failure", exc=exc))
    [(_, kw)] = fake.calls
    assert NOW < kw["retry_at"] <= NOW + timedelta(days=1)


def test_stored_texts_are_redacted() -> None:
    fake = FakeOutcomes()
    exc = RetryableError("GET https://api.example/me?access_token=Zq9SeCrEt123456&page=2 failed")
    _record(fake, _Outcome(_job(), "failure", exc=exc, tb="Traceback ... Bearer Zq9SeCrEt123456"))
    [(_, kw)] = fake.calls
    stored = " ".join(str(kw[k]) for k in ("message", "detail", "traceback"))
    assert "Zq9SeCrEt123456" not in stored and "access_token=***" in kw["detail"]


def test_snooze_cancel_and_discard_write_what_they_say() -> None:
    fake = FakeOutcomes()
    until = NOW + timedelta(minutes=5)
    assert _record(fake, _Outcome(_job(), "snooze", snooze_until=until)) == "snoozed"
    assert _record(fake, _Outcome(_job(), "cancel", reason="not needed")) == "cancelled"
    assert _record(fake, _Outcome(_job(), "discard", reason="stale")) == "discarded"
    assert fake.calls == [
        ("snooze", {"now": NOW, "until": until}),
        ("finish", {"now": NOW, "status": "cancelled", "reason": "not needed"}),
        ("finish", {"now": NOW, "status": "discarded", "reason": "stale"}),
    ]
