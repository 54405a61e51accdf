"""Policies given to the per-entity road as values, not globals.

retry.py    RetryPolicy: a job's attempts, backoff and longest delay; give-up and delay
pacing.py   Pacer: the rate (AIMD) and the circuit breaker around any effect's call
"""
