"""The dead-letter queue: capture of failed records and jobs, automatic replay with
capped backoff, manual review, and purge.

* :mod:`synckit.store.dead_letters` — every SQL statement on ``dead_letters`` (capture, leases,
  streaming filters, group counts, purge);
* :mod:`synckit.dlq.replay` — :class:`ReplayProcessor` and the :class:`Replayers` registry;
* :mod:`synckit.dlq.outcomes` — :class:`ReplayResult`, and the writing of each row's outcome;
* :mod:`synckit.errors.dlq_policy` — the pure decisions (backoff, resource waits);
* :mod:`synckit.dlq.cli` — ``synckit dlq ...``.
"""

from synckit.dlq.outcomes import ReplayResult
from synckit.dlq.replay import (
    DLQ_REPLAY_KIND,
    Plan,
    RecordReplayApp,
    Replayer,
    Replayers,
    ReplayProcessor,
    ReplaySummary,
    app_record_replayer,
    register_dlq_replay,
    replayers_from_app,
)
from synckit.errors.dlq_policy import (
    MAX_DELAY,
    REVIEW_CLASSES,
    blocked_until,
    next_retry_delay,
)

__all__ = [
    "DLQ_REPLAY_KIND",
    "MAX_DELAY",
    "REVIEW_CLASSES",
    "Plan",
    "RecordReplayApp",
    "ReplayProcessor",
    "ReplayResult",
    "ReplaySummary",
    "Replayer",
    "Replayers",
    "app_record_replayer",
    "blocked_until",
    "next_retry_delay",
    "register_dlq_replay",
    "replayers_from_app",
]
