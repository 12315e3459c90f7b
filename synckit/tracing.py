"""OpenTelemetry traces: every span synckit makes, in this one module.

Tracing is on when ``opentelemetry-api`` is installed (the ``otel`` extra) and a real
``TracerProvider`` is set: by the application (``trace.set_tracer_provider(...)``, in the
module ``--app`` names, say) or, for ``synckit worker``, from the standard ``OTEL_*``
variables (:func:`configure_from_env`: ``OTEL_TRACES_EXPORTER`` names an installed
exporter). Otherwise every call here returns at once: no ``opentelemetry`` import is
made here (the module is looked up in ``sys.modules``: nobody can have set a provider
without importing it), and a span site costs one function call.

The spans (names are low-cardinality; what varies is in attributes):

* ``synckit.job {kind}`` (CONSUMER): a job, from its claim to the recording of its
  outcome. A job enqueued inside a span carries that span's W3C ``traceparent`` in its
  row (``jobs.trace_parent``): its span continues that trace and links to it, across
  processes;
* ``synckit.poll {stream}``: a poll cycle; ``synckit.page``: each page (records, failed,
  checkpoint committed); ``synckit.dlq.capture``: failed records going to the DLQ;
* ``{METHOD}`` (CLIENT): each request through ``ctx.http``, with the HTTP client semantic
  conventions (the URL without its query string) and the pace outcome of a refusal;
* ``synckit.intent {operation}``, ``synckit.dlq.replay``, ``synckit.oauth.refresh``;
* ``{topic} publish`` (PRODUCER): an outbox message's publish, up to the broker's confirm,
  a child of the span the message was written in; the message carries the publish
  span's ``traceparent`` in its headers, so a consumer continues the trace.

Attributes and events pass the same redaction as logs and dead letters
(:func:`synckit.redaction.redact_text`, secret-looking keys masked whole), so no secret
reaches an exporter.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from synckit.redaction import REDACTED, is_secret_key, redact_text

#: Our instrumentation scope (``Tracer`` name).
SCOPE = "synckit"

_NULL: contextlib.nullcontext[None] = contextlib.nullcontext(None)
#: A context manager that does nothing (yields None): a span site's "no span here".
NULL = _NULL
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

# (provider, tracer) of the last lookup: a provider set later is seen at the next call.
_cached: tuple[Any, Any] = (None, None)


def tracer() -> Any:
    """The tracer when tracing is on, else None (cheap: called at every span site)."""
    global _cached
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    cached_provider, cached_tracer = _cached
    if provider is cached_provider:
        return cached_tracer
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        got = None
    else:
        got = provider.get_tracer(SCOPE, _version())
    _cached = (provider, got)
    return got


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("synckit")
    except PackageNotFoundError:
        return "0"


def enabled() -> bool:
    """Whether spans are being made (a provider is set)."""
    return tracer() is not None


# --- attributes -------------------------------------------------------------------------


def clean(value: Any, key: str = "") -> Any:
    """A value as an attribute may hold it, redacted as logs are: None stays None (left
    out), numbers and flags stay, a secret-looking key's value is masked, any other
    value is its redacted text."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if key and is_secret_key(key.rsplit(".", 1)[-1]):
        return REDACTED
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [redact_text(v)[:1000] for v in value]
    return redact_text(value if isinstance(value, str) else str(value))[:1000]


def attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` cleaned (:func:`clean`), None values left out."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        c = clean(v, k)
        if c is not None:
            out[k] = c
    return out


def set_attributes(span: Any, **attrs: Any) -> None:
    """Set cleaned attributes on ``span`` (None: tracing is off, nothing to do). Dotted
    names are given with ``__`` for the dot (``synckit__records=3``)."""
    if span is None:
        return
    span.set_attributes(attributes({k.replace("__", "."): v for k, v in attrs.items()}))


def add_event(span: Any, name: str, **attrs: Any) -> None:
    """Add a cleaned event to ``span`` (None: nothing to do)."""
    if span is None:
        return
    span.add_event(name, attributes({k.replace("__", "."): v for k, v in attrs.items()}))


def fail(span: Any, exc: BaseException, error_class: str | None = None) -> None:
    """Mark ``span`` failed by ``exc``: status ERROR, ``error.type``, ``synckit.error_class``
    and an ``exception`` event whose message is redacted (never the raw text, which may
    quote a token)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    message = redact_text(str(exc))[:1000]
    span.set_attribute("error.type", type(exc).__name__)
    if error_class:
        span.set_attribute("synckit.error_class", error_class)
    span.add_event(
        "exception",
        {"exception.type": type(exc).__name__, "exception.message": message},
    )
    span.set_status(Status(StatusCode.ERROR, message[:200]))


# --- spans ------------------------------------------------------------------------------


def span(
    name: str, *, kind: str = "INTERNAL", **attrs: Any
) -> contextlib.AbstractContextManager[Any]:
    """A span around a ``with`` block, current inside it (yields None when tracing is off).

    An exception leaving the block marks it failed (:func:`fail`) and goes on. Attribute
    names are given with ``__`` for the dot."""
    t = tracer()
    if t is None:
        return _NULL
    return _span(t, name, kind, attrs)


@contextlib.contextmanager
def _span(
    t: Any, name: str, kind: str, attrs: Mapping[str, Any], context: Any = None
) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    with t.start_as_current_span(
        name,
        context=context,
        kind=SpanKind[kind],
        attributes=attributes({k.replace("__", "."): v for k, v in attrs.items()}),
        record_exception=False,
        set_status_on_exception=False,
    ) as s:
        try:
            yield s
        except BaseException as exc:
            if not _control_flow(exc):
                fail(s, exc, _error_class_of(exc))
            raise


def _error_class_of(exc: BaseException) -> str | None:
    """An exception's synckit error class (``transient``, ``rate_limited``...), if it says."""
    ec = getattr(exc, "error_class", None)
    return str(getattr(ec, "value", ec)) if ec is not None else None


def _control_flow(exc: BaseException) -> bool:
    """A job's snooze, cancel or discard (``synckit.runtime.jobs.handlers``, named here: this
    module sits below the runtime), a generator's end, a task's cancellation: not failures
    of the span they leave."""
    kind = type(exc)
    if kind.__module__ == "synckit.runtime.jobs.handlers":
        return kind.__name__ in ("Snooze", "Cancel", "Discard")
    return isinstance(exc, StopAsyncIteration | GeneratorExit) or kind.__name__ == "CancelledError"


def start(name: str, **attrs: Any) -> Any:
    """Start a span, a child of the current one, that is not made current (see
    :func:`use`) and is ended by :func:`end`; None when tracing is off."""
    t = tracer()
    if t is None:
        return None
    return t.start_span(
        name, attributes=attributes({k.replace("__", "."): v for k, v in attrs.items()})
    )


def use(span: Any) -> contextlib.AbstractContextManager[Any]:
    """Make ``span`` (from :func:`start`) current inside a ``with`` block, without ending
    it (None: nothing to do)."""
    if span is None:
        return _NULL
    from opentelemetry import trace

    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


def end(span: Any, exc: BaseException | None = None) -> None:
    """End ``span`` (None: nothing to do), failed by ``exc`` when given (a job's snooze
    or cancel is no failure)."""
    if span is None:
        return
    if exc is not None and not _control_flow(exc):
        fail(span, exc, _error_class_of(exc))
    span.end()


def ender(span: Any) -> Any:
    """A done-callback for the task ``span`` covers: ends it, failed by the task's error."""

    def done(task: Any) -> None:
        exc = None if task.cancelled() else task.exception()
        end(span, exc)

    return done


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or None (off, or no span)."""
    if tracer() is None:
        return None
    from opentelemetry import trace

    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span as hex, or None (off, or no span)."""
    if tracer() is None:
        return None
    from opentelemetry import trace

    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id a ``traceparent`` names (its 32 hex digits), or None."""
    m = _TRACEPARENT.fullmatch(traceparent or "")
    return m.group(1) if m else None


def _remote(traceparent: str | None) -> Any:
    """The span context a ``traceparent`` names (remote), or None when it names none."""
    m = _TRACEPARENT.fullmatch(traceparent or "")
    if m is None:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    sc = SpanContext(
        int(m.group(1), 16), int(m.group(2), 16), True, TraceFlags(int(m.group(3), 16))
    )
    return sc if sc.is_valid else None


# --- HTTP -------------------------------------------------------------------------------


def http_span(request: Any, resend_count: int = 0) -> contextlib.AbstractContextManager[Any]:
    """The span of one request sent through ``ctx.http`` (an ``httpx.Request``), with the
    HTTP client semantic conventions: the URL without its query string, fragment or
    user info (a query may carry an API key)."""
    t = tracer()
    if t is None:
        return _NULL
    url = request.url
    port = url.port or (443 if url.scheme == "https" else 80)
    return _span(
        t,
        request.method,
        "CLIENT",
        {
            "http.request.method": request.method,
            "url.full": str(url.copy_with(query=None, fragment=None, userinfo=b"")),
            "url.scheme": url.scheme,
            "server.address": url.host,
            "server.port": port,
            "http.request.resend_count": resend_count or None,
        },
    )


def http_response(span: Any, status: int, classification: Any) -> None:
    """What a response tells its span: the status, and for a failure its ``error.type``
    (the status code, as the conventions have it) and synckit's error class."""
    span.set_attribute("http.response.status_code", status)
    if classification is None:
        return
    span.set_attribute("synckit.error_class", str(classification.error_class.value))
    if status >= 400:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


# --- jobs -------------------------------------------------------------------------------


def job_attributes(job: Any) -> dict[str, Any]:
    """What an operator filters a job's span by (a ``synckit.store.jobs._base.ClaimedJob``)."""
    payload = job.payload if isinstance(job.payload, Mapping) else {}
    return {
        "synckit.job.kind": job.kind,
        "synckit.job.id": job.id,
        "synckit.job.attempt": job.attempts,
        "synckit.job.max_attempts": job.max_attempts,
        "synckit.resource_key": job.resource_key,
        "synckit.tenant": payload.get("tenant"),
        "synckit.connector": payload.get("connector"),
        "synckit.stream": payload.get("stream"),
        "messaging.system": "synckit",
        "messaging.operation.type": "process",
    }


def start_job(job: Any) -> Any:
    """Start a claimed job's span (ended by :func:`end_job`), or None when tracing is off.

    A child of the span the job was enqueued in (``job.trace_parent``), with a link to
    it; a new trace when there was none."""
    t = tracer()
    if t is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind

    parent = _remote(getattr(job, "trace_parent", None))
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    return t.start_span(
        f"synckit.job {job.kind}",
        context=context,
        kind=SpanKind.CONSUMER,
        attributes=attributes(job_attributes(job)),
        links=[Link(parent, {"synckit.link": "enqueued_by"})] if parent else None,
    )


def enter(span: Any) -> None:
    """Make ``span`` current for the rest of the current asyncio task (a task that runs
    one job: its context is its own copy, nothing to restore)."""
    if span is None:
        return
    from opentelemetry import context, trace

    context.attach(trace.set_span_in_context(span))


def end_job(
    span: Any,
    outcome: str,
    *,
    status: str | None = None,
    exc: BaseException | None = None,
    error_class: str | None = None,
) -> None:
    """End a job's span: its outcome (success, failure, snooze...), the status recorded
    (succeeded, pending, dead, paced...; None: the claim was lost) and its error."""
    if span is None:
        return
    set_attributes(span, synckit__job__outcome=outcome, synckit__job__status=status)
    if exc is not None:
        fail(span, exc, error_class)
    span.end()


# --- outbox -----------------------------------------------------------------------------


def publish_span(message: Any) -> contextlib.AbstractContextManager[Any]:
    """The span of an outbox message's publish, up to the broker's confirm: a child of
    the span the message was written in (``message.trace_parent``)."""
    t = tracer()
    if t is None:
        return _NULL
    return _publish_span(t, message)


def _publish_span(t: Any, message: Any) -> contextlib.AbstractContextManager[Any]:
    from opentelemetry import trace

    parent = _remote(getattr(message, "trace_parent", None))
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    return _span(
        t,
        f"{message.topic} publish",
        "PRODUCER",
        {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": message.topic,
            "messaging.message.id": message.message_id,
            "synckit.outbox.id": message.id,
            "synckit.outbox.attempt": message.attempts + 1,
        },
        context,
    )


# --- configuration ----------------------------------------------------------------------


def configure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Set a ``TracerProvider`` from the standard ``OTEL_*`` variables, unless one is set
    already: ``OTEL_TRACES_EXPORTER`` names the exporters (comma-separated, their entry
    points in ``opentelemetry_traces_exporter``: ``otlp`` from
    ``opentelemetry-exporter-otlp``, ``console`` from the SDK), ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` the resource, ``OTEL_TRACES_SAMPLER`` the sampler, and
    each exporter reads its own (``OTEL_EXPORTER_OTLP_ENDPOINT``). Whether it set one.

    Without the variable (or ``none``) nothing is imported; without the SDK it raises
    :class:`~synckit.ConfigurationError` naming what to install."""
    env = os.environ if environ is None else environ
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names or names == ["none"]:
        return False
    from synckit.errors.exceptions import ConfigurationError

    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']} needs the OpenTelemetry SDK:"
            " pip install 'synckit[otel]' opentelemetry-sdk (and the exporter's package)"
        ) from exc
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application set its own
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    missing = [n for n in names if n not in found]
    if missing:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER names {', '.join(missing)}, which no installed package"
            f" provides (installed: {', '.join(sorted(found)) or 'none'})"
        )
    defaults = {"service.name": "synckit"} if "OTEL_SERVICE_NAME" not in env else {}
    provider = TracerProvider(resource=Resource.create(defaults))
    for n in names:
        provider.add_span_processor(BatchSpanProcessor(found[n].load()()))
    trace.set_tracer_provider(provider)
    return True


def shutdown() -> None:
    """Flush and shut down the provider, when it is an SDK's (a worker's exit)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return
    stop = getattr(trace.get_tracer_provider(), "shutdown", None)
    if callable(stop):
        stop()


__all__ = [
    "SCOPE",
    "add_event",
    "attributes",
    "clean",
    "configure_from_env",
    "current_ids",
    "current_traceparent",
    "enabled",
    "end_job",
    "enter",
    "fail",
    "job_attributes",
    "publish_span",
    "set_attributes",
    "shutdown",
    "span",
    "start_job",
    "trace_id_of",
    "tracer",
]
