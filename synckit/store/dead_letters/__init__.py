"""The dead-letter queue's persistence: every SQL statement on ``dead_letters``, named.

One row per failed thing, keyed by ``(tenant, connector, kind, record_id)``: a record of a
stream (kind ``record:<stream>``) or a dead job (kind = the job's kind, record id
``job:<id>``). Statuses:

* ``pending`` — waiting for an automatic replay at ``next_retry_at``;
* ``review`` — a human must look (validation/authorization errors, replays exhausted);
* ``resolved`` — replayed successfully, or resolved by an operator;
* ``ignored`` — cannot or should not be replayed; ``status_reason`` says why.

The package is the table's one writer; import each name from the module that holds it:

* :mod:`~synckit.store.dead_letters.rows` — :class:`DeadLetter` (a row as callers see it),
  :class:`DlqFilter`, the statuses, and what every writer shares (text limits, the
  history entry);
* :mod:`~synckit.store.dead_letters.capture` — :func:`capture_many`, the one capture, and
  :func:`resolve_records`, its counterpart for records that succeeded (both in the
  caller's synchronous transaction);
* :mod:`~synckit.store.dead_letters.replay` — due rows, the replay claim and its fenced
  outcomes, the operators' bulk changes;
* :mod:`~synckit.store.dead_letters.reads` — :func:`get`, :func:`iter_rows`,
  :func:`group_counts` and the console's pages.
"""
