"""From a classification to the exception that tells the runtime what to do (pure)."""

from __future__ import annotations

from synckit.errors.classify import Classification, ErrorClass
from synckit.errors.exceptions import (
    ApiError,
    ApiResponse,
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


# The same categories, for a failure the API answered: each one is also an ApiError.
class ApiRetryableError(ClassifiedError, ApiError):
    """A retryable failure the API answered (``.response`` holds what it said)."""


class ApiPermanentError(ClassifiedPermanentError, ApiError):
    """A failure the API answered that retrying cannot fix (``.response``)."""


class ApiRateLimited(RateLimited, ApiError):
    """A rate limit the API answered (``.response``)."""


class ApiNeedsReauth(NeedsReauth, ApiError):
    """Credentials the API refused (``.response``)."""


def exception_for(
    classification: Classification, response: ApiResponse | None = None
) -> HandlerOutcome:
    """The exception a handler raises for a failed call with this classification.

    Rate limits become :class:`RateLimited` (the whole resource is paced), auth failures
    :class:`NeedsReauth`, non-retryable classes a permanent error, the rest retryable.
    The classification travels with the exception, so the worker records the right class.
    With the ``response`` the API answered, the exception is also an
    :class:`~synckit.errors.exceptions.ApiError` carrying it.
    """
    error: HandlerOutcome
    if classification.error_class is ErrorClass.RATE_LIMITED:
        kind = RateLimited if response is None else ApiRateLimited
        error = kind(classification.reason, retry_after=classification.retry_after)
        error.classification = classification  # type: ignore[attr-defined]
    elif classification.error_class is ErrorClass.AUTH:
        error = (NeedsReauth if response is None else ApiNeedsReauth)(classification.reason)
    elif not classification.retryable:
        permanent = ClassifiedPermanentError if response is None else ApiPermanentError
        error = permanent(classification)
    else:
        error = (ClassifiedError if response is None else ApiRetryableError)(classification)
    if isinstance(error, ApiError) and response is not None:
        error.response = response
    return error
