"""The house rules run with the tests: ruff's lint and format, and mypy with pyproject's settings.

`pip install -e '.[test]'` installs both tools; each runs over the whole tree as CI runs it, so a
change that breaks a rule fails here with the tool's own report.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> list[str]:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return [found]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_ruff_check():
    proc = run(tool("ruff") + ["check", "--no-cache", "."])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_format():
    proc = run(tool("ruff") + ["format", "--check", "--no-cache", "."])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


@pytest.mark.long
def test_mypy_strict_on_engine_and_spec(tmp_path):
    # pyproject.toml: the whole package, strict on opcheck.engine and opcheck.spec
    proc = run(tool("mypy") + ["--cache-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
