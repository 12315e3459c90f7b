"""bench.sync's scenarios put the API under the pressure each one claims to measure."""

from __future__ import annotations

import pytest

from bench.sync import SCENARIOS, Settings, render, scenario_setup


@pytest.mark.parametrize("name", ["declared", "undeclared", "random_429"])
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
        "settings": {"tenants": 2, "pages": 10, "records": 5, "limit": 10, "workers": 2}
        | {"ideal_s": 1.0},
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
