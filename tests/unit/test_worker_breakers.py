"""The recorder's breaker decisions, on an in-memory fake of the breaker store.

The worker folds outcomes into ``resources`` through ``Worker.breakers`` (the
:class:`~synckit.store.resources.BreakerStore` operations); here a dict stands in for the
table, so what the worker decides (which rows it writes, what it blocks, when the API-wide
breaker opens, how it reads a corrupt row) is pinned without a database. The same paths
run on both engines in tests/integration/test_breakers.py and test_recording.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from synckit.errors import BreakerPolicy, classify
from synckit.errors.classify import ErrorClass
from synckit.errors.gate import gate
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store.jobs._base import ClaimedJob

NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = BreakerPolicy(failure_threshold=2, global_min_tenants=2, global_ratio=0.5)


def _row(key: str, parent: str | None = None, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "resource_key": key,
        "parent_key": parent,
        "state": "closed",
        "consecutive_failures": 0,
        "reopen_count": 0,
        "opened_at": None,
        "cooldown_until": None,
        "probe_job_id": None,
        "probe_expires_at": None,
        "window_start": None,
        "window_calls": 0,
        "window_failures": 0,
        "next_available_at": None,
    }
    row.update(values)
    return row


class _Row:
    """A row as the store hands it over: attributes and ``_mapping``."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._mapping = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class FakeBreakers:
    """``resources`` as a dict; every write is kept in order."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.rows[row["resource_key"]] = row

    def breaker_row_sync(self, conn: Any, key: str | None) -> Any:
        row = self.rows.get(key or "")
        return None if row is None else _Row(row)

    def dirty_breakers_sync(self, conn: Any, keys: list[str]) -> Any:
        return [
            _Row(r)
            for k in keys
            if (r := self.rows.get(k)) is not None
            and (
                r["state"] != "closed"
                or r["consecutive_failures"] > 0
                or r["window_start"] is not None
            )
        ]

    def unclosed_breakers_sync(self, conn: Any, keys: list[str]) -> Any:
        return [
            _Row(r) for k in keys if (r := self.rows.get(k)) is not None and r["state"] != "closed"
        ]

    def child_states_sync(self, conn: Any, parent_key: str) -> list[str]:
        return [r["state"] for r in self.rows.values() if r["parent_key"] == parent_key]

    def write_resource_sync(self, conn: Any, key: str, values: Mapping[str, Any]) -> None:
        self.writes.append((key, dict(values)))
        self.rows[key].update(values)


def _worker(fake: FakeBreakers) -> Worker:
    class OnFake(Worker):
        breakers = fake

    return OnFake(db=None, registry=Registry(), breaker_policy=POLICY)  # type: ignore[arg-type]


def _job(key: str) -> ClaimedJob:
    return ClaimedJob(1, "k", {}, key, 1, 5, 0, None, NOW, 1, started=True)


def _failure() -> Any:
    c = classify(exc=TimeoutError("read timed out"), now=NOW)
    assert c.counts_for_breaker and c.error_class is not ErrorClass.RATE_LIMITED
    return c


def test_a_success_on_clean_resources_writes_nothing() -> None:
    """The common case costs no write: only rows a success changes are read back."""
    fake = FakeBreakers()
    fake.add(_row("a"))
    fake.add(_row("b"))
    _worker(fake).book.success(None, Counter({"a": 3, "b": 1}), NOW)  # type: ignore[arg-type]
    assert fake.writes == []


def test_a_success_clears_counted_failures() -> None:
    fake = FakeBreakers()
    fake.add(_row("a", consecutive_failures=1))
    _worker(fake).book.success(None, Counter({"a": 1}), NOW)  # type: ignore[arg-type]
    assert fake.rows["a"]["consecutive_failures"] == 0
    assert [k for k, _ in fake.writes] == ["a"]


def test_failures_open_the_breaker_and_block_the_resource_in_this_worker() -> None:
    """At the threshold the breaker opens, and jobs of the resource that this worker
    claimed ahead are held back until its cool-down ends."""
    fake = FakeBreakers()
    fake.add(_row("a"))
    worker = _worker(fake)
    for n in (1, 2):
        worker.book.failure(None, _job("a"), _failure(), NOW, None)  # type: ignore[arg-type]
        assert fake.rows["a"]["consecutive_failures"] == n
    row = fake.rows["a"]
    assert row["state"] == "open" and row["opened_at"] == NOW
    assert row["last_error_class"] == _failure().error_class.value
    held = gate(worker.book.learnt["a"], NOW)
    assert (held.why, held.until) == ("breaker", row["cooldown_until"])
    assert row["cooldown_until"] > NOW


def test_a_failure_of_an_unknown_resource_writes_nothing() -> None:
    fake = FakeBreakers()
    worker = _worker(fake)
    assert worker.book.failure(None, _job("gone"), _failure(), NOW, None) is None  # type: ignore[arg-type]
    assert fake.writes == [] and worker.book.learnt == {}


def test_the_api_wide_breaker_opens_when_enough_tenants_fail_together() -> None:
    """One tenant's breaker opening leaves the API's closed; the second of two opens it."""
    fake = FakeBreakers()
    fake.add(_row("api:x"))
    fake.add(_row("x:t1", "api:x", consecutive_failures=1))
    fake.add(_row("x:t2", "api:x", consecutive_failures=1))
    worker = _worker(fake)
    worker.book.failure(None, _job("x:t1"), _failure(), NOW, None)  # type: ignore[arg-type]
    assert fake.rows["x:t1"]["state"] == "open" and fake.rows["api:x"]["state"] == "closed"
    worker.book.failure(None, _job("x:t2"), _failure(), NOW, None)  # type: ignore[arg-type]
    assert fake.rows["api:x"]["state"] == "open"
    assert fake.rows["api:x"]["last_error"] == "2 of 2 tenants failing"


def test_a_tenant_success_after_the_api_cooldown_is_the_apis_probe() -> None:
    """A success of a tenant whose parent is open past its cool-down moves the parent on
    (half-open, then closed), so the API recovers without a probe job of its own."""
    fake = FakeBreakers()
    fake.add(
        _row(
            "api:x",
            state="open",
            opened_at=NOW - timedelta(minutes=1),
            cooldown_until=NOW - timedelta(seconds=1),
        )
    )
    fake.add(_row("x:t1", "api:x", consecutive_failures=1))
    _worker(fake).book.success(None, Counter({"x:t1": 1}), NOW)  # type: ignore[arg-type]
    assert "api:x" in [k for k, _ in fake.writes]
    assert fake.rows["api:x"]["state"] != "open"


def test_a_corrupt_row_reads_as_closed_and_is_repaired_by_the_write() -> None:
    """An unknown state or a timestamp no datetime holds must not fail the batch: the row
    reads as closed/unset, and the snapshot written back replaces the bad values."""
    fake = FakeBreakers()
    fake.add(_row("a", state="sideways", consecutive_failures=1, opened_at="garbage"))
    _worker(fake).book.success(None, Counter({"a": 1}), NOW)  # type: ignore[arg-type]
    row = fake.rows["a"]
    assert row["state"] == "closed" and row["opened_at"] is None
    assert row["consecutive_failures"] == 0
