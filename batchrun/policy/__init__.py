"""Policies given to the per-entity road as values: how to retry (``RetryPolicy``) and how
to pace an effect (``Pacer``: its rate, AIMD and circuit breaker)."""
