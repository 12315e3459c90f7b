"""The job queue's persistence: every SQL statement on ``jobs`` lives in this package,
named, one module per part of a job's life. The worker and the CLI call these
operations; they never build SQL themselves.

* :mod:`~synckit.store.jobs.enqueueing`: enqueue one, many, or only new unique keys;
* :mod:`~synckit.store.jobs.claiming`: the fair claim across lanes;
* :mod:`~synckit.store.jobs.outcomes`: start, complete, fail and retry, snooze, finish;
* :mod:`~synckit.store.jobs.leasing`: heartbeat, rescue of ended leases, release;
* :mod:`~synckit.store.jobs.admin`: the operator's reads and writes, and pruning;
* :mod:`~synckit.store.jobs._base`: what they share (statuses, the lease, ClaimedJob).

Import each name from the module that defines it.
"""

# The names synckit/web/app.py reads as ``job_store.<name>``: web/ is being reworked in
# another change and imports this package as one namespace until it moves its imports to
# the defining modules; nothing else should import through here.
from synckit.store.jobs._base import INT64
from synckit.store.jobs.admin import (
    JOB_STATUSES,
    JobFilter,
    JobInfo,
    cancel_job,
    count_jobs,
    get_job,
    job_page,
    poll_jobs,
    reschedule_job,
    retry_job,
    running_counts,
    set_priority,
)

__all__ = [
    "INT64",
    "JOB_STATUSES",
    "JobFilter",
    "JobInfo",
    "cancel_job",
    "count_jobs",
    "get_job",
    "job_page",
    "poll_jobs",
    "reschedule_job",
    "retry_job",
    "running_counts",
    "set_priority",
]
