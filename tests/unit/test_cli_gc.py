"""The console script holds the garbage collector off while a command's modules import,
then turns it on again (with what the imports made frozen), so a long-running command,
the worker above all, collects as any process does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from waits import PROCESS_TIMEOUT  # tests/

SCRIPT = textwrap.dedent(
    """
    import gc, json
    import click
    from synckit.cli import cli
    from synckit.cli.options import hold_gc
    seen = {"enabled_at_start": gc.isenabled()}
    hold_gc()
    seen["held"] = not gc.isenabled()
    cli.get_command(click.Context(cli), "worker")
    seen["enabled_after_import"] = gc.isenabled()
    seen["frozen"] = gc.get_freeze_count()
    print(json.dumps(seen))
    """
)


def test_the_collector_is_held_while_a_command_imports_and_released_after() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["enabled_at_start"] and seen["held"], seen
    assert seen["enabled_after_import"], seen
    # The worker's modules were imported while held: frozen, never walked again.
    assert seen["frozen"] > 10_000, seen


def test_a_process_that_never_held_it_keeps_it_as_it_was() -> None:
    """In process (tests, an application embedding the CLI) nothing changes."""
    import gc

    import click

    from synckit.cli import cli

    before = (gc.isenabled(), gc.get_freeze_count())
    cli.get_command(click.Context(cli), "status")
    assert (gc.isenabled(), gc.get_freeze_count()) == before
