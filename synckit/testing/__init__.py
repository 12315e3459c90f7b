"""Testing tools for connector authors: a fake API with fault injection and a fake clock.

The pytest fixtures live in :mod:`synckit.testing.fixtures`, enabled with
``pytest_plugins = ["synckit.testing.fixtures"]``; importing this package does not import
pytest.
"""

from synckit.testing.clock import FakeClock
from synckit.testing.fakeapi import FakeAPI
from synckit.testing.listings import NewestFirstList
from synckit.testing.reads import dead_letters
from synckit.testing.replies import PASS, Fault, FaultRates, RecordedRequest, Reply, TokenInfo

__all__ = [
    "PASS",
    "FakeAPI",
    "FakeClock",
    "Fault",
    "FaultRates",
    "NewestFirstList",
    "RecordedRequest",
    "Reply",
    "TokenInfo",
    "dead_letters",
]
