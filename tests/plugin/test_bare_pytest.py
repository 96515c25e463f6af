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

# A torch.library operator, named through torch.ops: only `imports:` runs the code registering it.
REGISTERS = """
import torch


@torch.library.custom_op("opcheck_bare::triple", mutates_args=())
def triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


triple.register_fake(lambda x: torch.empty_like(x))
triple.register_autograd(lambda ctx, g: g * 3)
"""

LIBRARY_SPEC = """\
op: torch.ops.opcheck_bare.triple
imports: [myops]
samples:
  - name: rows
    args: [{shape: [3, 4]}]
gradcheck: {check_batched_grad: false}
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "myproject"\nversion = "0"\n')
    (tmp_path / "myops.py").write_text("def double(x):\n    return x * 2\n" + REGISTERS)
    (tmp_path / "op_specs").mkdir()
    (tmp_path / "op_specs" / "double.yaml").write_text(SPEC)
    (tmp_path / "op_specs" / "triple.yaml").write_text(LIBRARY_SPEC)
    return tmp_path


def _env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # as in a user's shell: the project is not on the path
    return env


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.long
@pytest.mark.skipif(not PYTEST.is_file(), reason="no pytest script beside this Python")
@pytest.mark.parametrize("where", [".", "generated_tests"])
def test_bare_pytest_runs_the_ops_of_a_package_that_is_not_installed(project, where):
    generated = run([sys.executable, "-m", "opcheck", "generate"], project)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    targets = ["generated_tests"] if where == "." else ["test_double.py", "test_triple.py"]
    done = run([str(PYTEST), *targets, "-p", "no:cacheprovider", "-q", "-rA"], project / where)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "OpPathError" not in done.stdout
    folder = "generated_tests/" if where == "." else ""
    for test in (
        "test_double.py::test_gradcheck",
        "test_triple.py::test_gradcheck",
        "test_triple.py::test_gradgradcheck",
    ):
        assert f"PASSED {folder}{test}[cpu-float64-rows]" in done.stdout, done.stdout[-3000:]
