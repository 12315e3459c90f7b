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
