"""The corpus's ops as a scratch project: thirdparty_kernels.py copied in, one spec per op and per
bug twin, an empty pyproject.toml (a project root), and commands run there as a user runs them,
in an environment without TRITON_INTERPRET or opcheck's own variables."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNELS = "thirdparty_kernels"
TIMEOUT = 300
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
"""For the pytest runs of generated suites: hypothesis' plugin, which they do not use, costs a second of each."""


@dataclass(frozen=True)
class CorpusOp:
    name: str
    dtypes: tuple[str, ...]
    args: str  # the sample's `args:` in YAML flow style
    what: str  # what the kernel is an example of
    extra: str = ""  # more spec keys, one per line


OPS = (
    CorpusOp("matmul", ("bfloat16",), "[{shape: [20, 24]}, {shape: [24, 18]}]", "autotuned, tl.dot of bfloat16 tiles"),
    CorpusOp("mul_add", ("bfloat16",), "[{shape: [100]}, {shape: [100]}]", "bfloat16 arithmetic on the loads"),
    CorpusOp("row_sumsq", ("float32",), "[{shape: [3, 50]}]", "i.to(tl.int64) on a loop index"),
    CorpusOp(
        "rms_norm", ("float32",), "[{shape: [6, 40]}, {shape: [40], low: 0.5, high: 1.5}]", "grid from the SM count"
    ),
    CorpusOp(
        "rope",
        ("float32",),
        "[{shape: [5, 12]}]",
        "a backward that writes into grad_output",
        "writes_grad_outputs: true  # as Liger-Kernel's rope: no caller shares that gradient\n",
    ),
    CorpusOp("softmax", ("float32",), "[{shape: [4, 30]}]", "float32 only"),
    CorpusOp("cumsum", ("bfloat16",), "[{shape: [3, 50]}]", "tl.cumsum straight on bfloat16 loads"),
)


def declares_writes() -> bool:
    """Whether specs can declare a backward that writes into its grad_output (`writes_grad_outputs`)."""
    from opcheck.spec.model import OpSpec

    return "writes_grad_outputs" in {f.name for f in dataclasses.fields(OpSpec)}


def spec_text(op: CorpusOp, bug: bool) -> str:
    name = f"{op.name}_bug" if bug else op.name
    return (
        f"# {op.what}\n"
        f"op: {KERNELS}:{name}\n"
        f"name: {name}\n"
        "requires: [triton]\n"
        "dtypes: []\n"
        f"lowprec_dtypes: [{', '.join(op.dtypes)}]\n"
        f"reference: {KERNELS}:{op.name}_reference\n"
        "devices: [cpu]\n"
        f"{op.extra if declares_writes() else ''}"
        "samples:\n"
        "  - name: s\n"
        f"    args: {op.args}\n"
    )


def project(root: Path, pyproject: str = "") -> Path:
    """A scratch project holding the corpus and a spec for each op and each bug twin."""
    (root / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    shutil.copy(HERE / f"{KERNELS}.py", root / f"{KERNELS}.py")
    (root / "op_specs").mkdir()
    for op in OPS:
        for bug in (False, True):
            name = f"{op.name}_bug" if bug else op.name
            (root / "op_specs" / f"{name}.yaml").write_text(spec_text(op, bug), encoding="utf-8")
    return root


def environment() -> dict[str, str]:
    """This environment without TRITON_INTERPRET, opcheck's variables and the outer pytest's."""
    return {
        k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and not k.startswith(("OPCHECK_", "PYTEST_"))
    }


def python(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=environment() if env is None else env,
    )


def shown(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-3000:]}"
