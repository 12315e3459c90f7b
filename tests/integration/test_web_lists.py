"""Issue 34's lists, on SQLite and PostgreSQL through Starlette's TestClient: what a row
shows agrees with its state (no "next retry" once resolved), internal job kinds are
hidden unless asked for, pages carry totals and a previous link, attempt counts are the
worker's, and the queue's depth has a history."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from typing import Any

from starlette.testclient import TestClient
from web_app import app, seed

from synckit.store.db import Database
from synckit.web import WebConfig, create_app
from synckit.web.app import CSRF_COOKIE

LOCAL = "http://127.0.0.1"


@contextmanager
def console(url: str) -> Iterator[TestClient]:
    with TestClient(
        create_app(WebConfig(database_url=url, app=app)), base_url=LOCAL, follow_redirects=False
    ) as c:
        yield c


def post(client: TestClient, path: str, **form: Any) -> Any:
    if not client.cookies.get(CSRF_COOKIE):
        client.get("/login")
    return client.post(path, data={"csrf": client.cookies.get(CSRF_COOKIE), **form})


def text_of(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


async def test_a_resolved_dead_letter_shows_no_next_retry(db: Database, migrated_url: str) -> None:
    seeded = await seed(db)
    a0, a1 = seeded["dead_letters"][:2]
    with console(migrated_url) as client:
        assert "next retry" in text_of(client.get(f"/dlq/{a0}").text)
        assert post(client, "/dlq/action", action="resolve", ids=[str(a0)]).status_code == 303
        resolved = text_of(client.get(f"/dlq/{a0}").text)
        assert "resolved" in resolved and "next retry" not in resolved
        assert "next retry" in text_of(client.get(f"/dlq/{a1}").text)
