"""A wheel is enough: built, installed without -e into a fresh virtualenv, `synckit demo`
runs in an empty folder."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from waits import PROCESS_TIMEOUT  # tests/

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SYNCKIT_", "PYTHON"))}


def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo_in_an_empty_folder(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(wheels)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0:
        text = build.stdout + build.stderr
        if "No matching distribution found for hatchling" in text:
            pytest.skip(f"cannot build a wheel here (no hatchling to be had): {text[-300:]}")
        pytest.fail(f"building the wheel failed:\n{text[-3000:]}")
    (wheel,) = wheels.glob("synckit-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    # The dependencies come from this environment's site-packages (a path entry, whose
    # .pth files, this checkout's editable install among them, are not processed), so
    # the test needs no index; `pip check` below proves the wheel's requirements are met.
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run(
        [str(python), "-c", "import synckit, synckit.examples.graph_mail; print(synckit.__file__)"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(site)), where.stdout
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "check"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert check.returncode == 0, check.stdout + check.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    demo = subprocess.run(
        # Converging is what is checked here, not its speed on a busy machine; the demo
        # gives up by itself at --timeout + 30 s.
        [str(venv / "bin" / "synckit"), "demo", "--timeout", "240"],
        cwd=empty,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240 + 30 + PROCESS_TIMEOUT,
    )
    if demo.returncode != 0:
        # What the demo was still waiting for is in the story, above its summary table.
        at = demo.stdout.find("did not converge")
        story = demo.stdout[at : at + 800] if at >= 0 else demo.stdout[-2000:]
        log = empty / "synckit-demo.log"
        warnings = [
            line[:300]
            for line in (log.read_text().splitlines() if log.exists() else [])
            if '"level": "warning"' in line or '"level": "error"' in line
        ]
        pytest.fail(
            f"synckit demo exited {demo.returncode}:\n{story}\n"
            f"its log's warnings: {warnings[-20:]}\n{demo.stderr[-2000:]}"
        )
    left = {p.name for p in empty.iterdir()}
    assert {"synckit-demo.db", "synckit-demo.log"} <= left, left
    assert left <= {"synckit-demo.db", "synckit-demo.db-wal", "synckit-demo.db-shm",
                    "synckit-demo.log", "synckit-demo.key"}, left  # fmt: skip
