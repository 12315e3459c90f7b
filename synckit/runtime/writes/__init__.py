"""Writes to the outside world, once: intent-first creates and the transactional outbox's
relay."""
