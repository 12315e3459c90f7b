"""Every benchmark imports: they are run by hand, so a moved module would go unnoticed."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__"))
def test_the_benchmark_imports(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), f"bench.{name} has no main()"
