"""Tasks an application submits: their tables (store.py), how they are queued (submit.py)
and how a lost one is sent again (resend.py; sweep.py when nothing waits behind it).

``batchrun.Task`` itself is in batchrun/task.py; a consumer runs tasks on the road like
every other entity (batchrun/pipeline/tasks.py).
"""

from batchrun.task import BadTask, Task, TaskItem
from batchrun.tasks.submit import Submitted

__all__ = ["BadTask", "Submitted", "Task", "TaskItem"]
