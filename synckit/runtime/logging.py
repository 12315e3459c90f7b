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
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

REDACTED = "***"

# Keys whose value is a secret, compared lower-cased with "-" read as "_".
SECRET_KEYS = frozenset(
    {
        "access_token",
        "refresh_token",
        "id_token",
        "client_secret",
        "client_assertion",
        "password",
        "passwd",
        "secret",
        "authorization",
        "proxy_authorization",
        "api_key",
        "apikey",
        "x_api_key",
        "token",
        "token_set",
        "cookie",
        "set_cookie",
        "private_key",
    }
)
_SECRET_SUFFIXES = ("_token", "_secret", "_password", "_api_key", "_apikey", "_private_key")
# Names that end like a secret but are not one.
_NOT_SECRET = frozenset({"claim_token"})

# Any key ending like a secret: access_token, next_page_token, client_secret, X-Api-Key...
_KEY_PATTERN = (
    r"[\w-]*?(?:token|secret|passw(?:or)?d|api[_-]?key|authorization|client[_-]?assertion)"
)
_SCHEME = r"(?:bearer|basic|digest|token)\s+"
_TEXT_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization schemes: "Bearer xyz" -> "Bearer ***".
    (re.compile(r"(?i)\b(bearer|basic|digest)(\s+)(?!\*\*\*)[A-Za-z0-9\-._~+/=]{3,}"), r"\1\2***"),
    # key=value / "key": "value" / key: value inside text (query strings, JSON, headers).
    (
        re.compile(
            rf"(?i)(?<![\w-])([\"']?)({_KEY_PATTERN})\1(\s*[=:]\s*)([\"']?)"
            rf"(?!(?:{_SCHEME})?\*\*\*)({_SCHEME})?[^\s\"'&,;}}]+"
        ),
        r"\1\2\1\3\4\5***",
    ),
    # Credentials in URLs: scheme://user:password@host.
    (re.compile(r"(\b[a-zA-Z][\w+.-]*://[^/\s:@]*):[^@\s/]+@"), r"\1:***@"),
    # JSON Web Tokens, wherever they appear.
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), REDACTED),
)


def is_secret_key(key: object) -> bool:
    """Whether a mapping key names a secret (``access_token``, ``X-Api-Key``...)."""
    if not isinstance(key, str):
        return False
    k = key.lower().replace("-", "_")
    if k in _NOT_SECRET:
        return False
    return k in SECRET_KEYS or k.endswith(_SECRET_SUFFIXES)


def redact_text(text: str) -> str:
    """``text`` with token-looking pieces replaced by ``***``."""
    for pattern, replacement in _TEXT_RULES:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any, key: object = None) -> Any:
    """``value`` with secrets removed: by key at any depth, and inside every string."""
    if is_secret_key(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [redact(v) for v in value]
    if isinstance(value, BaseException):
        # Renderers would call str() on it later, past this processor.
        return f"{type(value).__name__}: {redact_text(str(value))}"
    return value


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: :func:`redact` every field of the event, the event name too."""
    for key, value in list(event.items()):
        event[key] = redact(value, key)
    return event


def shared_processors() -> list[Processor]:
    """The pipeline every event passes before rendering (also usable with ``capture_logs``).

    Redaction runs last, after tracebacks are rendered to text, so a secret quoted in an
    exception message is caught too.
    """
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        redact_secrets,
    ]


_HANDLER_NAME = "synckit"


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
    structlog.configure(
        processors=[*shared_processors(), renderer],
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
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # One line per HTTP request at INFO is noise next to synckit's own events.
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))


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
    """The context fields of a claimed job (``synckit.runtime.jobs.ClaimedJob``).

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
    "bind_claimed_job",
    "bind_claimed_job_in_task",
    "bind_job_context",
    "claimed_job_fields",
    "configure_logging",
    "is_secret_key",
    "job_context_fields",
    "redact",
    "redact_secrets",
    "redact_text",
    "shared_processors",
]
