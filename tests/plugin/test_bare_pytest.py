"""A user's repository whose package is not installed: the commands the docs print run its ops,
bare `pytest` included (it puts only the test module's folder on sys.path)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

PYTEST = Path(sys.executable).with_name("pytest")

SPEC = """\
op: myops:double
dtypes: [float64]
samples:
  - name: rows
    args: [{shape: [3, 4]}]
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "myproject"\nversion = "0"\n')
    (tmp_path / "myops.py").write_text("def double(x):\n    return x * 2\n")
    (tmp_path / "op_specs").mkdir()
    (tmp_path / "op_specs" / "double.yaml").write_text(SPEC)
    return tmp_path


def _env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # as in a user's shell: the project is not on the path
    return env


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not PYTEST.is_file(), reason="no pytest script beside this Python")
@pytest.mark.parametrize("where", [".", "generated_tests"])
def test_bare_pytest_runs_the_ops_of_a_package_that_is_not_installed(project, where):
    generated = run([sys.executable, "-m", "opcheck", "generate"], project)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    target = "generated_tests" if where == "." else "test_double.py"
    done = run([str(PYTEST), target, "-p", "no:cacheprovider", "-q"], project / where)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" in done.stdout and "OpPathError" not in done.stdout
