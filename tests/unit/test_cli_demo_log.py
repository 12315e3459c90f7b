"""`synckit demo` logs to synckit-demo.log (its summary owns the terminal), but the group's
--log-level and --log-format apply there as they do to every other command's stderr."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner

import synckit.cli.demo as demo_cli
from synckit.cli import cli
from synckit.errors.exceptions import SynckitError


@pytest.fixture
def logging_demo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A demo that logs one event at each level, then stops with a one-line error. The
    logging it configures (a level of WARNING, say) is undone afterwards."""

    async def run_demo(workdir: Path, **_: Any) -> None:
        log = structlog.get_logger("demo")
        log.info("demo.info_event", api_token="supersecretvalue")
        log.warning("demo.warning_event")
        raise SynckitError("stopped here")

    monkeypatch.setattr(demo_cli, "run_demo", run_demo)
    saved, root = structlog.get_config(), logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    structlog.configure(**saved)
    root.setLevel(level)
    root.handlers[:] = handlers


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *options: str) -> str:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [*options, "demo"])
    assert result.exit_code == 1 and "stopped here" in result.output, result.output
    return (tmp_path / "synckit-demo.log").read_text()


@pytest.mark.usefixtures("logging_demo")
def test_the_demo_log_is_json_lines_at_info_by_default_and_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [json.loads(line) for line in _run(tmp_path, monkeypatch).splitlines()]
    assert [e["event"] for e in events] == ["demo.info_event", "demo.warning_event"]
    assert "supersecretvalue" not in json.dumps(events)


@pytest.mark.usefixtures("logging_demo")
def test_the_groups_log_level_and_format_apply_to_the_demo_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _run(tmp_path, monkeypatch, "--log-level", "warning", "--log-format", "console")
    assert "demo.info_event" not in text and "demo.warning_event" in text
    assert not any(line.startswith("{") for line in text.splitlines()), text
