"""The named queries ship inside the package: a built wheel carries every .sql file."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import ROOT


@pytest.mark.slow
def test_wheel_contains_every_sql_file(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("batchrun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(p.relative_to(ROOT)) for p in (ROOT / "batchrun").rglob("*.sql")}
    assert any(name.startswith("batchrun/jobs/birthday/sql/") for name in expected)
    assert len(expected) >= 16
    assert expected <= names
    assert "batchrun/py.typed" in names
