"""An App that names its own database (``$OWN_URL_APP_DATABASE``), for `synckit worker`
run with neither --database-url nor $SYNCKIT_DATABASE_URL."""

from __future__ import annotations

import os

from synckit import App
from synckit.runtime.jobs.handlers import JobContext

app = App(database_url=os.environ["OWN_URL_APP_DATABASE"], dlq_replay_every=None, alerts_every=None)


async def check(ctx: JobContext) -> None:
    # The worker opened the App's database without writing it into the environment.
    if "SYNCKIT_DATABASE_URL" in os.environ:
        raise RuntimeError("SYNCKIT_DATABASE_URL was set in the worker's environment")


app.registry.add("own_url.check", check, max_attempts=1)
