"""A worker process pays its one-time costs before its first job (``prepare_process``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from waits import PROCESS_TIMEOUT  # tests/


def test_prepare_process_builds_what_the_first_cycle_would_have() -> None:
    # A fresh interpreter: this test process has imported everything already.
    script = textwrap.dedent(
        """
        import sys
        from synckit.runtime.sync import context
        from synckit.runtime.http import transports as http
        from synckit.runtime.observe import instruments
        lazy = ("synckit.runtime.writes.intents", "synckit.runtime.credentials.oauth")
        assert not any(m in sys.modules for m in lazy), [m for m in lazy if m in sys.modules]
        assert http.tls_context.cache_info().currsize == 0
        context.prepare_process()
        assert all(m in sys.modules for m in lazy)
        assert http.tls_context.cache_info().currsize == 1
        assert context._version.cache_info().currsize == 1
        assert instruments._instruments.cache_info().currsize == 1
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=PROCESS_TIMEOUT
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_an_apps_worker_prepares_its_process(tmp_path: Path) -> None:
    """``App.worker`` (a worker embedded in the user's own process) prepares it too."""
    script = textwrap.dedent(
        f"""
        from synckit import App
        from synckit.runtime.http import transports as http
        from synckit.store.db import open_database
        assert http.tls_context.cache_info().currsize == 0
        App().worker(open_database("sqlite:///{tmp_path / "w.db"}"))
        assert http.tls_context.cache_info().currsize == 1
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=PROCESS_TIMEOUT
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
