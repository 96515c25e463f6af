"""The compile check against the corpus (corpus.py): every mutant fails it under each backend where
its bug shows, and every twin passes it under both backends, on the installed torch.

The specs are built as the model (no YAML): a corpus op may take no input that requires grad (the
quantizer's `activations_and_amax`), which a spec's gradient checks would refuse. Only the sample
as written is compared here; the cases beyond it are tested in test_compile_cases.py.
"""

from __future__ import annotations

import shutil

import pytest

from opcheck.runtime import run_check
from opcheck.runtime.compiled import CompiledMismatch
from opcheck.spec.model import COMPILE_CASES, CompileFlags, OpSpec, Sample, TensorArg
from tests.compile import corpus

NEEDS_CXX = pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("clang++")), reason="inductor on CPU needs a C++ compiler"
)
SAMPLES = {
    corpus.one_matrix: (TensorArg(shape=(4, 6)),),
    corpus.plain_matrix: (TensorArg(shape=(4, 6), requires_grad=False),),
    corpus.matrix_and_zero_dim_counter: (TensorArg(shape=(4, 6)), TensorArg(shape=(), values=0.0, requires_grad=False)),
    corpus.matrix_and_1d_amax: (TensorArg(shape=(4, 6)), TensorArg(shape=(1,), values=(0.25,), requires_grad=False)),
    corpus.matrix_and_amax: (TensorArg(shape=(4, 6)), TensorArg(shape=(), values=0.25, requires_grad=False)),
    corpus.activations_and_amax: (
        TensorArg(shape=(4, 6), requires_grad=False),
        TensorArg(shape=(), values=0.25, requires_grad=False),
    ),
}
ONLY_THE_SAMPLE = tuple(
    (case, "the corpus compares the sample as written") for case in COMPILE_CASES if case != "written"
)
SEEN = [c for c in corpus.CASES if c.before_backward is None]
"""The cases the check can see: what changes state between a forward and its backward is outside any call."""


def _spec(case: corpus.Case | corpus.TorchBug, fn, backend: str) -> OpSpec:
    return OpSpec(
        name=f"{case.name}_{fn.__name__}",
        op=f"tests.compile.corpus:{fn.__name__}",
        source="tests/compile/corpus.py",
        sha256="0" * 64,
        samples=(Sample("m", args=SAMPLES[case.make_inputs]),),
        compile=CompileFlags(backends=(backend,), cases_off=ONLY_THE_SAMPLE),
    )


def _params(backends_of):
    out = []
    for case in SEEN:
        for backend in backends_of(case):
            marks = [NEEDS_CXX] if backend == "inductor" else []
            out.append(pytest.param(case, backend, id=f"{case.name}-{backend}", marks=marks))
    return out


@pytest.mark.parametrize(("case", "backend"), _params(lambda case: case.reproduces))
def test_the_mutant_fails_the_compile_check(case, backend):
    with pytest.raises(CompiledMismatch) as failed:
        run_check(_spec(case, case.mutant, backend), "compile", "cpu", "float64", "m")
    message = str(failed.value)
    assert f"torch.compile(backend={backend!r})" in message
    assert "rerun:" in message and "test_compile[cpu-float64-m]" in message


@pytest.mark.parametrize(("case", "backend"), _params(lambda case: corpus.BACKENDS))
def test_the_twin_passes_it(case, backend):
    run_check(_spec(case, case.twin, backend), "compile", "cpu", "float64", "m")


def test_what_the_check_cannot_see_is_documented():
    # A backward that reads a global the training loop steps between forward and backward: no call
    # of the op changes it, so the compiled and eager runs agree. FORMAT.md says so.
    unseen = [c for c in corpus.CASES if c not in SEEN]
    assert [c.name for c in unseen] == ["backward_reads_global"]
    run_check(_spec(unseen[0], unseen[0].mutant, "aot_eager"), "compile", "cpu", "float64", "m")
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "opcheck" / "spec" / "FORMAT.md").read_text()
    assert "Python state that changes between a forward and its backward" in text


def _torch_bugs(twin: bool):
    from opcheck.spec import torch_condition

    out = []
    for bug in corpus.TORCH_BUGS:
        here = bug.fixed_in is None or torch_condition.installed_satisfies(f"<{bug.fixed_in}")
        for backend in corpus.BACKENDS if twin else bug.reproduces if here else ():
            marks = [NEEDS_CXX] if backend == "inductor" else []
            out.append(pytest.param(bug, backend, id=f"{bug.name}-{backend}", marks=marks))
    return out


@pytest.mark.parametrize(("bug", "backend"), _torch_bugs(twin=False))
def test_right_code_that_the_installed_torch_compiles_wrong_fails_too(bug, backend):
    # The model trained under compile is wrong there, whoever is at fault: the check says so.
    with pytest.raises(CompiledMismatch, match=f"torch.compile\\(backend={backend!r}\\)"):
        run_check(_spec(bug, bug.code, backend), "compile", "cpu", "float64", "m")


@pytest.mark.parametrize(("bug", "backend"), _torch_bugs(twin=True))
def test_the_same_math_without_the_trigger_passes(bug, backend):
    run_check(_spec(bug, bug.twin, backend), "compile", "cpu", "float64", "m")
