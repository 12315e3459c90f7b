"""How many examples a property test draws.

The count written at a test (``@settings(max_examples=examples(1000))``) is its
thorough count, drawn when ``SYNCKIT_HYPOTHESIS=thorough`` is set (before a release, or
after touching the code under test). The everyday suite draws a quarter of it, and never
fewer than 100 where the test asked for more: the same properties, checked a little less
deeply on each run, and a failure found once is replayed first from Hypothesis's example
database until it passes. Issue 35: these tests were a third of the unit tests' CPU.
"""

from __future__ import annotations

import os

__all__ = ["THOROUGH", "examples"]

THOROUGH = os.environ.get("SYNCKIT_HYPOTHESIS", "").strip().lower() == "thorough"
#: The share of the written count an everyday run draws, and the floor it keeps.
SHARE = 4
FLOOR = 100


def examples(thorough: int) -> int:
    if THOROUGH:
        return thorough
    return max(min(thorough, FLOOR), thorough // SHARE)
