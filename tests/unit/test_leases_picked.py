"""``leases.picked``: the rows a locking select picks, found by primary key on PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Update, select, update
from sqlalchemy.dialects import postgresql, sqlite

from synckit.store.leases import picked
from synckit.store.tables import jobs


def _claim(status: str) -> Update:
    pick = select(jobs.c.id).where(jobs.c.status == status).limit(5)
    pick = pick.with_for_update(skip_locked=True)
    return update(jobs).where(picked(jobs.c.id, pick)).values(status="running")


def test_postgresql_takes_the_ids_once_as_an_array_and_sqlite_as_in() -> None:
    pg = str(_claim("pending").compile(dialect=postgresql.dialect()))
    lite = str(_claim("pending").compile(dialect=sqlite.dialect()))
    assert "WHERE jobs.id = ANY (array((SELECT jobs.id" in pg, pg
    assert "FOR UPDATE SKIP LOCKED)))" in pg, pg
    # A condition as it is: no "= 1", which would keep SQLite from probing by rowid.
    assert "WHERE jobs.id IN (SELECT jobs.id" in lite and ") = 1" not in lite, lite


def test_statements_differing_in_their_select_do_not_share_a_cached_form() -> None:
    a, b = _claim("pending"), _claim("pending")
    other = update(jobs).where(picked(jobs.c.id, select(jobs.c.id).limit(5))).values(status="x")
    key = a._generate_cache_key()
    assert key == b._generate_cache_key()
    assert key != other._generate_cache_key()
