"""``synckit web``: an operator console for tenants, jobs, dead letters and the outbox.

Server-rendered with Starlette and Jinja2, live parts polled by htmx (vendored in
``static/``, no build step), served by uvicorn; install with the ``web`` extra. It reads
and changes the database only through the storage modules' named operations, the CLI's
where the CLI has the read (the console's own bounded counts and pages are
:mod:`synckit.store.console`'s and :mod:`synckit.store.pages`').
"""

from synckit.web.app import create_app
from synckit.web.base import WebConfig

__all__ = ["WebConfig", "create_app"]
