"""Every numeric argument of every ``synckit`` command is range-checked (issue 16,
deliver 6): a number past the columns, a limit past the driver's integers, ``nan`` or
``inf`` seconds are a usage error naming the value, never a traceback or a database error.

The walk loads every command the way ``synckit`` does (LazyGroup's list_commands and
get_command), so a command added later is checked without being listed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from inprocess import run_cli  # tests/

from synckit.cli import cli

INT_TYPES = (click.types.IntParamType,)
FLOAT_TYPES = (click.types.FloatParamType,)
DB_INT = (-(2**63), 2**63 - 1)  # what both engines' BIGINT holds


def _commands(
    cmd: click.Command, path: tuple[str, ...], ctx: click.Context
) -> Iterator[tuple[str, click.Command, click.Context]]:
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, (path, name)
            yield from _commands(sub, (*path, name), click.Context(sub, parent=ctx, info_name=name))
    else:
        yield " ".join(path), cmd, ctx


def _numeric_params() -> list[tuple[str, click.Parameter, click.Context]]:
    root = click.Context(cli, info_name="synckit")
    return [
        (name, p, ctx)
        for name, cmd, ctx in _commands(cli, (), root)
        for p in cmd.params
        if isinstance(p.type, INT_TYPES + FLOAT_TYPES)
    ]


NUMERIC = _numeric_params()


def _process(param: click.Parameter, ctx: click.Context, text: str) -> object:
    value: object = (text,) if param.nargs != 1 or getattr(param, "multiple", False) else text
    return param.process_value(ctx, value)


def test_the_walk_sees_the_commands_numeric_arguments() -> None:
    """The walk is not vacuous: it reaches lazily loaded groups and their options."""
    names = {f"{cmd} {p.name}" for cmd, p, _ in NUMERIC}
    for expected in (
        "jobs show job_id",
        "dlq ls limit",
        "dlq replay max_attempts",
        "dlq replay timeout",
        "outbox ls limit",
        "sync timeout",
        "worker poll_interval",
        "tenants reauth expires_in",
    ):
        assert expected in names, sorted(names)
    assert len(NUMERIC) >= 30


@pytest.mark.parametrize(
    ("command", "param", "ctx"), NUMERIC, ids=[f"{c} {p.name}" for c, p, _ in NUMERIC]
)
def test_every_numeric_argument_is_range_checked(
    command: str, param: click.Parameter, ctx: click.Context
) -> None:
    """Ints are bounded on both sides within BIGINT; floats on both sides and finite (nan
    and inf refused); whatever the type, values past them are a click usage error."""
    if isinstance(param.type, INT_TYPES):
        assert isinstance(param.type, click.IntRange) or param.callback is not None, command
        bad = [str(2**70), str(-(2**70))]
        if isinstance(param.type, click.IntRange):
            low, high = param.type.min, param.type.max
            assert low is not None and high is not None, (command, param.name, low, high)
            assert DB_INT[0] <= low and high <= DB_INT[1], (command, param.name)
    else:
        assert isinstance(param.type, click.FloatRange) or param.callback is not None, command
        bad = ["nan", "inf", "-inf", "1e400", "-1e400"]
        if isinstance(param.type, click.FloatRange):
            assert param.type.min is not None and param.type.max is not None, (command, param)
    for text in bad:
        with pytest.raises(click.BadParameter):
            _process(param, ctx, text)
            pytest.fail(f"{command} {param.name}: {text} accepted")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["outbox", "ls", "--limit", str(10**22)], str(10**22)),
        (["dlq", "ls", "--limit", str(10**22)], str(10**22)),
        (["dlq", "replay", "--all", "--timeout", "nan"], "nan"),
        (["dlq", "replay", "--all", "--max-attempts", "0"], "0"),
    ],
)
def test_a_bad_number_is_one_error_line_and_exit_2(
    tmp_path: Path, args: list[str], says: str
) -> None:
    """Exit 2, one ``Error:`` line naming the value (after click's usage lines), no
    traceback; nothing is opened (the database URL names no file). In process
    (tests/inprocess.py): click refuses the value before any command code runs."""
    url = f"sqlite:///{tmp_path}/never.db"
    result = run_cli(*args, "--database-url", url)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "never.db").exists()
