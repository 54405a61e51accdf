"""What the tests share besides fixtures: test servers, helper functions, assertion helpers,
sample jobs and data files (``events/``, ``legacy/``, ``soak_hooks/``).

Import it as ``from support.<module> import ...``: pytest's default import mode puts
``tests/`` on ``sys.path`` (``tests/`` has no ``__init__.py``; its ``conftest.py`` is there).
"""

import os
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]  # the repository
EVENTS = SUPPORT / "events"
# Under CI a test server that cannot be reached fails the run instead of skipping its tests.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
