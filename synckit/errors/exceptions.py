"""The synckit exception tree.

Every exception synckit raises derives from :class:`SynckitError`. The
categories are named for what the runtime does with them::

    SynckitError
    ├── ConfigurationError        bad URL, bad config, unknown connector: fix and rerun
    ├── DatabaseError             the database cannot be used
    │   └── DatabaseUnavailable   cannot connect right now: retried with backoff
    ├── JobError                  a job operation was refused (not found, running, bad payload)
    │   ├── JobNotFound
    │   └── JobStateError
    └── HandlerOutcome            raised by handlers to steer the runtime
        ├── RetryableError        retry with backoff (or after ``retry_after``)
        │   └── RateLimited       the resource is throttled: defer the whole resource
        ├── NeedsReauth           credentials refused: stop the connection, keep attempts
        ├── PermanentError        never retry: dead-letter for review
        └── ApiError              the API answered a failure: ``.response`` holds its
                                  status, headers and a redacted body excerpt; each one
                                  is also one of the three above (what the runtime does)

httpx and SQLAlchemy errors are translated into these at one seam each
(``synckit.errors.classify`` and ``synckit.store.db``), with ``raise ... from``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


class SynckitError(Exception):
    """Root of every error synckit raises."""


class ConfigurationError(SynckitError):
    """Configuration that cannot work: a bad URL, an invalid tenant config, a missing key."""


class DatabaseError(SynckitError):
    """The database cannot be used (unreachable, read-only, wrong schema)."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached right now; callers may retry with backoff."""


class JobError(SynckitError):
    """A job operation was refused."""


class JobNotFound(JobError):
    """No job has the given id."""


class JobStateError(JobError):
    """The job is in a state that does not allow the operation (for example, running)."""


class HandlerOutcome(SynckitError):
    """Base of the exceptions a handler raises to tell the runtime what happened."""


class RetryableError(HandlerOutcome):
    """The attempt failed but may succeed later.

    ``retry_after`` is a wait the server asked for; the runtime honours it (plus a buffer)
    instead of its computed backoff.
    """

    def __init__(self, message: str, *, retry_after: timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(RetryableError):
    """The resource is throttled; no job of the resource should call it before the wait ends.

    ``paced_until`` is set when the runtime has already paced the resource until that
    moment (``ctx.http`` records the rate-limit event before raising, or found the
    resource paced or its schedule full): the worker then only puts the job back until
    then, without recording another event. A handler raising its own ``RateLimited``
    leaves it None, and the worker records the event.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: timedelta | None = None,
        paced_until: datetime | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.paced_until = paced_until


class NeedsReauth(HandlerOutcome):
    """The connection's credentials were refused; a human must re-authorise it."""


class PermanentError(HandlerOutcome):
    """The work can never succeed as it is; retrying is pointless. It goes to the DLQ."""


#: The most of a failed response's body an :class:`ApiResponse` keeps (characters).
BODY_EXCERPT_LIMIT = 2048


@dataclass(frozen=True)
class ApiResponse:
    """What ``ctx.http`` keeps of a failed response, safe to log and store.

    ``headers`` (lower-case names) have credential values (``Set-Cookie``,
    ``Authorization``, ``X-Api-Key``...) masked; ``text`` is at most
    :data:`BODY_EXCERPT_LIMIT` characters of the body, decoded as UTF-8 (bad bytes
    replaced, control characters dropped) and redacted; ``truncated`` says the body was
    longer. ``url`` has no query string (it may carry a key).
    """

    status_code: int
    reason_phrase: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    text: str = ""
    truncated: bool = False
    method: str = ""
    url: str = ""

    def json(self) -> Any:
        """The body excerpt parsed as JSON; raises ``ValueError`` when it is not JSON
        (a truncated excerpt is not)."""
        return json.loads(self.text)


class ApiError(HandlerOutcome):
    """The API answered with a failure (a 4xx or 5xx, or a success a rule refused).

    Never raised on its own: every exception ``ctx.http`` raises for a failed response is
    an ``ApiError`` *and* the category that tells the runtime what to do
    (:class:`RetryableError`, :class:`RateLimited`, :class:`NeedsReauth` or
    :class:`PermanentError`), so a connector can catch either::

        try:
            await ctx.http.post("/v1/invoices", json=invoice)
        except ApiError as exc:
            if exc.status_code == 402 and exc.response.json()["error"]["code"] == "card_declined":
                ...

    Its message names the request and carries the provider's own words when the body
    had any (``POST https://api.example.com/v1/invoices: HTTP 402 Payment Required:
    card_error/card_declined: Your card has insufficient funds.``).
    """

    response: ApiResponse

    @property
    def status_code(self) -> int:
        """The response's status code."""
        return self.response.status_code
