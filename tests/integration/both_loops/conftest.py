"""The tests here run on asyncio's own event loop and on uvloop's: the one uvicorn runs
by default, and so the one of many web apps that call synckit (``App.context``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
