"""``--loop``: which event loop a command's core runs on."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from synckit.cli.options import CliError, loop_factory


def test_auto_and_uvloop_name_uvloops_loop_and_asyncio_asyncios_own() -> None:
    assert loop_factory("auto") is uvloop.new_event_loop
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("asyncio") is None
    factory = loop_factory("auto")
    assert factory is not None
    with asyncio.Runner(loop_factory=factory) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)


def test_without_uvloop_auto_falls_back_and_uvloop_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert loop_factory("auto") is None
    with pytest.raises(CliError, match=r"--loop uvloop: uvloop is not installed"):
        loop_factory("uvloop")
