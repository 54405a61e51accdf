"""The notices a page shows after an action: a fixed set of texts, named by key.

An action redirects to ``?notice=KEY`` with the values the text takes (``notice_job``,
``notice_period``, ``notice_action``, ``notice_count``). A page shows the text only when
the key is one of ``NOTICES`` and each value is one the dashboard could have given (a job
it serves, a period of that job, one of ``ACTIONS``, a number): a link from elsewhere
cannot make a page say something of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode

from batchrun.job import Job
from batchrun.period import parse as parse_period
from batchrun.ui.control import ACTIONS

# {what} is the job, or the job and its period
NOTICES = {
    "paused": "{what} paused: running processes hold at their next heartbeat",
    "resumed": "{what} resumed",
    "not-paused": "{what} was not paused",
    "cancelled": "{what} cancelled: the runs going on now stop at their next heartbeat",
    "unknown-action": f"unknown action: one of {', '.join(ACTIONS)}",
    "task-period": "{action} failed: {job} is a task job, which has no periods",
    "bad-period": "{action} failed: invalid period for {job}",
    "action-failed": "{action} failed: the dashboard's log says why",
    "redriven": "{count} dead letter{s} redriven",
    "redrive-failed": "redrive failed: the dashboard's log says why",
}
MAX_COUNT_DIGITS = 9


def query(key: str, **values: str | int | None) -> str:
    """The query string that names notice ``key`` and its values (None: left out)."""
    assert key in NOTICES, key
    fields = {f"notice_{name}": str(v) for name, v in values.items() if v is not None}
    return urlencode({"notice": key, **fields})


def text(params: Mapping[str, str], jobs: Mapping[str, Job]) -> str:
    """The text of the notice ``params`` name; "" for an unknown key or a value the
    dashboard would not give."""
    template = NOTICES.get(params.get("notice", ""))
    if template is None:
        return ""
    values: dict[str, str] = {}
    name, period = params.get("notice_job"), params.get("notice_period")
    if name is not None:
        job = jobs.get(name)
        if job is None:
            return ""
        values["job"] = values["what"] = job.name
        if period is not None:
            try:
                values["period"] = str(parse_period(job.period, period))
            except ValueError:
                return ""
            values["what"] = f"{job.name} {values['period']}"
    elif period is not None:
        return ""
    action = params.get("notice_action")
    if action is not None:
        if action not in ACTIONS:
            return ""
        values["action"] = action
    count = params.get("notice_count")
    if count is not None:
        if not (count.isascii() and count.isdecimal() and len(count) <= MAX_COUNT_DIGITS):
            return ""
        values["count"] = str(int(count))
        values["s"] = "" if int(count) == 1 else "s"
    try:
        return template.format(**values)
    except KeyError:  # a value the text takes is missing
        return ""
