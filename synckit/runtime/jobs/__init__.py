"""Running jobs: the worker (claims, slots, heartbeats), its outcome recorder, its breaker
and pacing bookkeeping, and the job registry."""
