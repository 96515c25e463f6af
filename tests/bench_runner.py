"""A benchmark script run as its user runs it: `python benchmarks/NAME.py ARGS` from the repository's
root, its output kept for the test to read.

The script runs in a process of its own forked from a server that has imported torch (and torch's
OpInfo database, for the scripts that read it): tests/forked_python.py, which says what differs from a
fresh interpreter. The tests check what a benchmark prints and writes, never what its own process
imports or costs; the processes a benchmark starts to time or measure are fresh interpreters, as
the benchmark starts them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests import forked_python

REPO = Path(__file__).resolve().parents[1]

READ_OP_DB = {"bench_opinfo", "bench_opdb", "bench_auto_sets"}
"""The scripts whose own process imports torch's OpInfo database."""

_RUN_SCRIPT = "import runpy, sys\nsys.path[0] = {folder!r}\nrunpy.run_path({path!r}, run_name='__main__')\n"
"""`python PATH`: the script's folder first on sys.path, in place of the working directory, and the
script as __main__ with sys.argv[0] its path."""


def script(name: str) -> Path:
    return REPO / "benchmarks" / f"{name}.py"


def run_benchmark(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    path = script(name)
    code = _RUN_SCRIPT.format(folder=str(path.parent), path=str(path))
    preload = forked_python.OP_DB if name in READ_OP_DB else forked_python.TORCH
    return forked_python.run_code(code, *args, cwd=REPO, timeout=timeout, preload=preload)
