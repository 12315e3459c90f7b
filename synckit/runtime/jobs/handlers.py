"""Job handlers: registration by kind, what a handler receives, and how it steers its job.

A handler is ``async def handler(ctx: JobContext) -> None``. Returning means success.
Raising :class:`Snooze`, :class:`Cancel` or :class:`Discard` ends the attempt that way;
any other exception is a failure, classified and retried by the errors rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog

from synckit.connectors.schedule import MAX_INTERVAL, cron_problem
from synckit.errors.backoff import RetryPolicy
from synckit.errors.breaker import BreakerPolicy
from synckit.errors.exceptions import ConfigurationError
from synckit.errors.pace import PacePolicy
from synckit.store.db import Database
from synckit.store.jobs._base import ClaimedJob
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.outbox import NewMessage, _new_row

Handler = Callable[["JobContext"], Awaitable[None]]


@dataclass
class JobContext:
    """What a handler receives: its job, a bound logger, and follow-up enqueueing."""

    job: ClaimedJob
    worker_id: str
    log: Any
    followups: list[JobSpec] = field(default_factory=list)
    messages: list[NewMessage] = field(default_factory=list)
    #: Set by :meth:`progressed`: this attempt committed work of its own.
    made_progress: bool = False
    #: The database the worker runs this job on: a handler's writes go through it (on
    #: SQLite a second Database in the process would be a second writer contending for
    #: the file's one write lock). None outside a worker.
    db: Database | None = None

    def progressed(self) -> None:
        """Say that this attempt committed work (a poll cycle's page, say): should it fail
        afterwards, the failure does not spend an attempt, so a job is given up only
        after attempts that committed nothing."""
        self.made_progress = True

    def publish(
        self, topic: str, payload: Any, *, key: str | None = None, message_id: str | None = None
    ) -> None:
        """Add an outbox message, committed atomically with this job's success.

        The worker's outbox relay publishes it once that commit happens; if the job fails,
        the message never exists. ``message_id`` defaults to one derived from the job and
        the message's position, so a job that runs twice publishes the same ids.
        """
        msg_id = message_id or f"job-{self.job.id}-{len(self.messages)}"
        message = NewMessage(topic=topic, payload=payload, key=key, message_id=msg_id)
        _new_row(message, datetime.now().astimezone())  # refuse a bad message here
        self.messages.append(message)

    @property
    def payload(self) -> Any:
        return self.job.payload

    @property
    def attempt(self) -> int:
        """The attempt being made, from 1."""
        return self.job.attempts

    def enqueue(self, kind: str, payload: Any = None, **options: Any) -> None:
        """Enqueue a follow-up job, committed atomically with this job's success.

        If this job fails, is snoozed or loses its lease, the follow-up is never created.
        Options are those of :func:`synckit.store.jobs.enqueue`.
        """
        spec = JobSpec(kind=kind, payload={} if payload is None else payload, **options)
        spec.row(datetime.now().astimezone())  # validate now, in the handler, not at commit
        self.followups.append(spec)


@dataclass(frozen=True)
class HandlerSpec:
    kind: str
    func: Handler
    timeout: float
    max_attempts: int | None


@dataclass(frozen=True)
class Recurring:
    """A job enqueued on a schedule: a cron expression or a fixed interval."""

    name: str
    kind: str
    cron: str | None = None
    every: timedelta | None = None
    payload: Any = None
    priority: int = 0

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(f"recurring job {self.name!r}: give cron or every, not both")
        if self.cron is not None:
            from croniter import croniter  # cron jobs only: croniter is a tenth of a start-up

            problem = "bad cron" if not croniter.is_valid(self.cron) else cron_problem(self.cron)
            if problem is not None:
                raise ConfigurationError(f"recurring job {self.name!r}: {problem} {self.cron!r}")
        if self.every is not None and not timedelta(0) < self.every <= MAX_INTERVAL:
            raise ConfigurationError(
                f"recurring job {self.name!r}: the interval must be positive and at most "
                f"{MAX_INTERVAL.days}d"
            )

    @property
    def spec(self) -> str:
        return f"cron:{self.cron}" if self.cron else f"every:{self.every.total_seconds()}s"  # type: ignore[union-attr]

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (pure)."""
        if self.every is not None:
            step = self.every.total_seconds()
            # Ticks are aligned to the epoch, so every worker computes the same ones.
            n = int(moment.timestamp() // step) + 1
            return datetime.fromtimestamp(n * step, tz=moment.tzinfo)
        assert self.cron is not None
        from croniter import croniter

        nxt: datetime = croniter(self.cron, moment).get_next(datetime)
        return nxt


class Registry:
    """Handlers by kind, and recurring jobs.

    >>> registry = Registry()
    >>> @registry.handler("send_invoice", timeout=30)
    ... async def send_invoice(ctx: JobContext) -> None: ...
    """

    def __init__(
        self,
        *,
        retry_policy: RetryPolicy | None = None,
        breaker_policy: BreakerPolicy | None = None,
    ) -> None:
        #: Policies workers running this registry use unless given their own.
        self.retry_policy = retry_policy
        self.breaker_policy = breaker_policy
        #: A more specific retry policy for one job, or None for the worker's own: an
        #: :class:`~synckit.App` answers with the ``retry_policy`` of the connector whose
        #: work a poll job is. Called as the worker records a failure; must not do I/O.
        self.retry_policy_for: Callable[[ClaimedJob], RetryPolicy | None] | None = None
        #: The pace policy of a job's rate limits (a connector's ``pace``), else the worker's.
        self.pace_policy_for: Callable[[ClaimedJob], PacePolicy | None] | None = None
        self._handlers: dict[str, HandlerSpec] = {}
        self._recurring: dict[str, Recurring] = {}
        self.log = structlog.get_logger("synckit.jobs")

    def handler(
        self, kind: str, *, timeout: float = 300.0, max_attempts: int | None = None
    ) -> Callable[[Handler], Handler]:
        """Register the decorated coroutine function as the handler of ``kind``."""

        def register(func: Handler) -> Handler:
            self.add(kind, func, timeout=timeout, max_attempts=max_attempts)
            return func

        return register

    def add(
        self, kind: str, func: Handler, *, timeout: float = 300.0, max_attempts: int | None = None
    ) -> None:
        if kind in self._handlers:
            raise ConfigurationError(f"a handler for job kind {kind!r} is already registered")
        if timeout <= 0:
            raise ConfigurationError(f"handler {kind!r}: timeout must be positive")
        self._handlers[kind] = HandlerSpec(kind, func, timeout, max_attempts)

    def recurring(
        self,
        name: str,
        kind: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        payload: Any = None,
        priority: int = 0,
    ) -> None:
        """Enqueue a ``kind`` job on each tick of ``cron`` or ``every``, once per tick."""
        self._recurring[name] = Recurring(name, kind, cron, every, payload, priority)

    def get(self, kind: str) -> HandlerSpec | None:
        return self._handlers.get(kind)

    def attempt_limit(self, kind: str, stored: int) -> int:
        """How many attempts a job of ``kind`` gets: its handler's ``max_attempts`` when
        registered with one, else the job's own (``stored``). The worker gives up by it,
        and the console and CLI show it (one rule, so they agree)."""
        spec = self._handlers.get(kind)
        return spec.max_attempts if spec and spec.max_attempts is not None else stored

    @property
    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def schedules(self) -> list[Recurring]:
        return list(self._recurring.values())
