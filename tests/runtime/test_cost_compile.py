"""The estimate of a `compile` test (opcheck.runtime.cost.estimate): it counts the comparisons the
test makes under each backend (opcheck.runtime.compiled.comparisons), a graph and the op's runs
each. Nothing here judges a time: only counts and the arithmetic of the model."""

from __future__ import annotations

import pytest

from opcheck.runtime.context import Settings
from opcheck.runtime.cost.estimate import (
    COMPILE_RUNS,
    COMPILE_SECONDS_PER_GRAPH,
    STATE_GRAPHS,
    STATE_RUNS,
    estimate_spec,
    machine_factor,
)
from opcheck.spec.model import CompileFlags, Location, OpSpec, Sample, TensorArg

pytestmark = pytest.mark.filterwarnings("ignore")

SOURCE = "op_specs/cost_compile.yaml"
DEFAULTS = CompileFlags()


def _spec(op: str, inputs: int, compile: CompileFlags | None = DEFAULTS, **changes) -> OpSpec:
    args = tuple(TensorArg(shape=(3, 4)) for _ in range(inputs))
    fields = dict(
        name="compiled",
        op=op,
        source=SOURCE,
        sha256="0",
        samples=(Sample("small", args=args, location=Location(SOURCE, 5, 5)),),
        dtypes=("float64",),
        devices=("cpu",),
        compile=compile,
        location=Location(SOURCE, 1, 1),
    )
    fields.update(changes)
    return OpSpec(**fields)


def _compile_estimate(spec: OpSpec, threshold: float = 1.0):
    found = [e for e in estimate_spec(spec, Settings(), threshold=threshold) if e.case.check == "compile"]
    assert len(found) == 1, found
    assert found[0].skipped is None, found[0].skipped
    return found[0]


def test_two_inputs_of_one_shape_add_the_aliased_and_partial_grad_comparisons():
    # the sample as written, noncontiguous, dynamic; with two inputs also aliased and partial_grad
    one = _compile_estimate(_spec("torch.sin", 1))
    two = _compile_estimate(_spec("torch.mul", 2))
    assert "torch.compile: 3 graph(s) per backend" in one.path
    assert "torch.compile: 5 graph(s) per backend" in two.path
    # each comparison runs the op eagerly and compiled; the dynamic case runs a second sample too;
    # the backward_state case runs once whatever the backends
    assert one.calls.forward == one.calls.backward == COMPILE_RUNS * 4 + STATE_RUNS
    assert two.calls.forward == COMPILE_RUNS * 6 + STATE_RUNS


def test_each_backend_compiles_its_own_graphs():
    both = CompileFlags(backends=("aot_eager", "inductor"))
    est = _compile_estimate(_spec("torch.sin", 1, compile=both))
    assert "torch.compile (aot_eager, inductor) against eager" in est.path
    assert est.calls.forward == 2 * COMPILE_RUNS * 4 + STATE_RUNS
    compiling = 3 * (COMPILE_SECONDS_PER_GRAPH["aot_eager"] + COMPILE_SECONDS_PER_GRAPH["inductor"])
    compiling += STATE_GRAPHS * COMPILE_SECONDS_PER_GRAPH["aot_eager"]  # backward_state: aot_eager only
    assert "torch.compile: 3 graph(s) for the Python numbers the backward reads" in est.path
    assert est.seconds == pytest.approx(compiling * machine_factor() + est.evaluations)


def test_a_case_turned_off_is_no_comparison():
    off = CompileFlags(cases_off=(("noncontiguous", "the kernel takes contiguous buffers only"),))
    est = _compile_estimate(_spec("torch.sin", 1, compile=off))
    assert "torch.compile: 2 graph(s) per backend" in est.path
    no_state = CompileFlags(cases_off=(("backward_state", "the backward reads nothing of Python's"),))
    est = _compile_estimate(_spec("torch.sin", 1, compile=no_state))
    assert not any("the backward reads" in p for p in est.path)
    assert est.calls.forward == COMPILE_RUNS * 4


def test_an_expensive_compile_test_under_inductor_is_told_of_aot_eager_alone():
    both = CompileFlags(backends=("aot_eager", "inductor"))
    est = _compile_estimate(_spec("torch.sin", 1, compile=both), threshold=0.0)
    (advice,) = est.advice
    assert advice.startswith("`compile: {backends: [aot_eager]}`: ~")
    assert _compile_estimate(_spec("torch.sin", 1), threshold=0.0).advice == ()  # aot_eager alone: nothing cheaper
