"""A benchmark script run as its user runs it: `python benchmarks/NAME.py ARGS` in a fresh Python,
from the repository's root, its output kept for the test to read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def script(name: str) -> Path:
    return REPO / "benchmarks" / f"{name}.py"


def run_benchmark(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script(name)), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
