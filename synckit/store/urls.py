"""Which database a command opens, decided without importing SQLAlchemy: the CLI's
``--database-url`` option names :data:`ENV_URL` in its help, which ``synckit --help``
prints (reading or checking a URL is :mod:`synckit.store.db`'s)."""

from __future__ import annotations

import os

DEFAULT_URL = "sqlite:///synckit.db"
ENV_URL = "SYNCKIT_DATABASE_URL"


def database_url_from_env(explicit: str | None = None) -> str:
    """The URL to use: the explicit one, else ``$SYNCKIT_DATABASE_URL``, else the default."""
    return explicit or os.environ.get(ENV_URL) or DEFAULT_URL


__all__ = ["DEFAULT_URL", "ENV_URL", "database_url_from_env"]
