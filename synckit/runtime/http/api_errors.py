"""A failed httpx response as an :class:`~synckit.errors.exceptions.ApiResponse`: what
``ctx.http``'s exceptions carry, bounded and redacted before anyone can log it."""

from __future__ import annotations

import re

import httpx

from synckit.errors.exceptions import BODY_EXCERPT_LIMIT, ApiResponse
from synckit.redaction import REDACTED, is_secret_key, redact_text

__all__ = ["api_response"]

# Redaction reads this much of the body before the excerpt is cut, so that a secret
# straddling the cut is seen whole (and masked) rather than half.
_REDACT_WINDOW = 4 * BODY_EXCERPT_LIMIT
_MAX_HEADERS = 100
_HEADER_VALUE_LIMIT = 1024
# Control characters other than tab and newline: a binary body shown as text.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _body_text(response: httpx.Response) -> tuple[str, bool]:
    try:
        content = response.content
    except httpx.ResponseNotRead:  # a streamed body nobody read: nothing to show
        return "", False
    window = content[:_REDACT_WINDOW]
    text = _CONTROL.sub("", window.decode("utf-8", "replace"))
    text = redact_text(text)
    truncated = len(content) > _REDACT_WINDOW or len(text) > BODY_EXCERPT_LIMIT
    return text[:BODY_EXCERPT_LIMIT], truncated


def api_response(response: httpx.Response) -> ApiResponse:
    """``response`` as a failed call's exception keeps it: never raises."""
    headers: dict[str, str] = {}
    for name, value in list(response.headers.items())[:_MAX_HEADERS]:
        name = name.lower()
        value = value[:_HEADER_VALUE_LIMIT]
        headers[name] = REDACTED if is_secret_key(name) else redact_text(value)
    text, truncated = _body_text(response)
    try:
        request = response.request
        method = request.method
        url = str(request.url.copy_with(query=None, fragment=None))
    except RuntimeError:  # a response built without a request
        method, url = "", ""
    return ApiResponse(
        status_code=response.status_code,
        reason_phrase=response.reason_phrase,
        headers=headers,
        text=text,
        truncated=truncated,
        method=method,
        url=url,
    )
