"""The unreadable_run_at rule: one alert per stuck job, naming it, de-duplicated by day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from synckit.runtime.observe.alert_rules import AlertData, RuleSet, UnreadableRunAt
from synckit.store.jobs.admin import StuckJob

NOW = datetime(2026, 3, 4, 12, 4, 30, tzinfo=UTC)
STUCK = [StuckJob(7, "sync.things", None, "garbage"), StuckJob(9, "poll", "demo:a", "x" * 500)]


def test_one_alert_per_stuck_job_naming_it() -> None:
    alerts = UnreadableRunAt().evaluate(AlertData(now=NOW, stuck_jobs=STUCK))
    assert [a.subject for a in alerts] == ["job:7", "job:9"]
    assert (
        alerts[0].message == "job 7 (sync.things) never runs: its run_at cannot be read: 'garbage'"
    )
    assert alerts[1].details == {"job_id": 9, "kind": "poll", "resource_key": "demo:a"}
    assert len(alerts[1].message) < 120  # the stored value is quoted, cut


def test_alerts_repeat_once_a_day_and_are_capped() -> None:
    rule = UnreadableRunAt(limit=1)
    today = rule.evaluate(AlertData(now=NOW, stuck_jobs=STUCK))
    later = rule.evaluate(AlertData(now=NOW + timedelta(hours=6), stuck_jobs=STUCK))
    tomorrow = rule.evaluate(AlertData(now=NOW + timedelta(days=1), stuck_jobs=STUCK))
    assert len(today) == 1 and today[0].key == later[0].key != tomorrow[0].key


def test_the_rule_is_on_by_default_and_can_be_turned_off() -> None:
    data = AlertData(now=NOW, stuck_jobs=STUCK)
    assert [a.rule for a in RuleSet().evaluate(data)] == ["unreadable_run_at"] * 2
    assert RuleSet(unreadable_run_at=None).evaluate(data) == []
    assert UnreadableRunAt().evaluate(AlertData(now=NOW)) == []
