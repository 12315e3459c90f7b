"""What a connector author writes an intent with: the records, results and callables.

``ctx.intent(key, request, create=..., find=...)`` creates a remote resource once however
many times the job runs (the runtime's side is :mod:`synckit.runtime.writes.intents`): ``create``
gets the idempotency key and returns a :class:`RemoteRecord`, ``find`` looks for what an
earlier attempt may have created, and the call returns an :class:`IntentResult`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

IntentOutcome = Literal["created", "found", "stored"]


@dataclass(frozen=True)
class RemoteRecord:
    """What ``create`` made (or ``find`` found): the remote id and what to keep of it."""

    remote_id: str
    data: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class IntentResult:
    """The outcome of :func:`run_intent`.

    ``outcome`` is ``created`` (this run created it), ``found`` (``find`` found the
    resource an earlier attempt had created) or ``stored`` (it was already done).
    """

    key: str
    remote_id: str
    result: Any
    outcome: IntentOutcome
    attempts: int

    @property
    def created(self) -> bool:
        return self.outcome == "created"


Create = Callable[[str], Awaitable[RemoteRecord]]
Find = Callable[[], Awaitable["RemoteRecord | None"]]
