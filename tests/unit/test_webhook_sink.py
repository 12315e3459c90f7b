"""The webhook alert sink waits as the receiving server asks (Slack answers 429 with
``Retry-After``), on an in-memory transport and a recording sleep."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from synckit.errors.exceptions import AlertDeliveryError
from synckit.runtime.observe.alert_delivery import WebhookSink
from synckit.runtime.observe.alert_rules import Alert, Severity

ALERT = Alert(
    rule="needs_reauth",
    subject="acme",
    severity=Severity.CRITICAL,
    message="acme needs re-authorisation",
    fired_at=datetime(2026, 1, 1, tzinfo=UTC),
    window="2026-01-01",
)


def sink(answers: list[httpx.Response], slept: list[float], **kw: float) -> WebhookSink:
    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    return WebhookSink(
        "https://hooks.example/T000/B000/secretpath",
        transport=httpx.MockTransport(handler),
        sleep=sleep,
        rng=lambda: 0.0,
        **kw,
    )


async def test_a_429_with_retry_after_is_waited_as_asked_not_by_the_backoff() -> None:
    slept: list[float] = []
    answers = [httpx.Response(429, headers={"Retry-After": "3"}), httpx.Response(200)]
    await sink(answers, slept, backoff=0.5, max_backoff=10)(ALERT)
    assert slept == [3.0]  # the backoff alone would have waited 0.5 s


async def test_a_backoff_longer_than_the_servers_wait_stands() -> None:
    slept: list[float] = []
    answers = [httpx.Response(503, headers={"Retry-After": "0"}), httpx.Response(200)]
    await sink(answers, slept, backoff=2, max_backoff=10)(ALERT)
    assert slept == [2.0]


async def test_a_wait_past_max_backoff_ends_the_delivery_for_the_next_evaluation() -> None:
    slept: list[float] = []
    answers = [httpx.Response(429, headers={"Retry-After": "600"}), httpx.Response(200)]
    with pytest.raises(AlertDeliveryError, match=r"HTTP 429 \(Retry-After 600 s\)") as err:
        await sink(answers, slept, backoff=0.5, max_backoff=10)(ALERT)
    assert slept == [] and len(answers) == 1  # not hammered: one request, no wait
    assert "secretpath" not in str(err.value)
