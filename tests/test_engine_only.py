"""`pip install opcheck` is the engine alone: torch is its only dependency, the rest is the `suite` extra.

The subprocesses below run with the suite's packages hidden (an import of any of them raises
ModuleNotFoundError, as in a Python where they were never installed): the drop-ins still check
gradients, pytest still runs with opcheck's plugin loaded, and the suite's entry points (the
`opcheck` command, a generated module) name the install command instead of a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opcheck.config import tomllib  # tomli on Python 3.10

REPO = Path(__file__).resolve().parents[1]
HIDDEN = ("yaml", "jinja2", "jsonschema", "numpy", "expecttest", "matplotlib")

BLOCKER = f"""
import importlib.abc, sys

class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HIDDEN!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Hide())
"""


@pytest.fixture
def engine_only(tmp_path: Path):
    """Run a command in `tmp_path` with the suite's packages hidden."""
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "hide"), str(REPO)]))
    env.pop("PYTEST_ADDOPTS", None)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    return run


def test_the_distribution_needs_only_torch_and_the_suite_is_an_extra():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [req.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip() for req in project["dependencies"]]
    assert names == ["torch", "tomli"]
    assert "python_version < '3.11'" in project["dependencies"][1]
    suite = project["optional-dependencies"]["suite"]
    for dist in ("pyyaml", "jinja2", "jsonschema", "pytest", "numpy", "expecttest"):
        assert any(req.startswith(dist + ">=") for req in suite), dist
    for extra in ("test", "parallel", "plot"):
        assert "opcheck[suite]" in project["optional-dependencies"][extra], extra


def test_the_drop_ins_check_gradients_without_the_suite(engine_only):
    script = textwrap.dedent(
        """
        import sys, torch, opcheck

        class Wrong(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.sin()

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * x.cos() * 1.01

        x = torch.rand(4, dtype=torch.float64, requires_grad=True)
        assert opcheck.gradcheck(torch.sin, (x,)) and opcheck.gradgradcheck(torch.sin, (x,))
        assert opcheck.gradcheck(torch.sin, (x,), fast_mode="auto", check_forward_ad=True)
        assert not opcheck.gradcheck(Wrong.apply, (x,), raise_exception=False)
        loaded = sorted(m for m in ("yaml", "jinja2", "jsonschema") if m in sys.modules)
        print("ok", loaded)
        """
    )
    done = engine_only("-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok []"


def test_pytest_runs_with_the_plugin_loaded_without_the_suite(engine_only, tmp_path):
    (tmp_path / "test_mine.py").write_text(
        "import torch, opcheck\n\n"
        "def test_sin():\n"
        "    x = torch.rand(3, dtype=torch.float64, requires_grad=True)\n"
        "    assert opcheck.gradcheck(torch.sin, (x,))\n"
    )
    done = engine_only("-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "test_mine.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "plugins: " in done.stdout and "opcheck-" in done.stdout  # the entry point's plugin was loaded


def test_the_suites_entry_points_name_the_install_command(engine_only, tmp_path):
    (tmp_path / "op_specs").mkdir()
    (tmp_path / "op_specs" / "sin.yaml").write_text((REPO / "op_specs" / "sin.yaml").read_text())
    done = engine_only("-m", "opcheck", "generate")
    assert done.returncode == 1
    assert done.stderr.startswith("opcheck generate: needs opcheck's suite, and pyyaml, jinja2, jsonschema are not")
    assert "pip install 'opcheck[suite]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "generated_tests").exists()
    assert engine_only("-m", "opcheck", "--version").returncode == 0

    (tmp_path / "test_sin.py").write_text((REPO / "generated_tests" / "test_sin.py").read_text())
    done = engine_only("-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "test_sin.py")
    assert done.returncode == pytest.ExitCode.INTERRUPTED
    assert "ModuleNotFoundError: a generated test module needs opcheck's suite" in done.stdout
    assert "pip install 'opcheck[suite]'" in done.stdout


def test_a_packages_lazy_names_follow_a_module_imported_again(monkeypatch):
    import importlib

    import opcheck.runtime

    first = opcheck.runtime.CheckSkipped
    monkeypatch.delitem(sys.modules, "opcheck.runtime.outcomes")  # as pytester drops an inner run's modules
    again = importlib.import_module("opcheck.runtime.outcomes")
    assert again.CheckSkipped is not first
    assert opcheck.runtime.CheckSkipped is again.CheckSkipped  # not the first module's class
