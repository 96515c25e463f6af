"""What setup() decides, in fresh processes: `import opcheck` leaves Triton alone, an explicit
TRITON_INTERPRET=0 is respected, a script that imported triton first still gets interpreted
kernels (triton's own jit functions defined again), and without triton nothing happens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: the `triton` extra installs it on Linux x86_64")

from tests.triton import corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SETUP = "import os, opcheck.triton as t; s = t.setup()\n"


def _python(code: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**corpus.environment(), "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_opcheck_imports_neither_triton_nor_this_package():
    code = (
        "import sys, opcheck\n"
        "print(sorted(m for m in sys.modules if 'triton' in m))\n"
        "import opcheck.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'torch')))\n"
    )
    done = _python(code)
    assert done.stdout.splitlines() == ["[]", "[]"], corpus.shown(done)


def test_an_explicit_zero_is_respected():
    code = SETUP + "print(s.interpreting, s.patches, os.environ['TRITON_INTERPRET'])"
    done = _python(code, TRITON_INTERPRET="0")
    assert done.stdout.strip() == "False () 0", done.stderr


def test_a_script_that_imported_triton_first_gets_interpreted_kernels(tmp_path: Path):
    root = corpus.project(tmp_path)
    code = (
        "import torch, triton, triton.language as tl\n"
        "import opcheck.triton\n"
        "print(opcheck.triton.setup().describe().splitlines()[0])\n"
        "import thirdparty_kernels as k\n"
        "x, y = torch.randn(50).bfloat16(), torch.randn(50).bfloat16()\n"
        "print(torch.equal(k.mul_add(x, y), x * y + x))\n"
    )
    done = _python(code, cwd=root)
    assert done.stdout.splitlines() == [
        "Triton interpreter on: TRITON_INTERPRET=1 set by opcheck (torch sees no GPU)",
        "True",
    ], corpus.shown(done)


def test_without_triton_nothing_happens(tmp_path: Path):
    from tests.test_triton_missing import NO_TRITON

    (tmp_path / "sitecustomize.py").write_text(NO_TRITON, encoding="utf-8")
    code = SETUP + "print(s.interpreting, s.reason, 'TRITON_INTERPRET' in os.environ)"
    done = _python(code, PYTHONPATH=f"{tmp_path}:{REPO}")
    assert done.stdout.strip() == "False triton is not installed False", done.stderr
