"""``synckit web``: an operator console for tenants, jobs, dead letters and the outbox.

Server-rendered with Starlette and Jinja2, live parts polled by htmx (vendored in
``static/``, no build step), served by uvicorn; install with the ``web`` extra. It reads
and changes the database only through the storage modules' named operations (and the
few reads of :mod:`synckit.web.queries`), exactly as the CLI does.
"""

from synckit.web.app import WebConfig, create_app

__all__ = ["WebConfig", "create_app"]
