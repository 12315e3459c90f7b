"""Options shared by the ``synckit`` command and its subcommand modules.

A module of its own so that the subcommand modules (loaded lazily by ``synckit.cli``)
can import it at import time: importing ``synckit.cli`` itself from them would, under
``python -m synckit.cli``, run the CLI module a second time.
"""

from __future__ import annotations

import click

from synckit.runtime.db import ENV_URL

database_option = click.option(
    "--database-url",
    "database_url",
    envvar=ENV_URL,
    default=None,
    help=f"Database URL (default: ${ENV_URL}, else sqlite:///synckit.db).",
)

__all__ = ["database_option"]
