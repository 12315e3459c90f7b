"""structlog configuration: JSON lines off a terminal, readable console output on one.

Events are dotted names with key-value fields (``log.info("job.retry_scheduled",
attempt=2)``). Context is bound once per job with :func:`bind_job_context` (structlog
contextvars), so every event logged while the job runs carries its tenant, connector,
job id and trace id.

Every event passes :func:`redact_secrets` last before rendering, after tracebacks are
formatted, so secrets reach no sink: values of secret-looking keys at any depth, and
secret-looking pieces of any string (``Bearer xyz``, ``access_token=xyz``, a URL's
password, a JWT). The standard library's records (httpx, SQLAlchemy...) go through the
same pipeline.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from datetime import date, datetime
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor

from synckit.printable import printable
from synckit.redaction import (
    REDACTED,
    SECRET_KEYS,
    bind_known_secrets,
    is_secret_key,
    redact,
    redact_text,
    scrub_values,
    secret_values,
)
from synckit.tracing import current_ids


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: :func:`redact` every field of the event, the event name too.

    A ``timestamp`` that is nothing but an ISO time (what the pipeline's TimeStamper
    writes, overwriting any given) is left as it is: its colons would otherwise send every
    line's clock reading through every rule."""
    for key, value in list(event.items()):
        kind = type(value)
        if kind is str:
            if key == "timestamp" and _ISO_TIME.fullmatch(value):
                continue
            if not is_secret_key(key) or not value:
                event[key] = redact_text(value)
                continue
        elif kind in _SCALARS:  # most fields: counts, ids, flags
            if value is not None and kind is not bool and is_secret_key(key):
                event[key] = REDACTED
            continue
        event[key] = redact(value, key)
    return event


#: Field types redacted by their key alone (a bool never is).
_SCALARS = frozenset({int, float, bool, type(None)})


_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")


def iso_times(_logger: Any, _method: str, event: EventDict) -> EventDict:
    """Every ``datetime``/``date`` field as ISO 8601 text (never a Python repr)."""
    for key, value in event.items():
        if isinstance(value, (datetime, date)):
            event[key] = value.isoformat()
    return event


def add_trace_ids(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """With OpenTelemetry tracing on (:mod:`synckit.tracing`), the current span's
    ``trace_id`` and ``span_id``, so that logs and traces join; off, the event keeps the
    ``trace_id`` bound to it (the job's own)."""
    ids = current_ids()
    if ids is not None:
        event["trace_id"], event["span_id"] = ids
    return event


def shared_processors() -> list[Processor]:
    """The pipeline every event passes before rendering (also usable with ``capture_logs``).

    Redaction runs last, after tracebacks are rendered to text, so a secret quoted in an
    exception message is caught too.
    """
    return [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        iso_times,
        redact_secrets,
    ]


_HANDLER_NAME = "synckit"


# What structlog's ConsoleRenderer prints as it is: the event, the logger's name, the
# rendered traceback; any other text only when nothing in it would make it repr() it.
_PRINTED_RAW = frozenset({"event", "logger", "logger_name", "exception", "stack", "level"})
_REPR_TRIGGERS = frozenset(" \t=\r\n\"'")


def printable_values(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Every text the console renderer would print raw, with its control characters shown
    escaped (a rendered traceback keeps its lines). A text it prints with repr() is left to
    it: repr() escapes control characters already, and escaping twice shows ``\\x1b``."""
    for key, value in event.items():
        if isinstance(value, str) and (key in _PRINTED_RAW or not _REPR_TRIGGERS & set(value)):
            event[key] = printable(value, keep_newlines=key in ("exception", "stack"))
    return event


def configure_logging(
    *,
    json_lines: bool | None = None,
    level: int = logging.INFO,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog (and the standard library's root logger) for a synckit process.

    ``json_lines`` defaults to "stderr is not a terminal". Safe to call again: the last
    call wins, including for loggers created earlier.
    """
    out = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not out.isatty()
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    # JSON escapes control characters itself; the console renderer prints text as is, so
    # an API's error holding ESC ]0; would act on the operator's terminal.
    finish: list[Processor] = [] if json_lines else [printable_values]
    structlog.configure(
        processors=[*shared_processors(), *finish, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        # Not cached: a later configure_logging (a test, a CLI re-entry) must reach the
        # module-level loggers that were already used.
        cache_logger_on_first_use=False,
    )
    # Records of the standard library (httpx logs every request URL) get the same
    # pipeline, redaction included.
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            *shared_processors(),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *finish,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # One line per HTTP request at INFO is noise next to synckit's own events, and so
    # are Alembic's plugin and migration-context lines (`synckit db` says what it did).
    for noisy in ("httpx", "httpcore", "alembic"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def job_context_fields(
    *,
    tenant: str | None = None,
    connector: str | None = None,
    job_id: int | None = None,
    trace_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "connector": connector,
        "job_id": job_id,
        "trace_id": trace_id,
        **extra,
    }


@contextmanager
def bind_job_context(
    *,
    tenant: str | None = None,
    connector: str | None = None,
    job_id: int | None = None,
    trace_id: str | None = None,
    **extra: Any,
) -> Iterator[None]:
    """Bind a job's context to every event logged inside the ``with`` block.

    Uses structlog's contextvars, so it follows the asyncio task (each job's task has
    its own copy) and is restored on exit, nested bindings included.

    >>> with bind_job_context(tenant="acme", connector="graph", job_id=7, trace_id="t1"):
    ...     log.info("poll.page_stored", records=50)   # carries all four
    """
    fields = job_context_fields(
        tenant=tenant, connector=connector, job_id=job_id, trace_id=trace_id, **extra
    )
    tokens = structlog.contextvars.bind_contextvars(**fields)
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def claimed_job_fields(job: Any) -> dict[str, Any]:
    """The context fields of a claimed job (``synckit.store.jobs.ClaimedJob``).

    Tenant and connector come from the payload's ``tenant``/``connector`` keys, else the
    resource key and nothing, as the audit counts do.
    """
    payload = getattr(job, "payload", None)
    resource_key = getattr(job, "resource_key", None)
    tenant = connector = None
    if isinstance(payload, Mapping):
        tenant = payload.get("tenant")
        connector = payload.get("connector")
    return job_context_fields(
        tenant=str(tenant) if tenant else resource_key,
        connector=str(connector) if connector else None,
        job_id=getattr(job, "id", None),
        trace_id=getattr(job, "trace_id", None),
        kind=getattr(job, "kind", None),
    )


@contextmanager
def bind_claimed_job(job: Any) -> Iterator[None]:
    """:func:`bind_job_context` for a claimed job (see :func:`claimed_job_fields`)."""
    with bind_job_context(**claimed_job_fields(job)):
        yield


def bind_claimed_job_in_task(job: Any) -> None:
    """Bind a claimed job's context for the rest of the current asyncio task.

    For a task that runs exactly one job (the worker's): the task's context is its own
    copy and dies with it, so there is nothing to restore, and the saving (no context
    manager, no reset) is measurable at thousands of jobs a second.
    """
    structlog.contextvars.bind_contextvars(**claimed_job_fields(job))


__all__ = [
    "REDACTED",
    "SECRET_KEYS",
    "add_trace_ids",
    "bind_claimed_job",
    "bind_claimed_job_in_task",
    "bind_job_context",
    "bind_known_secrets",
    "claimed_job_fields",
    "configure_logging",
    "is_secret_key",
    "job_context_fields",
    "printable_values",
    "redact",
    "redact_secrets",
    "redact_text",
    "scrub_values",
    "secret_values",
    "shared_processors",
]
