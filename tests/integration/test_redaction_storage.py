"""Secrets an API echoes, in every audited shape, reach no stored row, log line or alert
body (issue 16, deliver 2): a property test on both engines generates the secrets, puts
one in each shape of ``secret_shapes.SHAPES`` and sends them down every storage path that
writes error text -- the worker's recording (jobs, the breaker's resources row, the dead
job's dead letter), a poll cycle's failed records, the DLQ capture called directly, and
the outbox relay's refused messages -- then looks for them in every table, dumped whole,
in the SQLite file's bytes and in the logs."""

from __future__ import annotations

import io
import json
import string
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, generate_latest
from pydantic import BaseModel
from secret_shapes import SHAPES
from sqlalchemy import select

from synckit import App, BearerToken, Connector, Page, SyncContext
from synckit.errors import RetryPolicy
from synckit.errors.exceptions import PublishRejected
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.alert_rules import Alert
from synckit.runtime.observe.logging import configure_logging
from synckit.runtime.writes import outbox as outbox_store
from synckit.runtime.writes.outbox import CallbackPublisher, OutboxRelay
from synckit.store.db import Database
from synckit.store.dead_letters.capture import Failure, capture_many
from synckit.store.jobs import enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.outbox import OutboxMessage
from synckit.store.tables import dead_letters, metadata, resources
from synckit.testing import FakeAPI

NAMES = sorted(SHAPES)


def looks_like_a_secret(s: str) -> bool:
    """Upper, lower and digits mixed: a token, never a word or a number (which no
    pattern could tell from prose)."""
    return (
        any(c.isupper() for c in s) and any(c.islower() for c in s) and any(c.isdigit() for c in s)
    )


#: One generated token-like secret per shape, all different.
SECRET = st.text(alphabet=string.ascii_letters + string.digits, min_size=16, max_size=40).filter(
    looks_like_a_secret
)
SECRETS = st.lists(SECRET, min_size=len(NAMES), max_size=len(NAMES), unique=True)
# Five examples of 29 secrets each; no shrinking (a failure names the shapes that leaked,
# and shrinking 29 strings through a database would take minutes).
PROPERTY = settings(
    max_examples=5,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


# --- a connector whose records fail with an echoed secret -------------------------------------


class LeakyConfig(BaseModel):
    api_token: str


class Leaky(Connector[LeakyConfig]):
    """One page of records; handling record ``n`` raises the text ``fail[n]``."""

    name = "leaky"
    auth = BearerToken("api_token")
    fail: ClassVar[list[str]] = []

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        body = (await ctx.http.get("/items")).json()
        yield Page(body["items"], checkpoint={"done": True})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        raise ValueError(self.fail[record["n"]])


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeAPI, str]]:
    fake = FakeAPI()
    fake.route("GET", "/items", {"items": [{"id": f"r{n}", "n": n} for n in range(len(NAMES))]})
    async with fake.serve() as url:
        yield fake, url


# --- what is stored -----------------------------------------------------------------------------


async def wipe(db: Database) -> None:
    """Every table empty: each generated example starts from a fresh database."""
    async with db.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            await conn.execute(table.delete())


async def dump(db: Database) -> str:
    """Every row of every synckit table, as text; and on SQLite the file's bytes (and its
    WAL), so a secret in a column no dump decodes, or in a freed page, counts too."""
    rows: list[dict[str, Any]] = []
    async with db.begin() as conn:
        for table in metadata.sorted_tables:
            rows += [{"table": table.name, **r._mapping} for r in await conn.execute(select(table))]
    text = json.dumps(rows, default=str)
    path = db.engine.url.database if db.engine.url.get_backend_name() == "sqlite" else None
    if path:
        for file in (Path(path), Path(path + "-wal")):
            if file.exists():
                text += file.read_bytes().decode("latin-1")
    return text


def leaked(secrets: Sequence[str], *texts: str) -> list[str]:
    return [NAMES[n] for n, s in enumerate(secrets) if any(s in t for t in texts)]


@PROPERTY
@given(secrets=SECRETS)
async def test_generated_secrets_in_every_shape_are_stored_and_logged_nowhere(
    db: Database, api: tuple[FakeAPI, str], secrets: list[str]
) -> None:
    """Each job fails with an error quoting its own generated secret in one shape (message
    and traceback): the worker records the failure (jobs, the resource's last error, a dead
    letter). Then a poll cycle's records fail with the same texts, the DLQ capture is
    called with them raw, and a broker refuses a message with each (a dead letter each).
    No table, no byte of the SQLite file and no log line holds any of the secrets."""
    await wipe(db)
    texts = [SHAPES[name](s) for name, s in zip(NAMES, secrets, strict=True)]
    reg = Registry()

    @reg.handler("leaky", max_attempts=1)
    async def leaky(ctx: JobContext) -> None:
        raise RuntimeError(texts[ctx.payload["n"]])

    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)
    try:
        specs = [JobSpec("leaky", {"n": n}, resource_key=f"leaky:{n}") for n in range(len(NAMES))]
        await enqueueing.enqueue_many(db, specs)
        worker = Worker(db, reg, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
        stats = await worker.run_until_idle()

        _, url = api
        app = App([type("Leaky", (Leaky,), {"base_url": url, "fail": texts})])
        await app.add_tenant(db, "acme", "leaky", {"api_token": "tok-acme"})
        await app.poll(db, "acme")

        # The DLQ's own capture, called directly with raw text (an app's own failures).
        async with db.begin() as conn:
            await capture_many(
                conn,
                [
                    Failure(
                        tenant="acme",
                        connector="direct",
                        kind="record:direct",
                        record_id=f"d{n}",
                        payload={"n": n},
                        error_class="validation",
                        message=text,
                        traceback=f"Traceback (most recent call last):\n  {text}",
                    )
                    for n, text in enumerate(texts)
                ],
                now=datetime.now(UTC),
            )

        # The outbox: a broker refuses each message with the secret in its reason.
        async def reject(m: OutboxMessage) -> None:
            raise PublishRejected(texts[m.payload["n"]])

        async with db.begin() as conn:
            for n in range(len(NAMES)):
                await outbox_store.add(conn, "orders", {"n": n}, message_id=f"m{n}")
        await OutboxRelay(db, CallbackPublisher(reject)).relay_batch()
    finally:
        configure_logging(json_lines=True, stream=io.StringIO())

    # Every path did write its row, so the secrets had somewhere to leak.
    assert stats.dead == len(NAMES)
    async with db.begin() as conn:
        stored = [r._mapping for r in await conn.execute(select(dead_letters))]
        breakers = [r._mapping for r in await conn.execute(select(resources))]
    assert sum(1 for r in stored if r["record_id"].startswith("job:")) == len(NAMES)
    assert sum(1 for r in stored if r["kind"] == "record:default") == len(NAMES)
    assert sum(1 for r in stored if r["kind"] == "record:direct") == len(NAMES)
    assert sum(1 for r in stored if r["connector"] == "outbox") == len(NAMES)
    assert sum(1 for r in breakers if r["last_error"]) >= len(NAMES)

    assert leaked(secrets, await dump(db)) == []
    assert leaked(secrets, out.getvalue()) == []
    # The metrics this process exposes (what `synckit worker --metrics-port` serves).
    exposition = generate_latest(REGISTRY).decode()
    assert "synckit_" in exposition and '"leaky"' in exposition  # this run's series
    assert leaked(secrets, exposition) == []


@settings(max_examples=25, deadline=None)
@given(secrets=SECRETS)
def test_alert_bodies_are_redacted(secrets: list[str]) -> None:
    """What a webhook receives (Alert.to_json) carries no secret in message or details."""
    for name, secret in zip(NAMES, secrets, strict=True):
        text = SHAPES[name](secret)
        alert = Alert("r", "s", text, datetime.now(UTC), "w", details={"reason": text})
        assert secret not in json.dumps(alert.to_json()), name
