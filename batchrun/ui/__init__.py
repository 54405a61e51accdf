"""The dashboard (``batchrun ui``, the extra ``batchrun[ui]``): Starlette, server-rendered
Jinja2 pages, a little script for the live parts. Only ``batchrun ui`` imports it.

app.py       the Starlette app: pages, POST actions, /metrics, the gate
security.py  the bind check, the token and the CSRF token
data.py      what the pages show from the ledger and the queue; redrive
control.py   the run history and pause / resume / cancel
templates/   the pages
"""
