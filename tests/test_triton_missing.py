"""The catalog where triton is not installed (macOS, Windows: triton has no wheels there), simulated
here whether or not it is: a `sitecustomize.py` on PYTHONPATH puts a finder first on sys.meta_path
that refuses `triton`, so `import triton` and importlib.util.find_spec("triton") fail as they do
there. The Triton specs say `requires: [triton]`: README's `opcheck generate` succeeds with one note
per Triton spec, the committed modules are the ones it would write, and their tests skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRITON_SPECS = ("triton_cross_entropy", "triton_cross_entropy_inplace", "triton_rms_norm", "triton_swiglu")

NO_TRITON = '''
import sys


class _NoTriton:
    """`import triton` and importlib.util.find_spec("triton") raise ModuleNotFoundError."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTriton())
'''


@pytest.fixture(scope="module")
def no_triton(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a Python in which triton cannot be found."""
    shim = tmp_path_factory.mktemp("no_triton")
    (shim / "sitecustomize.py").write_text(NO_TRITON, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(REPO)])
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)


def test_the_shim_hides_triton(no_triton):
    probe = "import importlib.util\ntry:\n    importlib.util.find_spec('triton')\nexcept ImportError:\n    print('no')"
    assert _run(["-c", probe], no_triton).stdout == "no\n"


def test_generate_check_succeeds_with_a_note_per_triton_spec(no_triton):
    result = _run(["-m", "opcheck", "generate", "--check"], no_triton)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("generated_tests is up to date (")
    assert result.stderr.splitlines() == [
        f"op_specs/{name}.yaml: requires triton, which is not installed: its op is not imported, and its tests skip"
        for name in TRITON_SPECS
    ]
    validated = _run(["-m", "opcheck", "validate"], no_triton)
    assert validated.returncode == 0 and validated.stdout.startswith("ok: "), validated.stderr
    assert validated.stderr == result.stderr


def test_the_triton_tests_skip_saying_why(no_triton):
    args = ["-m", "pytest", "generated_tests/test_triton_rms_norm.py", "-rs", "-o", "addopts="]
    result = _run(args + ["-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:hypothesispytest"], no_triton)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " skipped" in summary and "passed" not in summary and "failed" not in summary, summary
    assert "error" not in summary
    reason = "requires triton, which is not installed (op_specs/triton_rms_norm.yaml: requires: [triton])"
    assert "test_triton_rms_norm.py:" in result.stdout and reason in result.stdout
