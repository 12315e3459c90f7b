"""structlog configuration: JSON lines off a terminal, readable console output on one.

Every event passes the redaction processor, so secrets never reach a log sink.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

SECRET_KEYS = re.compile(
    r"(access_token|refresh_token|id_token|client_secret|password|secret|authorization|api_key|token)$",
    re.IGNORECASE,
)
REDACTED = "***"


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace the values of secret-looking keys, at any depth, with ``***``."""
    for key, value in list(event.items()):
        event[key] = _redact(key, value)
    return event


def _redact(key: str, value: Any) -> Any:
    if isinstance(key, str) and SECRET_KEYS.search(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, dict):
        return {k: _redact(k, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact("", v) for v in value]
    return value


def configure_logging(*, json_lines: bool | None = None, level: int = logging.INFO) -> None:
    """Configure structlog for a synckit process (the CLI calls this once)."""
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
