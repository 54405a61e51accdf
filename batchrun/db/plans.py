"""How each database's EXPLAIN names a table's read, for the verdicts ``db explain`` gives."""

from __future__ import annotations

import re

# PostgreSQL's EXPLAIN (text): the scan of one step and the table or index it reads.
PG_SCAN = re.compile(
    r"(Seq Scan on|Index Only Scan using|Index Scan using|Bitmap Index Scan on) (\S+)"
)
