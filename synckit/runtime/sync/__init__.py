"""Poll cycles and what lands from them: one cycle, its page commits, the scheduler,
records, webhooks and subscriptions."""
