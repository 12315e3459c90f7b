"""Knowing what happens: alert rules, evaluation and delivery, error budgets, metrics,
instruments and the log pipeline."""
