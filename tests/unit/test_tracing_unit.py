"""synckit.tracing without a database: off costs nothing and imports nothing, spans are
redacted as logs are (every shape of tests/secret_shapes.py), logs carry the current
span's ids when tracing is on and keep their own trace id when it is off."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest
import structlog
from opentelemetry import trace
from otel_spans import as_dict, in_memory_tracing  # tests/
from secret_shapes import SHAPES  # tests/

from synckit import tracing
from synckit.runtime.observe.logging import bind_job_context, configure_logging

SECRET = "Zq8Tt3Kp0Lm9Xv2Rw7Yb4Nc"


def test_off_without_a_provider_and_opentelemetry_is_not_imported() -> None:
    """In a fresh process with the API installed but no provider set, every span site
    is a no-op and ``opentelemetry`` is never imported by synckit."""
    code = (
        "import sys\n"
        "from synckit import tracing\n"
        "import synckit.runtime.observe.logging, synckit.runtime.sync.poll\n"
        "import synckit.runtime.jobs.worker, synckit.runtime.http.client\n"
        "import synckit.runtime.writes.outbox\n"
        "assert tracing.tracer() is None\n"
        "with tracing.span('x', a=1) as s: assert s is None\n"
        "assert tracing.start('x') is None and tracing.current_traceparent() is None\n"
        "assert tracing.start_job(object()) is None\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_provider_set_later_turns_tracing_on_and_clearing_it_off() -> None:
    assert tracing.tracer() is None
    with in_memory_tracing() as exporter:
        assert tracing.enabled()
        with tracing.span("synckit.test", synckit__tenant="acme") as s:
            assert s is not None
            assert tracing.current_traceparent() is not None
    assert tracing.tracer() is None
    [got] = exporter.get_finished_spans()
    assert got.attributes == {"synckit.tenant": "acme"}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_secret_shape_reaches_a_span_attribute_or_event(shape: str) -> None:
    """Each shape, as an attribute, a secret-named attribute, an event, an exception's
    message (a span site's failure) and a request's URL: never in what is exported."""
    text = SHAPES[shape](SECRET)
    with in_memory_tracing() as exporter:
        with pytest.raises(RuntimeError), tracing.span("synckit.test", note=text) as s:
            tracing.set_attributes(s, synckit__detail=text, api_key=SECRET, headers=[text])
            tracing.add_event(s, "synckit.event", reason=text, client_secret=SECRET)
            raise RuntimeError(text)
        request = httpx.Request("GET", f"https://u:{SECRET}@api.example/x?token={SECRET}")
        with tracing.http_span(request) as h:
            tracing.http_response(h, 200, None)
    exported = json.dumps([as_dict(sp) for sp in exporter.get_finished_spans()], default=str)
    assert SECRET not in exported
    assert "api.example/x" in exported and "RuntimeError" in exported


def _json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def test_logs_carry_the_current_spans_ids_when_on_and_their_own_trace_id_when_off() -> None:
    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)
    log = structlog.get_logger("synckit.test")
    try:
        with bind_job_context(tenant="acme", job_id=7, trace_id="own-trace-id"):
            log.info("off.event")
            with in_memory_tracing():
                with trace.get_tracer("test").start_as_current_span("on") as span:
                    log.info("on.event")
                    ctx = span.get_span_context()
                log.info("no_span.event")
    finally:
        configure_logging(json_lines=True, stream=sys.stderr)
    off, on, no_span = _json_lines(out)
    assert off["trace_id"] == "own-trace-id" and "span_id" not in off
    assert on["trace_id"] == f"{ctx.trace_id:032x}"
    assert on["span_id"] == f"{ctx.span_id:016x}"
    assert no_span["trace_id"] == "own-trace-id" and "span_id" not in no_span


def test_a_traceparent_names_its_trace() -> None:
    assert tracing.trace_id_of("00-" + "a" * 32 + "-" + "b" * 16 + "-01") == "a" * 32
    assert tracing.trace_id_of("garbage") is None
    assert tracing.trace_id_of(None) is None


def test_configure_from_env_needs_a_named_exporter_and_leaves_an_apps_provider() -> None:
    """Without OTEL_TRACES_EXPORTER nothing is set; a name nothing provides is one error
    naming it; an application's own provider is kept."""
    from synckit import ConfigurationError

    assert tracing.configure_from_env({}) is False
    assert tracing.configure_from_env({"OTEL_TRACES_EXPORTER": "none"}) is False
    with pytest.raises(ConfigurationError, match="no-such-exporter"):
        tracing.configure_from_env({"OTEL_TRACES_EXPORTER": "no-such-exporter"})
    with in_memory_tracing():
        provider = trace.get_tracer_provider()
        assert tracing.configure_from_env({"OTEL_TRACES_EXPORTER": "console"}) is False
        assert trace.get_tracer_provider() is provider


def test_configure_from_env_sets_the_sdks_provider_with_the_named_exporter() -> None:
    code = (
        "from opentelemetry import trace\n"
        "from synckit import tracing\n"
        "assert tracing.configure_from_env({'OTEL_TRACES_EXPORTER': 'console'})\n"
        "with tracing.span('synckit.test', synckit__tenant='acme'): pass\n"
        "tracing.shutdown()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert '"name": "synckit.test"' in done.stdout
    assert '"service.name": "synckit"' in done.stdout
