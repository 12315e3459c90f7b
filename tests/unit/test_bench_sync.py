"""bench.sync's scenarios put the API under the pressure each one claims to measure."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bench.sync import (
    SCENARIOS,
    FlowRun,
    Settings,
    details,
    figures,
    render,
    retry_after_floor_s,
    scenario_setup,
)
from synckit.testing.hostile import Stats, TenantTimeline


def _settings(*, tenants: int, pages: int, ideal_s: float) -> dict[str, Any]:
    """A result's ``settings``, as the table's heading reads them."""
    return {"tenants": tenants, "pages": pages, "records": 5, "limit": 10, "workers": 2} | {
        "ideal_s": ideal_s
    }


@pytest.mark.parametrize("name", ["declared", "undeclared", "undeclared_no_headers", "random_429"])
def test_a_rate_scenario_lets_one_tenant_alone_exceed_its_limit(name: str) -> None:
    """Pages are sequential: unless 1/latency exceeds the limit, the limit never binds."""
    s = Settings()
    behaviour, _ = scenario_setup(name, s)
    assert behaviour.latency > 0
    assert 1 / behaviour.latency >= 2 * s.limit
    assert behaviour.limit == s.limit


def test_outage_keeps_100_ms_and_zero_latency_has_none() -> None:
    s = Settings()
    assert scenario_setup("outage", s)[0].latency == 0.1
    assert scenario_setup("zero_latency", s)[0].latency == 0.0


def test_latency_override_applies_to_every_scenario_but_zero_latency() -> None:
    s = Settings(latency=0.05)
    got = {name: scenario_setup(name, s)[0].latency for name in SCENARIOS}
    assert got == {name: (0.0 if name == "zero_latency" else 0.05) for name in SCENARIOS}
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        s.latency_of("nope")


def test_the_table_prints_each_scenarios_latency() -> None:
    run = {
        "wall_s": 2.5,
        "finished_tenants": 2,
        "requests": 20,
        "http_429": 0,
        "breaker_opens": 0,
        "failed_attempts": 0,
        "worker_cpu_s": 1.0,
    }
    result = {
        "settings": _settings(tenants=2, pages=10, ideal_s=1.0),
        "declared": {
            "latency_ms": 20.0,
            "wall_over_ideal": {"sqlite": 2.5},
            "http_429": {"sqlite": 0},
            "details": {"sqlite": run},
            "baseline_wall_s": 1.0,
            "baseline_http_429": 0,
        },
        "outage": {
            "latency_ms": 100.0,
            "recovery_max_s": {"sqlite": 1.0},
            "details": {"sqlite": run},
            "baseline_wall_s": 1.0,
            "baseline_http_429": 0,
        },
    }
    lines = render(result).splitlines()
    assert any(line.startswith("declared") and "20 ms" in line for line in lines)
    assert any(line.startswith("outage") and "100 ms" in line for line in lines)


def test_a_run_reports_the_cores_it_kept_busy_and_the_table_prints_them() -> None:
    """The workers', the fake API's and the database's CPU over the wall: whether a run
    was bound by the machine's cores rather than by pacing."""
    run = FlowRun(
        tenants=1,
        finished=1,
        wall_s=10.0,
        stats=Stats(),
        events=Counter(),
        breaker_opens=0,
        failed_attempts=0,
        attempts=[],
        worker_cpu_s=12.0,
        api_cpu_s=3.0,
        db_cpu_s=4.5,
    )
    assert run.cores_busy == pytest.approx(1.95)
    d = details(Settings(tenants=1, pages=1), run)
    assert (d["api_cpu_s"], d["db_cpu_s"], d["cores_busy"]) == (3.0, 4.5, 1.95)
    on_sqlite = details(Settings(tenants=1, pages=1), FlowRun(**{**run.__dict__, "db_cpu_s": None}))
    assert on_sqlite["db_cpu_s"] is None and on_sqlite["cores_busy"] == 1.5
    result = {
        "settings": {"tenants": 1, "pages": 1, "records": 5, "limit": 10, "workers": 2}
        | {"ideal_s": 1.0},
        "declared": {
            "latency_ms": 20.0,
            "wall_over_ideal": {"sqlite": 1.5, "postgresql": 1.95},
            "details": {"sqlite": on_sqlite, "postgresql": d},
            "baseline_wall_s": 1.0,
            "baseline_http_429": 0,
        },
    }
    text = render(result)
    assert "worker CPU 12.0s, API CPU 3.0s, 1.5 cores busy" in text
    assert "worker CPU 12.0s, API CPU 3.0s, database CPU 4.5s, 1.95 cores busy" in text


def test_the_retry_after_floor_is_the_most_refused_tenants() -> None:
    """10 pages at 10/s take 1 s; the tenant refused three times (Retry-After: 1) cannot
    finish before 4 s, whatever the client does; the figures carry it and the wall over it."""
    st = Stats(
        tenants={
            "a": TenantTimeline([(0.0, 200, 1), (0.1, 429, 2), (1.1, 200, 2)]),
            "b": TenantTimeline([(0.0, 429, 1), (1.0, 429, 1), (2.0, 429, 1), (3.0, 200, 1)]),
        }
    )
    s = Settings(tenants=2, pages=10, limit=10)
    assert retry_after_floor_s(s, st, retry_after=1.0) == pytest.approx(4.0)
    run = FlowRun(
        tenants=2, finished=2, wall_s=5.0, stats=st, events=Counter(), breaker_opens=0,
        failed_attempts=0, attempts=[], worker_cpu_s=1.0,
    )  # fmt: skip
    got = figures("random_429", s, run)
    assert got["floor_s"] == pytest.approx(4.0)
    assert got["wall_over_floor"] == pytest.approx(1.25)
    assert got["wall_over_ideal"] == pytest.approx(5.0)


def test_a_run_reports_when_the_tenants_first_requests_came_and_their_spans() -> None:
    """From the server's timeline: the first requests' median and last, counted from the
    enqueue, and the median first-to-last span; the table prints them."""
    st = Stats(
        tenants={
            "a": TenantTimeline([(100.2, 200, 1), (101.2, 200, 2)]),
            "b": TenantTimeline([(100.3, 200, 1), (101.0, 200, 2)]),
            "c": TenantTimeline([(100.5, 200, 1), (102.5, 200, 2)]),
        }
    )
    run = FlowRun(
        tenants=3, finished=3, wall_s=3.0, stats=st, events=Counter(), breaker_opens=0,
        failed_attempts=0, attempts=[], worker_cpu_s=1.0, started_at=100.0,
    )  # fmt: skip
    d = details(Settings(tenants=3, pages=2), run)
    assert d["first_request_median_s"] == pytest.approx(0.3)
    assert d["first_request_max_s"] == pytest.approx(0.5)
    assert d["span_median_s"] == pytest.approx(1.0)
    unknown = details(Settings(tenants=3, pages=2), FlowRun(**{**run.__dict__, "started_at": None}))
    assert unknown["first_request_max_s"] is None
    result = {
        "settings": _settings(tenants=3, pages=2, ideal_s=0.1),
        "declared": {
            "latency_ms": 20.0,
            "wall_over_ideal": {"sqlite": 30.0},
            "details": {"sqlite": d, "postgresql": unknown},
        },
    }
    text = render(result)
    assert "first requests 0.3 / 0.5 s after the enqueue (median / last), median span 1.0 s" in text
    assert text.count("first requests") == 1


def test_undeclared_no_headers_refuses_with_bare_429s_and_declares_nothing() -> None:
    """The scenario of issue 37: the limit is enforced with 429s that carry no header, no
    answer reports the quota, and the connector declares no limit."""
    behaviour, declared = scenario_setup("undeclared_no_headers", Settings())
    assert behaviour.bare_limit and declared is None
