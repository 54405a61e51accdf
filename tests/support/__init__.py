"""What the tests share besides fixtures: test servers, helper functions, assertion helpers,
sample jobs and data files (``events/``, ``legacy/``, ``soak_hooks/``).

Import it as ``from support.<module> import ...``: pytest's default import mode puts
``tests/`` on ``sys.path`` (``tests/`` has no ``__init__.py``; its ``conftest.py`` is there).
"""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
EVENTS = SUPPORT / "events"
