"""``synckit worker`` tunes the collector once its code is loaded (cli/worker.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from synckit.cli.worker import GC_THRESHOLDS, tune_gc


@pytest.fixture
def _restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("_restore_gc")
def test_the_worker_freezes_what_is_loaded_and_collects_less_often() -> None:
    gc.unfreeze()
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 1000  # the modules loaded so far, out of every collection
    assert GC_THRESHOLDS[0] > 700  # Python's default, collected several times per cycle
