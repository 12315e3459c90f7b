"""Structured logs: redaction of secrets, rendering, and job context binding."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import structlog
from hypothesis import example, given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from synckit.runtime.observe.logging import (
    bind_claimed_job,
    bind_job_context,
    configure_logging,
    redact,
    redact_secrets,
    redact_text,
    shared_processors,
)
from synckit.store.jobs._base import ClaimedJob

SECRETS = ("AT-s3cr3t-1", "RT-s3cr3t-2", "CS-s3cr3t-3", "PW-s3cr3t-4", "KEY-s3cr3t-5")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root = logging.getLogger()
    for h in [h for h in root.handlers if h.get_name() == "synckit"]:
        root.removeHandler(h)


def test_secret_keys_are_redacted_at_any_depth() -> None:
    """Values of secret-named keys are replaced wherever they sit; other keys stay."""
    value = {
        "token_set": {"access_token": SECRETS[0], "refresh_token": SECRETS[1], "expires_in": 3600},
        "oauth": [{"client_secret": SECRETS[2]}, {"Password": SECRETS[3]}],
        "headers": {"X-Api-Key": SECRETS[4], "Accept": "application/json"},
        "claim_token": 12345,
        "token_expires_at": "2026-01-01T00:00:00Z",
    }
    out = redact(value)
    assert out["token_set"] == "***"
    assert out["oauth"] == [{"client_secret": "***"}, {"Password": "***"}]
    assert out["headers"] == {"X-Api-Key": "***", "Accept": "application/json"}
    assert out["claim_token"] == 12345
    assert out["token_expires_at"] == "2026-01-01T00:00:00Z"
    assert not any(s in repr(out) for s in SECRETS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("401 with Authorization: Bearer abc.DEF-123", "401 with Authorization: Bearer ***"),
        ("sent Bearer abc.DEF-123 to the API", "sent Bearer *** to the API"),
        ("GET /me?access_token=AT1&x=1", "GET /me?access_token=***&x=1"),
        ('{"refresh_token": "RT1", "n": 1}', '{"refresh_token": "***", "n": 1}'),
        ("client_secret=CS1; next", "client_secret=***; next"),
        ("postgresql://app:pw1@db/main", "postgresql://app:***@db/main"),
        ("token eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl", "token ***"),
        ("Authorization: token ghp_abc123", "Authorization: token ***"),
        ("the token expired", "the token expired"),
        ("the bearer of bad news", "the bearer of bad news"),
    ],
)
def test_token_looking_values_inside_strings_are_redacted(text: str, expected: str) -> None:
    """Tokens inside free text (messages, URLs, bodies) are masked, prose is not."""
    assert redact_text(text) == expected


TOKENS = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/", min_size=8
).filter(lambda t: t.strip("*") == t)


@given(token=TOKENS, key=st.sampled_from(["access_token", "refresh_token", "client_secret"]))
@example(token="Authoriz", key="access_token")
@example(token="https://api.example", key="client_secret")
def test_no_token_survives_in_common_shapes(token: str, key: str) -> None:
    """Whatever the token's characters, headers, query strings and JSON hide it.

    A token may be a piece of its own frame (``Authoriz`` is in ``Authorization``): what
    must not survive is the token where it was put, so the redacted text may hold it only
    as often as the frame with ``***`` in its place does.
    """
    shapes = (
        lambda v: f"Authorization: Bearer {v}",
        lambda v: f"https://api.example/x?{key}={v}&page=2",
        lambda v: json.dumps({key: v, "n": 1}),
        lambda v: f"{key}: {v}",
    )
    for shape in shapes:
        text = shape(token)
        assert redact_text(text).count(token) <= shape("***").count(token), text
    nested = repr(redact({"nested": [{key: token}]}))
    assert nested.count(token) <= repr({"nested": [{key: "***"}]}).count(token)


def test_exception_values_are_rendered_redacted() -> None:
    """An exception passed as a field is turned into redacted text, not left for str()."""
    out = redact({"error": RuntimeError("refused Bearer s3cr3t-bearer")})
    assert out == {"error": "RuntimeError: refused Bearer ***"}


def _json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_json_lines_carry_no_secret_even_in_tracebacks() -> None:
    """JSON output: one object per line, fields and the traceback all redacted."""
    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)
    log = structlog.get_logger("test")
    log.info("auth.token_refreshed", token_set={"access_token": SECRETS[0]}, tenant="acme")
    try:
        raise RuntimeError(f"refresh refused: refresh_token={SECRETS[1]} Bearer {SECRETS[0]}")
    except RuntimeError:
        log.exception("auth.refresh_failed", url=f"https://x/token?client_secret={SECRETS[2]}")
    lines = _json_lines(out)
    assert [e["event"] for e in lines] == ["auth.token_refreshed", "auth.refresh_failed"]
    assert lines[0]["tenant"] == "acme" and lines[0]["level"] == "info"
    assert "RuntimeError" in str(lines[1]["exception"])
    assert not any(s in out.getvalue() for s in SECRETS)


def test_console_output_is_readable_and_redacted() -> None:
    """Console output is not JSON, names the event, and hides secrets too."""
    out = io.StringIO()
    configure_logging(json_lines=False, stream=out)
    structlog.get_logger("test").warning("poll.failed", error=f"Bearer {SECRETS[0]}")
    text = out.getvalue()
    assert "poll.failed" in text and "Bearer ***" in text
    assert not text.lstrip().startswith("{")
    assert SECRETS[0] not in text


@pytest.mark.parametrize("json_lines", [True, False])
def test_times_are_logged_in_iso_8601(json_lines: bool) -> None:
    """Issue 34: ``breaker.opened``'s ``cooldown_until`` (any datetime field) is ISO
    text in both formats, never ``datetime.datetime(...)``."""
    out = io.StringIO()
    configure_logging(json_lines=json_lines, stream=out)
    until = datetime(2026, 11, 28, 12, 30, 5, tzinfo=UTC)
    structlog.get_logger("test").warning("breaker.opened", cooldown_until=until)
    text = out.getvalue()
    assert "2026-11-28T12:30:05+00:00" in text and "datetime.datetime" not in text


def test_standard_library_records_are_redacted() -> None:
    """httpx-style stdlib log records pass the same redaction."""
    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)
    logging.getLogger("somelib").warning("GET https://api/x?access_token=%s", SECRETS[0])
    [line] = _json_lines(out)
    assert line["event"] == "GET https://api/x?access_token=***"
    assert SECRETS[0] not in out.getvalue()


def test_reconfiguring_reaches_loggers_already_used() -> None:
    """A logger used before configure_logging writes to the newly configured stream."""
    log = structlog.get_logger("early")
    first, second = io.StringIO(), io.StringIO()
    configure_logging(json_lines=True, stream=first)
    log.info("one.event")
    configure_logging(json_lines=True, stream=second)
    log.info("two.event")
    assert "one.event" in first.getvalue() and "two.event" in second.getvalue()
    assert "two.event" not in first.getvalue()


def test_bind_job_context_adds_fields_and_restores_them() -> None:
    """Inside the block every event carries tenant, connector, job id, trace id."""
    log = structlog.get_logger("test")
    with capture_logs(processors=shared_processors()) as logs:
        with bind_job_context(tenant="acme", connector="graph", job_id=7, trace_id="t-1"):
            log.info("poll.page_stored", records=50)
            with bind_job_context(tenant="acme", connector="graph", job_id=8, trace_id="t-2"):
                log.info("inner.event")
            log.info("after.inner")
        log.info("outside.event")
    inside, inner, after, outside = logs
    assert {k: inside[k] for k in ("tenant", "connector", "job_id", "trace_id")} == {
        "tenant": "acme",
        "connector": "graph",
        "job_id": 7,
        "trace_id": "t-1",
    }
    assert (inner["job_id"], after["job_id"]) == (8, 7)
    assert "tenant" not in outside


async def test_job_context_is_isolated_per_task() -> None:
    """Two jobs running concurrently each log their own context."""
    log = structlog.get_logger("test")

    async def job(tenant: str, job_id: int) -> None:
        with bind_job_context(tenant=tenant, connector="graph", job_id=job_id, trace_id=tenant):
            await asyncio.sleep(0.01)
            log.info("job.step")

    with capture_logs(processors=shared_processors()) as logs:
        await asyncio.gather(job("acme", 1), job("beta", 2))
    assert sorted((e["tenant"], e["job_id"]) for e in logs) == [("acme", 1), ("beta", 2)]


def test_bind_claimed_job_reads_the_payload() -> None:
    """A claimed job's payload names tenant and connector; else the resource key."""
    job = ClaimedJob(
        id=3,
        kind="synckit.poll",
        payload={"tenant": "acme", "connector": "graph", "access_token": "x"},
        resource_key="graph:acme",
        attempts=1,
        max_attempts=5,
        priority=0,
        trace_id="tr",
        run_at=datetime.now(UTC),
        claim_token=1,
    )
    with capture_logs(processors=shared_processors()) as logs, bind_claimed_job(job):
        structlog.get_logger().info("x.y")
    assert (logs[0]["tenant"], logs[0]["connector"], logs[0]["job_id"]) == ("acme", "graph", 3)
    bare = ClaimedJob(**{**job.__dict__, "payload": {}})
    with capture_logs(processors=shared_processors()) as logs, bind_claimed_job(bare):
        structlog.get_logger().info("x.y")
    assert (logs[0]["tenant"], logs[0]["connector"]) == ("graph:acme", None)


def test_the_clock_timestamp_is_left_alone_and_any_other_is_redacted() -> None:
    """The TimeStamper's ISO time skips the rules (its colons would run them all on every
    line); a ``timestamp`` field that is not just a time is redacted like any other."""
    clock = "2026-11-27T05:14:02.477666Z"
    assert redact_secrets(None, "info", {"timestamp": clock, "event": "x"})["timestamp"] == clock
    given = {"timestamp": "token=Zq1234567890abc", "event": "x"}
    assert redact_secrets(None, "info", given)["timestamp"] == "token=***"
