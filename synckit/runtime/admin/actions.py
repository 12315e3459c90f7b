"""What the operator's commands (:mod:`synckit.cli`) and the console (:mod:`synckit.web`)
both do, beyond the stores' own operations.

* A tenant's poll cycle now (``synckit sync``, the console's "sync now",
  :func:`enqueue_cycles`): an ordinary ``synckit.poll`` job, with the unique key the
  scheduler uses (``poll:<tenant>:<stream>``, so never two at once) and the tenant's
  resource key, so breakers, pacing and in-flight limits apply to it exactly as to a
  scheduled cycle. A worker runs it.
* The ``OAuth2Config`` a tenant's connector authenticates with, for the connect flow
  (``synckit tenants connect``, the console's re-authorise; :func:`oauth_config_for`).
* What a replay without the application says of a record row (:data:`NO_APP_REASON`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from synckit.errors.exceptions import ConfigurationError
from synckit.runtime.admin.tenants import get_tenant
from synckit.runtime.credentials.oauth import OAuth2Auth, OAuth2Config
from synckit.runtime.sync.scheduler import poll_job_spec
from synckit.store.db import Database
from synckit.store.jobs.enqueueing import enqueue_many

if TYPE_CHECKING:
    from synckit.runtime.sync.context import ConnectorHost

__all__ = [
    "ENDED",
    "NO_APP_REASON",
    "CycleProgress",
    "enqueue_cycles",
    "oauth_config_for",
    "waiting_hint",
]

#: Why a replay without the application skips a record row.
NO_APP_REASON = "needs --app (no replayer for this kind without the application)"

#: The statuses a cycle job ends in.
ENDED = frozenset({"succeeded", "dead", "cancelled", "discarded"})


def waiting_hint(
    *,
    run_at: datetime | None,
    last_error: str | None,
    error_class: str | None,
    attempts: int,
    max_attempts: int,
    workers_alive: int,
    now: datetime,
) -> str:
    """What a pending cycle waits for, in words (``synckit sync --wait``'s hint): pure.

    Its retry time after an error, its first run time, or no worker to claim it; a due
    cycle with workers alive waits for its tenant (paced, breaker open, in-flight limit:
    ``synckit tenants show`` says which)."""
    later = run_at is not None and run_at > now
    if later and last_error:
        assert run_at is not None
        cause = f"{error_class}: {last_error}" if error_class else last_error
        said = (
            f"waiting to retry at {run_at.isoformat(timespec='seconds')} after "
            f"{cause[:200]} (attempt {attempts} of {max_attempts})"
        )
    elif later:
        assert run_at is not None
        said = f"due at {run_at.isoformat(timespec='seconds')}"
    else:
        said = "due now"
    if workers_alive == 0:
        return f"{said}; no worker is alive to claim it (`synckit worker --app ...`)"
    if later:
        return said
    return (
        f"{said}, not claimed yet by the {workers_alive} worker(s) alive: its tenant waits "
        "(paced, breaker open or in-flight limit; see `synckit tenants show`)"
    )


@dataclass
class CycleProgress:
    """What ``--wait`` shows of one cycle job."""

    stream: str
    job_id: int
    created: bool
    status: str = "pending"
    attempts: int = 0
    pages: int = 0
    last_error: str | None = None
    _checkpoint_at: datetime | None = field(default=None, repr=False)

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "job_id": self.job_id,
            "created": self.created,
            "status": self.status,
            "attempts": self.attempts,
            "pages": self.pages,
            "last_error": self.last_error,
        }


async def enqueue_cycles(
    db: Database, app: ConnectorHost, tenant: str, streams: Sequence[str] = ()
) -> tuple[str, list[CycleProgress]]:
    """Enqueue a cycle of each of ``streams`` (default: all) of ``tenant``, now.

    Returns the connector's name and one :class:`CycleProgress` per stream; a cycle
    already queued or running is reported (``created`` False) rather than doubled.
    """
    t = await get_tenant(db, tenant, reveal=False)  # enqueueing opens no secret
    cls = app.connector(t.connector)
    if t.status != "active":
        reason = f" ({t.status_reason})" if t.status_reason else ""
        hint = "synckit tenants reauth" if t.status == "needs_reauth" else "synckit tenants resume"
        raise ConfigurationError(
            f"tenant {tenant!r} is {t.status}{reason}: `{hint} {tenant}` first"
        )
    names = [cls.stream(s).name for s in streams] or [s.name for s in cls.declared_streams()]
    if not names:
        raise ConfigurationError(f"connector {cls.name!r} does not poll: nothing to sync")
    specs = [poll_job_spec(t.tenant, t.connector, s, t.resource_key) for s in names]
    enqueued = await enqueue_many(db, specs)
    return t.connector, [
        CycleProgress(stream=s, job_id=e.id, created=e.created)
        for s, e in zip(names, enqueued, strict=True)
    ]


async def oauth_config_for(app: ConnectorHost, db: Database, tenant: str) -> OAuth2Config:
    """The ``OAuth2Config`` of ``tenant``'s connector, as its auth builds it."""
    async with app.context(db, tenant) as ctx:
        auth = ctx.http.auth
    if not isinstance(auth, OAuth2Auth):
        raise ConfigurationError(
            f"tenant {tenant!r}: its connector does not authenticate with OAuth2Auth; "
            "change static credentials with `synckit tenants set-config`"
        )
    return auth.config
