"""Subscriptions a provider needs before it sends webhooks, and when to renew them.

Some providers push changes only while a subscription lives: Microsoft Graph's change
notifications expire within about three days and must be renewed. A connector says so
in its webhook declaration and implements three hooks::

    class GraphMail(Connector[GraphMailConfig]):
        webhooks = Webhooks(
            verify=GraphNotifications(secret_field="client_state"),
            subscription=Subscription(lifetime=timedelta(minutes=4230)),
        )

        async def create_subscription(
            self, ctx: SyncContext, request: SubscriptionRequest
        ) -> ProviderSubscription: ...
        async def renew_subscription(
            self, ctx: SyncContext, current: ProviderSubscription, expires_at: datetime
        ) -> ProviderSubscription: ...
        async def delete_subscription(
            self, ctx: SyncContext, current: ProviderSubscription
        ) -> None: ...

The runtime (:mod:`synckit.runtime.sync.subscriptions`) creates one subscription per tenant and
subscribed stream on first need, renews it before it expires, recreates it when the
provider no longer knows it (a 404 on renewal), deletes it when the tenant is paused,
and marks it ``lapsed`` (or ``failed``, if it was never created) after repeated
failures: the stream then relies on its poll schedule, which never stops.

The decisions here are pure (values in, values out; the clock and the random draw are
arguments): :func:`renew_at` and :func:`after_failure`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from synckit.errors.backoff import backoff_delay
from synckit.errors.exceptions import ConfigurationError

__all__ = [
    "ACTIVE",
    "FAILED",
    "LAPSED",
    "PENDING",
    "STATES",
    "AfterFailure",
    "ProviderSubscription",
    "Subscription",
    "SubscriptionRequest",
    "after_failure",
    "check_stream_names",
    "renew_at",
]

#: ``pending``: not created yet (first attempts); ``active``: the provider has it;
#: ``lapsed``: it was active, and renewing failed or it expired; ``failed``: creating it
#: failed. Lapsed and failed subscriptions are tried again every ``retry_lapsed``.
PENDING, ACTIVE, LAPSED, FAILED = "pending", "active", "lapsed", "failed"
STATES = (PENDING, ACTIVE, LAPSED, FAILED)


@dataclass(frozen=True)
class Subscription:
    """How a connector's webhook subscriptions live.

    ``lifetime``: the expiry asked for at each create and renewal (the provider may grant
    less: its answer is what is stored). A subscription is renewed at ``renew_fraction``
    of the lifetime it was granted, or ``renew_before`` its expiry, whichever comes
    first. A failed create or renewal is retried with backoff from ``retry_base``; after
    ``max_failures`` in a row (or once it has expired) an active subscription is
    ``lapsed`` and a pending one ``failed``, and then it is tried again every
    ``retry_lapsed``. ``streams``: the streams subscribed to, one subscription each
    (default: those the :class:`~synckit.connectors.webhooks.Webhooks` triggers, else
    every stream).
    """

    lifetime: timedelta = timedelta(days=2)
    renew_fraction: float = 2 / 3
    renew_before: timedelta = timedelta(hours=6)
    max_failures: int = 5
    retry_base: timedelta = timedelta(minutes=1)
    retry_lapsed: timedelta = timedelta(hours=1)
    streams: Sequence[str] | None = None

    def __post_init__(self) -> None:
        zero = timedelta(0)
        for name in ("lifetime", "retry_base", "retry_lapsed"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= zero:
                raise ConfigurationError(f"Subscription.{name} must be a positive timedelta")
        if not isinstance(self.renew_before, timedelta) or self.renew_before < zero:
            raise ConfigurationError("Subscription.renew_before must be a timedelta >= 0")
        if not (isinstance(self.renew_fraction, int | float) and 0 < self.renew_fraction <= 1):
            raise ConfigurationError("Subscription.renew_fraction must be in (0, 1]")
        if not isinstance(self.max_failures, int) or self.max_failures < 1:
            raise ConfigurationError("Subscription.max_failures must be at least 1")
        check_stream_names(self.streams, "Subscription")


def check_stream_names(streams: Sequence[str] | None, owner: str) -> None:
    """``owner``'s ``streams`` is None (every stream) or a list of stream names: a
    :class:`ConfigurationError` otherwise (a lone string, say)."""
    if streams is None:
        return
    if isinstance(streams, str) or not all(isinstance(s, str) for s in streams):
        raise ConfigurationError(f"{owner}.streams must be a list of stream names")


@dataclass(frozen=True)
class SubscriptionRequest:
    """What ``create_subscription`` is asked to create: notifications for ``stream`` sent
    to ``notification_url``, carrying ``client_state`` (the tenant's verifier secret, from
    its sealed config), expiring at ``expires_at``."""

    tenant: str
    stream: str
    notification_url: str
    client_state: str
    expires_at: datetime


@dataclass(frozen=True)
class ProviderSubscription:
    """A subscription as the provider knows it: its id and when it expires."""

    id: str
    expires_at: datetime


def renew_at(renewed_at: datetime, expires_at: datetime, policy: Subscription) -> datetime:
    """When to renew a subscription created or renewed at ``renewed_at`` and expiring at
    ``expires_at``: at ``renew_fraction`` of that span or ``renew_before`` the expiry,
    whichever is earlier, and never before ``renewed_at``."""
    span = max(expires_at - renewed_at, timedelta(0))
    at = min(renewed_at + span * policy.renew_fraction, expires_at - policy.renew_before)
    return max(at, renewed_at)


@dataclass(frozen=True)
class AfterFailure:
    """What a failed create or renewal leaves: the state, and when to try again."""

    state: str
    retry_at: datetime


def after_failure(
    state: str,
    failures: int,
    expires_at: datetime | None,
    now: datetime,
    uniform: float,
    policy: Subscription,
) -> AfterFailure:
    """The state after the ``failures``-th failure in a row of a subscription in ``state``.

    An active one stays active while retries remain and it has not expired (retried
    with backoff, never later than its expiry); then it is ``lapsed``. A pending one
    stays pending while retries remain, then it is ``failed``. Lapsed and failed ones
    keep their state and are tried again after ``retry_lapsed``."""
    if state in (LAPSED, FAILED):
        return AfterFailure(state, now + policy.retry_lapsed)
    expired = state == ACTIVE and expires_at is not None and expires_at <= now
    if failures >= policy.max_failures or expired:
        return AfterFailure(LAPSED if state == ACTIVE else FAILED, now + policy.retry_lapsed)
    delay = backoff_delay(failures, uniform, base=policy.retry_base, cap=policy.retry_lapsed)
    retry = now + delay
    if state == ACTIVE and expires_at is not None:
        retry = min(retry, expires_at)
    return AfterFailure(state if state == ACTIVE else PENDING, retry)
