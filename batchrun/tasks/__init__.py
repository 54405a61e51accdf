"""Tasks an application submits: ``Task`` (task.py), their tables (store.py), how a
consumer runs them (serve.py) and how they are queued (submit.py)."""

from batchrun.task import BadTask, Task, TaskItem

__all__ = ["BadTask", "Task", "TaskItem"]
