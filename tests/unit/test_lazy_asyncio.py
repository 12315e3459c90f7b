"""SQLAlchemy's asyncio extension without its ORM until asked (synckit/store/lazy_asyncio.py):
the store's modules load no ORM, and a program that wants ``AsyncSession`` gets
SQLAlchemy's own package, whole. Each case runs in a fresh interpreter, since the
finder acts on a package's first import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_store_runs_a_statement_without_loading_the_orm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lazy.db'}"
    out = _run(
        f"""
        import asyncio, sys
        from synckit.store import outbox  # noqa: F401
        from synckit.store.jobs import admin, claiming, enqueueing, leasing, outcomes  # noqa: F401
        from synckit.store.db import open_database

        async def main():
            db = await open_database({url!r})
            async with db.engine.connect() as conn:
                from sqlalchemy import text
                print((await conn.execute(text("select 41 + 1"))).scalar())
            await db.dispose()

        asyncio.run(main())
        print("sqlalchemy.orm" in sys.modules)
        """
    )
    assert out.splitlines() == ["42", "False"]


def test_asking_for_the_orm_gives_sqlalchemys_own_package() -> None:
    out = _run(
        """
        import sys
        import synckit.store.jobs.claiming, synckit.store.jobs.enqueueing  # noqa: F401
        import synckit.store.jobs.leasing, synckit.store.jobs.outcomes  # noqa: F401
        from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
        import sqlalchemy.ext.asyncio as package
        from sqlalchemy.ext.asyncio import engine, session
        print(AsyncSession is session.AsyncSession, AsyncEngine is engine.AsyncEngine)
        print(package.async_scoped_session.__module__, callable(async_sessionmaker))
        print("sqlalchemy.orm" in sys.modules, "__getattr__" in vars(package))
        """
    )
    assert out.splitlines() == [
        "True True",
        "sqlalchemy.ext.asyncio.scoping True",
        "True False",
    ]


def test_a_package_loaded_first_is_left_alone() -> None:
    out = _run(
        """
        import sys
        import sqlalchemy.ext.asyncio as first
        import synckit.store.jobs.claiming, synckit.store.jobs.enqueueing  # noqa: F401
        import synckit.store.jobs.leasing, synckit.store.jobs.outcomes  # noqa: F401
        from synckit.store import lazy_asyncio
        print(sys.modules["sqlalchemy.ext.asyncio"] is first, hasattr(first, "AsyncSession"))
        print(any(type(f).__module__ == lazy_asyncio.__name__ for f in sys.meta_path))
        """
    )
    assert out.splitlines() == ["True True", "False"]
