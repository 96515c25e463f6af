"""The compile check's cases beyond the sample as written (aliased, noncontiguous, dynamic,
partial_grad, written), graph breaks and fullgraph, and the skips it says why for."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import Tensor

from opcheck.runtime import run_check
from opcheck.runtime.compiled import (
    TRITON_INTERPRETED,
    CompiledMismatch,
    CompiledUnsupported,
    comparisons,
)
from opcheck.runtime.outcomes import CheckSkipped
from opcheck.runtime.report import Case
from opcheck.runtime.samples import build_calls
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import CompileCase

NAMESPACE = "opcheck_compile_cases"
NEEDS_CXX = pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("clang++")), reason="inductor on CPU needs a C++ compiler"
)


# -- ops right for the sample as written, wrong in one case -------------------------------------
@torch.library.custom_op(f"{NAMESPACE}::strided_like_bug", mutates_args=())
def strided_like_bug(x: Tensor) -> Tensor:
    return torch.empty_like(x).copy_(x * 2)  # empty_like keeps a transposed input's strides


@strided_like_bug.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(x.shape)  # BUG: contiguous, where the kernel follows the input's layout


@torch.library.custom_op(f"{NAMESPACE}::strided_like_ok", mutates_args=())
def strided_like_ok(x: Tensor) -> Tensor:
    return torch.empty_like(x).copy_(x * 2)


@strided_like_ok.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::rows_bug", mutates_args=())
def rows_bug(x: Tensor) -> Tensor:
    return x.sum(dim=1)


@rows_bug.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(4)  # BUG: the row count of the first sample, not of x


@torch.library.custom_op(f"{NAMESPACE}::rows_ok", mutates_args=())
def rows_ok(x: Tensor) -> Tensor:
    return x.sum(dim=1)


@rows_ok.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[0])


def _twice(ctx, grad):
    return grad * 2


def _rows_backward(ctx, grad):
    return grad.unsqueeze(1).expand(ctx.shape)


def _rows_setup(ctx, inputs, output):
    ctx.shape = inputs[0].shape


strided_like_bug.register_autograd(_twice)
strided_like_ok.register_autograd(_twice)
rows_bug.register_autograd(_rows_backward, setup_context=_rows_setup)
rows_ok.register_autograd(_rows_backward, setup_context=_rows_setup)


class RowMean(torch.autograd.Function):
    """The mean of each column, its backward dividing by a row count kept on ctx as a Python int."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return x.mean(dim=0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.rows = int(inputs[0].shape[0])

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.rows, -1) / ctx.rows


def row_mean(x: Tensor) -> Tensor:
    return RowMean.apply(x)


def with_break(x: Tensor) -> Tensor:
    y = x.sin()
    torch._dynamo.graph_break()
    return y * 2


def add(a: Tensor, b: Tensor) -> Tensor:
    return a + b * 2


def _spec(op: str, compile_block: str, samples: str = "  - name: m\n    args: [{shape: [4, 6]}]\n"):
    text = f"op: {op}\nsamples:\n{samples}gradgradcheck: {{enabled: false}}\ncompile: {compile_block}\n"
    return load_spec_text(text, source="op_specs/x.yaml")[0]


HERE = "tests.compile.test_compile_cases"


# -- what each case feeds the compiled function ------------------------------------------------
def _planned(spec, sample="m", dtype="float64"):
    case = Case.of(spec, "compile", "cpu", dtype, sample)
    call = build_calls(spec, case.sample, "cpu", dtype, case.seed)[0]
    return comparisons(case, call)


def test_two_inputs_of_one_shape_are_aliased_and_only_the_first_keeps_requires_grad():
    spec = _spec(f"{HERE}:add", "true", "  - name: m\n    args: [{shape: [3, 4]}, {shape: [3, 4]}]\n")
    planned, not_tried = _planned(spec)
    made = dict(planned)
    assert list(made) == [None, CompileCase.ALIASED, CompileCase.NONCONTIGUOUS, CompileCase.DYNAMIC,
                          CompileCase.PARTIAL_GRAD, CompileCase.BACKWARD_STATE]  # fmt: skip
    _, (a, b), _ = made[CompileCase.ALIASED]
    assert a is b
    _, views, _ = made[CompileCase.NONCONTIGUOUS]
    _, given, _ = made[None]
    assert all(not v.is_contiguous() and torch.equal(v, g) and v.requires_grad for v, g in zip(views, given))
    _, partial, _ = made[CompileCase.PARTIAL_GRAD]
    assert [t.requires_grad for t in partial] == [True, False]
    assert not_tried == [
        "dynamic shapes at a second size: no other sample of the spec has the same arguments at other sizes"
    ]


def test_a_case_the_sample_cannot_make_is_said_and_a_case_turned_off_keeps_its_reason():
    spec = _spec(
        f"{HERE}:with_break",
        "{cases_off: {noncontiguous: the kernel copies its input first}}",
        "  - name: m\n    args: [{shape: [4, 6]}]\n  - name: n\n    args: [{shape: [5, 7]}]\n",
    )
    planned, not_tried = _planned(spec)
    assert [which for which, _ in planned] == [None, CompileCase.DYNAMIC, CompileCase.BACKWARD_STATE]
    _, _, partner = dict(planned)[CompileCase.DYNAMIC]
    assert [tuple(t.shape) for t in partner[1]] == [(5, 7)]  # the next sample, another size
    assert not_tried == [
        "non-contiguous views of the inputs: the kernel copies its input first",
        "the same tensor for two inputs: no two tensor inputs of one shape, dtype and requires_grad",
        "requires_grad on the first input only: fewer than two inputs require grad",
    ]


# -- the cases catch what the sample as written passes -----------------------------------------
@NEEDS_CXX
def test_a_fake_that_ignores_the_input_layout_fails_only_in_the_noncontiguous_case():
    off_but_layout = "{backends: [inductor], cases_off: {dynamic: one size}}"
    with pytest.raises(CompiledMismatch, match=r"non-contiguous views of the inputs") as failed:
        run_check(_spec(f"torch.ops.{NAMESPACE}.strided_like_bug", off_but_layout), "compile", "cpu", "float64", "m")
    assert "case: non-contiguous views of the inputs" in str(failed.value)
    run_check(_spec(f"torch.ops.{NAMESPACE}.strided_like_ok", off_but_layout), "compile", "cpu", "float64", "m")


def test_a_fake_right_at_one_size_fails_at_the_second_size_under_dynamic_shapes():
    two_sizes = "  - name: m\n    args: [{shape: [4, 6]}]\n  - name: n\n    args: [{shape: [6, 6]}]\n"
    block = "{cases_off: {noncontiguous: not this test}}"
    with pytest.raises(CompiledMismatch, match=r"\(dynamic shapes\)"):
        run_check(_spec(f"torch.ops.{NAMESPACE}.rows_bug", block, two_sizes), "compile", "cpu", "float64", "m")
    run_check(_spec(f"torch.ops.{NAMESPACE}.rows_ok", block, two_sizes), "compile", "cpu", "float64", "m")


def test_a_ctx_attribute_computed_from_a_shape_passes_at_a_second_size():
    # dynamo guards the size an int() of it reads and recompiles, so the compiled gradient is right
    # at both sizes (on the torches in range): the check must not call it wrong
    two_sizes = "  - name: m\n    args: [{shape: [4, 6]}]\n  - name: n\n    args: [{shape: [7, 6]}]\n"
    run_check(_spec(f"{HERE}:row_mean", "{cases_off: {noncontiguous: not this test}}", two_sizes), "compile",
              "cpu", "float64", "m")  # fmt: skip


# -- graph breaks ------------------------------------------------------------------------------
def test_a_graph_break_is_reported_and_fails_under_fullgraph(capsys):
    run_check(_spec(f"{HERE}:with_break", "true"), "compile", "cpu", "float64", "m")
    assert "graph break" in capsys.readouterr().out
    with pytest.raises(CompiledUnsupported, match="fullgraph: true, and dynamo broke the graph"):
        run_check(_spec(f"{HERE}:with_break", "{fullgraph: true}"), "compile", "cpu", "float64", "m")


def test_an_op_dynamo_runs_eagerly_passes_with_the_break_reported(capsys):
    # torch._dynamo.disable: the op runs outside the graph, so compile cannot change it; the
    # report says so, and fullgraph: true would make it a failure.
    run_check(
        _spec(f"{HERE}:eager_only", "{cases_off: {noncontiguous: x, dynamic: x}}"), "compile", "cpu", "float64", "m"
    )
    assert "graph break" in capsys.readouterr().out


@torch._dynamo.disable
def eager_only(x: Tensor) -> Tensor:
    return x * 2


def test_a_triton_kernel_under_the_interpreter_skips_with_the_reason():
    pytest.importorskip("triton")
    from opcheck.triton import setup

    if not setup().interpreting:
        pytest.skip("Triton compiles for a GPU here")
    text = (
        "op: examples.triton_kernels:swiglu\nrequires: [triton]\ndtypes: []\nlowprec_dtypes: [float32]\n"
        "reference: examples.triton_kernels:swiglu_reference\n"
        "samples: [{name: m, args: [{shape: [2, 8]}, {shape: [2, 8]}]}]\ncompile: true\n"
    )
    spec = load_spec_text(text, source="op_specs/x.yaml")[0]
    with pytest.raises(CheckSkipped) as skipped:
        run_check(spec, "compile", "cpu", "float32", "m")
    assert str(skipped.value) == TRITON_INTERPRETED
