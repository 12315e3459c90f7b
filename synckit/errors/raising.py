"""From a classification to the exception that tells the runtime what to do (pure)."""

from __future__ import annotations

from synckit.errors.classify import Classification, ErrorClass
from synckit.errors.exceptions import (
    HandlerOutcome,
    NeedsReauth,
    PermanentError,
    RateLimited,
    RetryableError,
)


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


def exception_for(classification: Classification) -> HandlerOutcome:
    """The exception a handler raises for a failed call with this classification.

    Rate limits become :class:`RateLimited` (the whole resource is paced), auth failures
    :class:`NeedsReauth`, non-retryable classes a permanent error, the rest retryable.
    The classification travels with the exception, so the worker records the right class.
    """
    if classification.error_class is ErrorClass.RATE_LIMITED:
        limited = RateLimited(classification.reason, retry_after=classification.retry_after)
        limited.classification = classification  # type: ignore[attr-defined]
        return limited
    if classification.error_class is ErrorClass.AUTH:
        return NeedsReauth(classification.reason)
    if not classification.retryable:
        return ClassifiedPermanentError(classification)
    return ClassifiedError(classification)
