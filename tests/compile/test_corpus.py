"""The compile check against the corpus (corpus.py): every mutant fails it under each backend where
its bug shows, and every twin passes it under both backends, on the installed torch.

The specs are built as the model (no YAML): a corpus op may take no input that requires grad (the
quantizer's `activations_and_amax`), which a spec's gradient checks would refuse. Only the sample
as written is compared here, and the case that shows a mutant where it names one; the cases
beyond it are tested in test_compile_cases.py.
"""

from __future__ import annotations

import shutil

import pytest

from opcheck.runtime import run_check
from opcheck.runtime.compiled import STATE_BACKEND, CompiledMismatch
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


def _spec(case: corpus.Case | corpus.TorchBug, fn, backend: str) -> OpSpec:
    shows = getattr(case, "case", None)
    off = tuple((c, "the corpus compares the sample as written") for c in COMPILE_CASES if c not in ("written", shows))
    return OpSpec(
        name=f"{case.name}_{fn.__name__}",
        op=f"tests.compile.corpus:{fn.__name__}",
        source="tests/compile/corpus.py",
        sha256="0" * 64,
        samples=(Sample("m", args=SAMPLES[case.make_inputs]),),
        compile=CompileFlags(backends=(backend,), cases_off=off),
    )


def _params(backends_of):
    out = []
    for case in corpus.CASES:
        for backend in backends_of(case):
            marks = [NEEDS_CXX] if backend == "inductor" else []
            out.append(pytest.param(case, backend, id=f"{case.name}-{backend}", marks=marks))
    return out


@pytest.mark.parametrize(("case", "backend"), _params(lambda case: case.reproduces))
def test_the_mutant_fails_the_compile_check(case, backend):
    with pytest.raises(CompiledMismatch) as failed:
        run_check(_spec(case, case.mutant, backend), "compile", "cpu", "float64", "m")
    message = str(failed.value)
    # what the backward reads is bound by dynamo and AOTAutograd, so that case runs under aot_eager
    shown = STATE_BACKEND if case.case == "backward_state" else backend
    assert f"torch.compile(backend={shown!r})" in message
    assert "rerun:" in message and "test_compile[cpu-float64-m]" in message


@pytest.mark.parametrize(("case", "backend"), _params(lambda case: corpus.BACKENDS))
def test_the_twin_passes_it(case, backend):
    run_check(_spec(case, case.twin, backend), "compile", "cpu", "float64", "m")


def test_a_backward_that_reads_a_global_fails_naming_it_and_leaves_it_as_it_was():
    case = next(c for c in corpus.CASES if c.name == "registered_backward_reads_global")
    with pytest.raises(CompiledMismatch) as failed:
        run_check(_spec(case, case.mutant, "aot_eager"), "compile", "cpu", "float64", "m")
    message = str(failed.value)
    assert "Python numbers the backward reads, changed between forward and backward" in message
    assert "tests.compile.corpus.reversal_weight 1.0 -> 1.5 -> 2.0" in message
    assert "pass them to the op as arguments" in message
    assert corpus.reversal_weight == 1.0


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
