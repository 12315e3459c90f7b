"""From a classification to the exception that tells the runtime what to do (pure)."""

from __future__ import annotations

from synckit.errors.classify import Classification, ErrorClass
from synckit.errors.exceptions import (
    ApiError,
    ApiNeedsReauth,
    ApiPermanentError,
    ApiRateLimited,
    ApiResponse,
    ApiRetryableError,
    ClassifiedError,
    ClassifiedPermanentError,
    HandlerOutcome,
    NeedsReauth,
    RateLimited,
)

# The same categories, for a failure the API answered: each one is also an ApiError.


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
