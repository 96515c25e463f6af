"""Scratch projects for the `opcheck capture` tests: files in a folder with an empty
pyproject.toml (a project root), and `python -m opcheck ...` run there as a user runs it (in a
process of its own, forked with torch imported: tests/forked_python.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests import forked_python

TIMEOUT = 180
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
"""For the pytest runs of generated suites: hypothesis' plugin, which they do not use, costs a second of each."""


def project(tmp: Path, files: dict[str, str]) -> Path:
    """A project root (an empty pyproject.toml) holding `files` (path -> text, dedented)."""
    (tmp / "pyproject.toml").write_text("", encoding="utf-8")
    for name, text in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return tmp


def _env() -> dict[str, str]:
    """This process's environment without the outer pytest's (and xdist's) variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def python(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in `tmp`, a fresh interpreter."""
    return subprocess.run([sys.executable, *args], cwd=tmp, capture_output=True, text=True, timeout=TIMEOUT, env=_env())


def opcheck(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m opcheck ARGS` in `tmp`, forked with torch imported (tests/forked_python.py)."""
    return forked_python.run("opcheck", *args, cwd=tmp, env=_env(), timeout=TIMEOUT)


def pytest_in(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pytest ARGS` in `tmp`, forked with torch imported: the generated tests themselves
    run in the fresh process its supervisor starts."""
    return forked_python.run("pytest", *args, cwd=tmp, env=_env(), timeout=TIMEOUT)


def capture(tmp: Path, ops: list[str], command: list[str], *options: str, cost: bool = False):
    """`opcheck capture --op OP... [OPTIONS] -- COMMAND` in `tmp` (--no-cost unless `cost`)."""
    args = ["capture"]
    for op in ops:
        args += ["--op", op]
    return opcheck(tmp, *args, *options, *([] if cost else ["--no-cost"]), "--", *command)


def shown(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr[-4000:]}"
