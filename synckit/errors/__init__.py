"""Error handling decisions: classification, Retry-After parsing, backoff, circuit breaker.

Everything here is pure: values in, frozen dataclasses out, no I/O, no logging. The
exceptions themselves are in :mod:`synckit.errors.exceptions` (importable from
``synckit``).
"""

from synckit.errors.backoff import (
    RetryDecision,
    RetryPolicy,
    is_testing,
    retry_delay,
    set_testing,
)
from synckit.errors.breaker import (
    BreakerOutcome,
    BreakerPolicy,
    BreakerSnapshot,
    BreakerState,
    breaker_claim_probe,
    breaker_open,
    breaker_outcome,
    breaker_transition,
    global_breaker_trips,
    reopen_cooldown,
)
from synckit.errors.classify import (
    DEFAULT_MAX_ATTEMPTS,
    BodyRule,
    Classification,
    ClassifyRules,
    ErrorClass,
    classify,
)
from synckit.errors.error_body import ErrorBody, ErrorDescription
from synckit.errors.headers import (
    MAX_WAIT,
    HeadersLike,
    RateLimitInfo,
    parse_rate_limit,
    parse_retry_after,
    server_wait,
    server_wait_signal,
)
from synckit.errors.pace import (
    PaceDecision,
    PacePolicy,
    Slot,
    default_pace,
    pace_decision,
    quota_rate,
    reserve_slot,
    reserve_slots,
)
from synckit.errors.waits import DEFAULT_MAX_WAIT, clamp_wait, moment_after, seconds_wait

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_WAIT",
    "MAX_WAIT",
    "BodyRule",
    "BreakerOutcome",
    "BreakerPolicy",
    "BreakerSnapshot",
    "BreakerState",
    "Classification",
    "ClassifyRules",
    "ErrorBody",
    "ErrorClass",
    "ErrorDescription",
    "HeadersLike",
    "PaceDecision",
    "PacePolicy",
    "RateLimitInfo",
    "RetryDecision",
    "RetryPolicy",
    "Slot",
    "breaker_claim_probe",
    "breaker_open",
    "breaker_outcome",
    "breaker_transition",
    "clamp_wait",
    "classify",
    "default_pace",
    "global_breaker_trips",
    "is_testing",
    "moment_after",
    "pace_decision",
    "parse_rate_limit",
    "parse_retry_after",
    "quota_rate",
    "reopen_cooldown",
    "reserve_slot",
    "reserve_slots",
    "retry_delay",
    "seconds_wait",
    "server_wait",
    "server_wait_signal",
    "set_testing",
]
