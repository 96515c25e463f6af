"""The corpus as a user tests it: a scratch project with a spec per op and per bug twin,
`opcheck generate`, then `python -m pytest` in an environment without TRITON_INTERPRET: the correct
kernels pass and their twins fail, each failure saying the interpreter ran and how to rerun it.
With `[tool.opcheck] triton_interpret = false` the kernels compile, and a failure says what to do."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: the `triton` extra installs it on Linux x86_64")

from filelock import FileLock  # noqa: E402  (torch's own dependency)

from tests.triton import corpus  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreting")
RESULT = re.compile(r"^generated_tests/test_(?P<spec>\w+)\.py::test_\w+\[[\w.-]+\] (?P<outcome>PASSED|FAILED)", re.M)
# The engine reports a backward that writes into its grad_output, unless the spec declares it.
DECLARES_WRITES = corpus.declares_writes()


PLAIN = """\
import torch
import thirdparty_kernels as k


def test_bfloat16_mul_add_rounds_as_torch_does():
    x, y = torch.randn(50).bfloat16(), torch.randn(50).bfloat16()
    assert torch.equal(k.mul_add(x, y), x * y + x)
"""
"""A plain pytest test of a kernel, no spec: the plugin interprets it all the same."""


def _run_corpus(root: Path) -> subprocess.CompletedProcess[str]:
    (root / "test_plain.py").write_text(PLAIN, encoding="utf-8")
    generated = corpus.python(root, "-m", "opcheck", "generate")
    assert generated.returncode == 0, corpus.shown(generated)
    args = ["generated_tests", "test_plain.py", "-v", "-p", "no:cacheprovider", "-p", "no:randomly"]
    args += corpus.NO_HYPOTHESIS
    return corpus.python(root, "-m", "pytest", *args)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """The corpus's run, once per session: pytest-xdist's workers share it through a file (the
    pattern pytest-xdist documents for session fixtures), the first to get the lock making it."""
    session = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is below the session's
        session = session.parent
    shared = session / "triton_corpus_run.json"
    with FileLock(f"{shared}.lock"):
        if shared.is_file():
            done = subprocess.CompletedProcess(**json.loads(shared.read_text(encoding="utf-8")))
        else:
            done = _run_corpus(corpus.project(tmp_path_factory.mktemp("corpus")))
            fields = {"args": done.args, "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            shared.write_text(json.dumps(fields), encoding="utf-8")
    outcomes: dict[str, set[str]] = {}
    for found in RESULT.finditer(done.stdout):
        outcomes.setdefault(found["spec"], set()).add(found["outcome"])
    return done, outcomes


def test_every_test_ran(run):
    done, outcomes = run
    expected = {name for op in corpus.OPS for name in (op.name, f"{op.name}_bug")}
    assert set(outcomes) == expected, corpus.shown(done)


@pytest.mark.parametrize("op", [op.name for op in corpus.OPS if op.name != "rope"])
def test_the_correct_kernel_passes(run, op):
    done, outcomes = run
    assert outcomes.get(op) == {"PASSED"}, corpus.shown(done)


@pytest.mark.parametrize("op", [op.name for op in corpus.OPS])
def test_its_bug_twin_fails(run, op):
    done, outcomes = run
    assert outcomes.get(f"{op}_bug") == {"FAILED"}, corpus.shown(done)
    assert f"thirdparty_kernels:{op}_bug on cpu/" in done.stdout


def test_a_plain_pytest_test_runs_the_kernels_interpreted(run):
    done, _ = run
    assert "test_plain.py::test_bfloat16_mul_add_rounds_as_torch_does PASSED" in done.stdout, corpus.shown(done)


def test_the_backward_writing_into_grad_output_passes_once_declared(run):
    """rope's backward rotates grad_output in its own memory (as Liger-Kernel's does): declared in
    the spec where the spec format has the key; until then the one finding is the write itself."""
    done, outcomes = run
    if DECLARES_WRITES:
        assert outcomes.get("rope") == {"PASSED"}, corpus.shown(done)
        return
    assert outcomes.get("rope") == {"FAILED"}
    failure = done.stdout.split("thirdparty_kernels:rope on cpu/float32", 1)[1].split("\n____", 1)[0]
    assert "the op writes into what autograd hands it: the grad_output of output 0" in failure
    assert "within the bound: output 0, VJP: gradient of input 0" in failure


def test_a_failure_says_the_interpreter_ran_and_reruns_with_it(run):
    done, _ = run
    note = (
        "Triton kernels ran in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by opcheck: torch sees no GPU)"
    )
    assert f"triton:      {note}" in done.stdout, done.stdout[-4000:]
    rerun = "rerun:       TRITON_INTERPRET=1 pytest 'generated_tests/test_softmax_bug.py::test_lowprec[cpu-float32-s]'"
    assert rerun in done.stdout


def test_turned_off_the_kernels_compile_and_the_failure_says_what_to_do(tmp_path: Path):
    root = corpus.project(tmp_path)
    assert corpus.python(root, "-m", "opcheck", "generate").returncode == 0
    (root / "pyproject.toml").write_text("[tool.opcheck]\ntriton_interpret = false\n", encoding="utf-8")
    done = corpus.python(
        root, "-m", "pytest", "generated_tests/test_softmax.py", "-p", "no:cacheprovider", *corpus.NO_HYPOTHESIS
    )
    assert done.returncode == 1, corpus.shown(done)
    assert "0 active drivers" in done.stdout, corpus.shown(done)
    if "importing 'thirdparty_kernels' failed" not in done.stdout:  # triton 3.2 fails defining an autotuned kernel
        assert "hint: this Triton kernel was compiled for a GPU" in done.stdout
        assert "([tool.opcheck] triton_interpret = false)" in done.stdout
    assert "TRITON_INTERPRET=1 pytest" not in done.stdout  # no kernel ran interpreted


def test_a_bad_opt_out_names_the_file_and_key(tmp_path: Path):
    root = corpus.project(tmp_path, pyproject='[tool.opcheck]\ntriton_interpret = "no"\n')
    done = corpus.python(root, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q")
    assert "pyproject.toml:2: [tool.opcheck] triton_interpret: expected true or false, got 'no'" in done.stderr, (
        corpus.shown(done)
    )
