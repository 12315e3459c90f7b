"""What ``synckit demo`` sets up and watches: its files, the three tenants' plans, the
policies that fit minutes of real life in seconds, the story told so far
(:class:`Story`) and the runtime's tables as the live display reads them
(:func:`read_snapshot`)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from synckit.errors import BreakerPolicy, RetryPolicy
from synckit.examples.graph_mail.reads import DemoReader, snapshot_rows
from synckit.store.audit import RETRIED_PREFIX
from synckit.store.records.statements import live_keys

if TYPE_CHECKING:
    from synckit.examples.graph_mail.simulator import GraphSimulator

DB_FILE = "synckit-demo.db"
LOG_FILE = "synckit-demo.log"
#: The key the demo made (when ``$SYNCKIT_SECRET_KEY`` was unset), kept beside its database
#: so that every console action and command works on that database afterwards.
KEY_FILE = "synckit-demo.key"
DB_URL = f"sqlite:///{DB_FILE}"
APP_SPEC = "synckit.examples.graph_mail.app:app"
SENDS_PER_TENANT = 3
LOST_SEND_RATE = 0.5
FABRIKAM_RETRY_AFTER = 1
RECOVERED_THROTTLE_RATE = 0.1
TICK = 0.3

# What the demo asks of the runtime, so that minutes of real life fit in seconds.
DEMO_RETRY = RetryPolicy(
    base=timedelta(seconds=0.5), cap=timedelta(seconds=2), floor=timedelta(seconds=0.25)
)
DEMO_BREAKER = BreakerPolicy(
    failure_threshold=4,
    cooldown=timedelta(seconds=2),
    cooldown_cap=timedelta(seconds=4),
    probe_timeout=timedelta(seconds=30),
)


@dataclass(frozen=True)
class _Plan:
    tenant: str
    role: str
    story: str
    messages: int
    malformed: int
    mailbox: dict[str, Any] = field(default_factory=dict)


PLANS = (
    _Plan(
        "contoso",
        "healthy",
        "healthy; its delta token expires mid-run while a message is deleted",
        messages=40,
        malformed=2,
    ),
    _Plan(
        "fabrikam",
        "throttled hard",
        "throttled hard (40% of requests: 429 Retry-After), then a 503 outage",
        messages=40,
        malformed=1,
        mailbox={
            "throttled_hard": True,
            "retry_after": FABRIKAM_RETRY_AFTER,
            "server_error_rate": 0.05,
        },
    ),
    _Plan(
        "northwind",
        "consent revoked",
        "its admin revokes the app's consent mid-run",
        messages=20,
        malformed=1,
    ),
)
HEALTHY, THROTTLED, REVOKED = (p.tenant for p in PLANS)


def example_module() -> ModuleType:
    """``synckit.examples.graph_mail``, which ships inside the package."""
    import synckit.examples.graph_mail as example

    return example


def well_formed(sim: GraphSimulator, tenant: str) -> set[str]:
    """The ids of ``tenant``'s messages that can land (the malformed ones cannot)."""
    malformed = set(sim.mailbox(tenant).malformed_ids)
    return {m["id"] for m in sim.messages(tenant)} - malformed


# --- what the database says -------------------------------------------------------------------


@dataclass
class Snapshot:
    """The runtime's tables, read while the worker runs (and once more at the end)."""

    status: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    breaker: dict[str, tuple[str, Any]] = field(default_factory=dict)
    cursor: dict[str, Any] = field(default_factory=dict)
    synced: dict[str, set[str]] = field(default_factory=dict)
    dlq: Counter[str] = field(default_factory=Counter)
    sends_done: Counter[str] = field(default_factory=Counter)
    retried: dict[str, Counter[str]] = field(default_factory=dict)

    def delta_done(self, tenant: str) -> bool:
        cursor = self.cursor.get(tenant)
        return isinstance(cursor, dict) and "deltaLink" in cursor


def resource_tenant(key: str) -> str:
    return key.split(":", 1)[1] if ":" in key else key


def landed_ids(conn: Any) -> dict[str, set[str]]:
    """The ids of the messages landed (not deleted) per tenant."""
    spec = example_module().MESSAGES.spec
    return {t: {k[0] for k in keys} for t, keys in live_keys(conn, spec).items()}


def read_snapshot(reader: DemoReader, synced_ids: Callable[[Any], dict[str, set[str]]]) -> Snapshot:
    """The tables the live display shows, read while the worker runs (by a plain SQLite
    reader: in WAL mode it never blocks the worker's writes); ``synced_ids`` reads the
    example's messages on the same connection."""
    rows, synced = reader.read(lambda c: (snapshot_rows(c), synced_ids(c)))
    s = Snapshot()
    for r in rows.connections:
        s.status[r.tenant] = (r.status, r.status_reason)
    for r in rows.resources:
        if not r.resource_key.startswith("api:"):
            s.breaker[resource_tenant(r.resource_key)] = (r.state, r.opened_at)
    for r in rows.checkpoints:
        s.cursor[r.tenant] = r.cursor
    s.synced = synced
    for tenant, n in rows.dead_letters:
        s.dlq[tenant] = n
    for tenant, n in rows.sends_done:
        s.sends_done[tenant] = n
    for r in rows.audit:
        counts = s.retried.setdefault(r.tenant, Counter())
        for k, v in (r.failed_by_class or {}).items():
            if k.startswith(RETRIED_PREFIX):
                counts[k[len(RETRIED_PREFIX) :]] += int(v)
    return s


@dataclass
class Story:
    """The scripted events and what the monitor has seen happen."""

    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    openings: dict[str, set[Any]] = field(default_factory=lambda: defaultdict(set))
    outage_started: float | None = None
    emit: Callable[[float, str], None] = lambda _at, _text: None

    def at(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        moment = self.at()
        self.events.append((moment, text))
        self.emit(moment, text)

    def once(self, name: str) -> bool:
        if name in self.done:
            return False
        self.done.add(name)
        return True
