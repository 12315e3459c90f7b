"""Every exception and warning synckit raises, in one module.

Every exception derives from :class:`SynckitError`, and each is importable from
``synckit``. The categories are named for what the runtime, or its caller, does with them::

    SynckitError
    ├── ConfigurationError              fix the configuration and rerun
    │   ├── SecretUnavailable           a stored secret no configured key opens
    │   ├── SecretCorrupt               a stored secret (or its row) is damaged
    │   ├── ConnectionNotFound          no connection row for the tenant
    │   ├── ConnectionExists            one exists already (a concurrent add)
    │   ├── RecordsSchemaError          a records table ``db upgrade`` cannot bring in line
    │   └── ReplayBlocked               a dead letter cannot be replayed *here* (keys, App)
    ├── DatabaseError                   the database cannot be used
    │   └── DatabaseUnavailable         cannot connect right now: retried with backoff
    ├── JobError                        a job operation was refused
    │   ├── JobNotFound
    │   ├── JobStateError               not in a state that allows it (running...)
    │   └── PayloadError                a payload that cannot be stored as JSON
    ├── TenantError                     a tenant operation was refused
    │   └── TenantNotFound
    ├── DlqError                        a dead-letter operation was refused
    │   ├── DeadLetterNotFound
    │   └── Unreplayable                a replayer's verdict: this row never replays
    ├── OutboxError                     an outbox operation was refused
    │   ├── OutboxPayloadError          a message that cannot be stored
    │   ├── OutboxMessageNotFound
    │   └── OutboxStateError            its status does not allow the operation
    ├── AuthorizationRefused            the OAuth connect callback cannot complete
    ├── AlertDeliveryError              a sink could not deliver an alert
    └── HandlerOutcome                  raised by handlers to steer the runtime
        ├── Snooze                      put the job back for ``delay``, no attempt spent
        ├── Cancel                      end the job as cancelled
        ├── Discard                     end the job as discarded (no dead letter)
        ├── RetryableError              retry with backoff (or after ``retry_after``)
        │   ├── RateLimited             the resource is throttled: defer the resource
        │   │   └── ApiRateLimited      (+ ApiError) a 429 / spent quota from ctx.http
        │   ├── ClassifiedError         carries its Classification
        │   │   └── ApiRetryableError   (+ ApiError) a 5xx, a timeout... from ctx.http
        │   ├── TokenEndpointUnavailable  the OAuth token endpoint gave no answer
        │   ├── UnprovenUnauthorized    401s never proven to be the grant's
        │   ├── PublishFailed           the outbox's broker failed this time
        │   │   └── PublisherUnavailable  nor can it be reached at all
        │   └── IntentBusy              another worker holds the intent
        ├── NeedsReauth                 credentials refused: stop the connection
        │   └── ApiNeedsReauth          (+ ApiError) from ctx.http
        ├── PermanentError              never retry: dead-letter for review
        │   ├── ClassifiedPermanentError  carries its Classification
        │   │   └── ApiPermanentError   (+ ApiError) a 4xx from ctx.http
        │   ├── PublishRejected         the broker refused the message for good
        │   ├── IntentConflict          an intent key reused with another request
        │   └── ListingOrderError       a listing in neither order
        └── ApiError                    the API answered a failure: ``.response`` holds
                                        its status, headers and a redacted body
                                        excerpt; each is also one of the three above

    UserWarning
    ├── InsecureTokenStorageWarning     tokens stored unencrypted (a dev setting)
    └── NothingDueWarning               ``run_until_idle`` ran nothing: jobs wait later

httpx and SQLAlchemy errors are translated into these at one seam each
(``synckit.errors.classify`` and ``synckit.store.db``), with ``raise ... from``. Not
here: control-flow exceptions private to one module (``_Refused``...), the CLI's
``CliError`` (a ``click.ClickException``) and the console's form errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synckit.errors.classify import Classification


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


# --- handler outcomes a handler raises to steer its job ------------------------------


class Snooze(HandlerOutcome):
    """Put the job back to sleep for ``delay`` without counting the attempt."""

    def __init__(self, delay: timedelta) -> None:
        super().__init__(f"snoozed for {delay}")
        self.delay = delay


class Cancel(HandlerOutcome):
    """End the job as cancelled (it should not have run: the thing it was for is gone)."""

    def __init__(self, reason: str = "cancelled by handler") -> None:
        super().__init__(reason)
        self.reason = reason


class Discard(HandlerOutcome):
    """End the job as discarded (it is not worth doing), without dead-lettering it."""

    def __init__(self, reason: str = "discarded by handler") -> None:
        super().__init__(reason)
        self.reason = reason


# --- configuration ----------------------------------------------------------------


class SecretUnavailable(ConfigurationError):
    """A stored secret cannot be opened with the configured keys.

    ``key_id`` names the key it was sealed with when that is known (the key the
    environment lacks), else ``None``."""

    def __init__(self, message: str, *, key_id: str | None = None) -> None:
        super().__init__(message)
        self.key_id = key_id


class SecretCorrupt(ConfigurationError):
    """A stored secret, or the row holding it, is damaged: no key opens it (not JSON, a
    config that is not an object, bytes in no known format, a seal its own key cannot
    open). Unlike :class:`SecretUnavailable`, the keys are not the problem: the worker
    holds only the row's tenant and runs the others."""


class ConnectionNotFound(ConfigurationError):
    """No connection row for the tenant (create the tenant first)."""


class ConnectionExists(ConfigurationError):
    """A connection row for the tenant exists already (a concurrent add)."""


class RecordsSchemaError(ConfigurationError):
    """A declared records table that ``db upgrade`` cannot bring to its declaration."""


class ReplayBlocked(ConfigurationError):
    """Raised by a replayer: this row cannot be replayed *here*, because of configuration
    (``$SYNCKIT_SECRET_KEY`` unset or wrong, no App) and not because of the row itself.

    The processor leaves such a row as it was (an operator's replay gives it back
    unchanged; an automatic one tries again later without spending an attempt): a row is
    never ignored, resolved or consumed for a reason that is not about it. Any
    :class:`~synckit.errors.exceptions.ConfigurationError` a replayer raises counts as this."""


# --- refused operations -----------------------------------------------------------


class PayloadError(JobError):
    """A job payload that cannot be stored as JSON."""


class TenantError(SynckitError):
    """A tenant operation was refused (it exists already, it is not paused, ...)."""


class TenantNotFound(TenantError):
    """No tenant has the given name."""


class DlqError(SynckitError):
    """A dead-letter operation was refused."""


class DeadLetterNotFound(DlqError):
    """No dead letter has the given id."""


class Unreplayable(DlqError):
    """Raised by a replayer: this row can never be replayed (unknown connector, a payload
    of the wrong shape...). The row is marked ``ignored`` with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class OutboxError(SynckitError):
    """An outbox operation was refused."""


class OutboxPayloadError(OutboxError):
    """A message that cannot be stored: payload not JSON-serialisable, bad topic, key or id."""


class OutboxMessageNotFound(OutboxError):
    """No outbox message has the given id."""


class OutboxStateError(OutboxError):
    """The message's status does not allow the operation (retrying a published message)."""


class AuthorizationRefused(SynckitError):
    """The callback cannot complete a connection (wrong or used state, consent refused,
    the provider refused the code). The message is one line, without secrets.

    ``final`` is true when the flow is over (the user or the provider said no); false
    when only this callback was wrong (its state), so a listener keeps waiting.
    """

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


class AlertDeliveryError(SynckitError):
    """A sink could not deliver an alert."""


# --- handler outcomes the runtime raises ------------------------------------------


class ClassifiedError(RetryableError):
    """A retryable failure that carries its classification (the runtime keeps the class)."""

    def __init__(self, classification: Classification) -> None:
        super().__init__(classification.reason, retry_after=classification.retry_after)
        self.classification = classification


class ClassifiedPermanentError(PermanentError):
    """A failure that retrying cannot fix, with its classification (validation, 403, 404)."""

    def __init__(self, classification: Classification) -> None:
        super().__init__(classification.reason)
        self.classification = classification


class ApiRetryableError(ClassifiedError, ApiError):
    """A retryable failure the API answered (``.response`` holds what it said)."""


class ApiPermanentError(ClassifiedPermanentError, ApiError):
    """A failure the API answered that retrying cannot fix (``.response``)."""


class ApiRateLimited(RateLimited, ApiError):
    """A rate limit the API answered (``.response``)."""


class ApiNeedsReauth(NeedsReauth, ApiError):
    """Credentials the API refused (``.response``)."""


class TokenEndpointUnavailable(RetryableError):
    """The token endpoint could not give an answer (unreachable, 5xx, 429, garbage)."""


class UnprovenUnauthorized(RetryableError):
    """The API kept answering 401, but never to a token minted for the request: no proof
    that the grant is gone, so the request is retried later instead."""


class PublishFailed(RetryableError):
    """Publishing failed for now (broker down, connection lost, timeout): retry later."""


class PublisherUnavailable(PublishFailed):
    """The publisher cannot reach its broker at all; nothing was attempted."""


class PublishRejected(PermanentError):
    """The broker refused this message for good (unroutable, too large, nacked)."""


class IntentConflict(PermanentError):
    """The intent key was used before with a different request."""


class IntentBusy(RetryableError):
    """Another worker has held the intent for longer than this run could wait."""


class ListingOrderError(PermanentError):
    """A listing that is neither ascending nor descending by its update time, or not in
    the order declared (or found before) for its stream. Retrying cannot help: the query
    or the declaration is wrong, so the cycle fails rather than skip records quietly."""


# --- warnings ---------------------------------------------------------------------


class InsecureTokenStorageWarning(UserWarning):
    """Tokens are being stored unencrypted (``SYNCKIT_INSECURE_DEV_TOKENS=1``)."""


class NothingDueWarning(UserWarning):
    """``run_until_idle`` ran nothing while jobs wait for a later time on its clock."""
