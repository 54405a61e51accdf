"""Policies given to the per-entity road as values, not globals.

retry.py    RetryPolicy: a job's attempts, backoff and longest delay; give-up and delay
pacing.py   Pacer: the rate and the circuit breaker around any effect's call
rate.py     AdaptiveRate: a leaky bucket whose rate follows AIMD feedback
bugs.py     BugStreak: the same error for many entities in a row stops the work
gate.py     BackendGate: one named backend's breaker, slots, ready probe and rate
slots.py    SharedSlots: a backend's concurrency across processes, leased in the database
busy.py     Patience (how long a busy entity waits) and the give-back delay
"""
