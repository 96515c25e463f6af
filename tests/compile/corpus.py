"""Operators that are right in eager mode and wrong under torch.compile, each next to its correct twin.

Written the ways kernel authors write them: `torch.library.custom_op` with a `register_fake` and a
`register_autograd`, and `torch.autograd.Function`. A mutant differs from its twin only in the line
marked `# BUG:`. Eager runs the real kernel and reads Python state when it runs, so eager is right;
compile trusts what the op declares (the fake's shape, strides and dtype, `mutates_args`) and traces
the backward once, so the mutant's outputs or gradients differ there, or compile raises.

`CASES` at the end is the table a `compile` check runs: each case names the callable to compile,
how to build its inputs, what the check must do to show the bug, and the backends where it shows on
torch 2.13 and 2.14 (measured by comparing outputs and a VJP in float64 with eager). Importing this
module registers the custom ops once, in the namespace `opcheck_compile_corpus`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

NAMESPACE = "opcheck_compile_corpus"
BACKENDS = ("aot_eager", "inductor")


def _randn(size: int, dtype: torch.dtype, device: torch.device | str, *, requires_grad: bool = True) -> Tensor:
    # A generator seeded by the size makes each case's inputs the same in every run and process.
    g = torch.Generator().manual_seed(size)
    x = torch.randn(size, size + 2, generator=g, dtype=dtype).to(device)
    return x.requires_grad_(requires_grad)


def one_matrix(size: int, dtype: torch.dtype, device: torch.device | str) -> tuple[Tensor, ...]:
    """A (size, size + 2) matrix that requires grad: not square, so a swapped dimension shows."""
    return (_randn(size, dtype, device),)


def matrix_and_amax(size: int, dtype: torch.dtype, device: torch.device | str) -> tuple[Tensor, ...]:
    """A matrix that requires grad and a running-max buffer below its largest entry, so the op changes it."""
    return _randn(size, dtype, device), torch.full((), 0.25, dtype=dtype, device=device)


def activations_and_amax(size: int, dtype: torch.dtype, device: torch.device | str) -> tuple[Tensor, ...]:
    """matrix_and_amax without grad, as for a quantizing op that no gradient goes through."""
    return _randn(size, dtype, device, requires_grad=False), torch.full((), 0.25, dtype=dtype, device=device)


# ------------------------------------------------------------------------ 1. fake with wrong strides
# The kernel writes its result column-major, as a BLAS/Fortran-order kernel does. The same inductor
# stride assertion from a fake that disagrees with its kernel, in the wild:
# https://github.com/NVIDIA/cuEquivariance/issues/223
def _column_major_times_two(x: Tensor) -> Tensor:
    out = torch.empty_strided(x.shape, (1, x.shape[0]), dtype=x.dtype, device=x.device)
    return out.copy_(x * 2)


@torch.library.custom_op(f"{NAMESPACE}::fake_stride_bug", mutates_args=())
def fake_stride_bug(x: Tensor) -> Tensor:
    return _column_major_times_two(x)


@fake_stride_bug.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)  # BUG: the kernel returns column-major


@torch.library.custom_op(f"{NAMESPACE}::fake_stride_ok", mutates_args=())
def fake_stride_ok(x: Tensor) -> Tensor:
    return _column_major_times_two(x)


@fake_stride_ok.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty_strided(x.shape, (1, x.shape[0]))


def _times_two_backward(ctx: Any, grad: Tensor) -> Tensor:
    return grad * 2


fake_stride_bug.register_autograd(_times_two_backward)
fake_stride_ok.register_autograd(_times_two_backward)


def flattened_fake_stride_bug(x: Tensor) -> Tensor:
    """The fake says row-major, the kernel returns column-major.

    Eager flattens the real tensor, copying as its strides require. Compile plans `flatten` from the
    fake's strides: a view of a row-major buffer. aot_eager then runs that view on the real
    column-major tensor and raises ("view size is not compatible"); inductor's check of the
    fallback kernel's output strides raises an AssertionError before any silent misread.
    """
    return fake_stride_bug(x).flatten()


def flattened_fake_stride_ok(x: Tensor) -> Tensor:
    """Twin of flattened_fake_stride_bug: the fake declares the column-major strides the kernel returns."""
    return fake_stride_ok(x).flatten()


# ------------------------------------------------------------------------ 2. fake with a wrong shape
@torch.library.custom_op(f"{NAMESPACE}::fake_shape_bug", mutates_args=())
def fake_shape_bug(x: Tensor) -> Tensor:
    return x.sum(dim=1)


@fake_shape_bug.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[1])  # BUG: sum over dim 1 leaves dim 0


@torch.library.custom_op(f"{NAMESPACE}::fake_shape_ok", mutates_args=())
def fake_shape_ok(x: Tensor) -> Tensor:
    return x.sum(dim=1)


@fake_shape_ok.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[0])


def _row_sums_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.input_shape = inputs[0].shape


def _row_sums_backward(ctx: Any, grad: Tensor) -> Tensor:
    return grad.unsqueeze(1).expand(ctx.input_shape)


fake_shape_bug.register_autograd(_row_sums_backward, setup_context=_row_sums_setup_context)
fake_shape_ok.register_autograd(_row_sums_backward, setup_context=_row_sums_setup_context)


def row_sums_fake_shape_bug(x: Tensor) -> Tensor:
    """Row sums of a matrix, whose fake returns one entry per column instead of one per row.

    Eager never runs the fake. Compile builds the graph from it: the backward, which expands the
    (n,) gradient to the input's (n, m), is traced with a gradient of the fake's shape (m,), and
    compile fails on both backends ("expand: attempting to expand a dimension of length m -> n").
    """
    return fake_shape_bug(x)


def row_sums_fake_shape_ok(x: Tensor) -> Tensor:
    """Twin of row_sums_fake_shape_bug: the fake keeps dim 0."""
    return fake_shape_ok(x)


# ------------------------------------------------------------------------ 3. fake with a wrong dtype
@torch.library.custom_op(f"{NAMESPACE}::fake_dtype_bug", mutates_args=())
def fake_dtype_bug(x: Tensor) -> Tensor:
    return x * 2


@fake_dtype_bug.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x, dtype=torch.float32)  # BUG: the kernel keeps the input's dtype


@torch.library.custom_op(f"{NAMESPACE}::fake_dtype_ok", mutates_args=())
def fake_dtype_ok(x: Tensor) -> Tensor:
    return x * 2


@fake_dtype_ok.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


fake_dtype_bug.register_autograd(_times_two_backward)
fake_dtype_ok.register_autograd(_times_two_backward)


def shifted_fake_dtype_bug(x: Tensor) -> Tensor:
    """The fake says float32, the float64 kernel returns float64.

    aot_eager runs `+ 1` as an eager op on the real tensor, so it is right. Inductor generates the
    `+ 1` kernel for a float32 buffer: on torch 2.13 it reads the float64 bytes as float32 and is
    silently wrong (huge values); torch 2.14 checks the fallback kernel's output dtype and raises
    ("expected dtype torch.float32 but got torch.float64").
    """
    return fake_dtype_bug(x) + 1


def shifted_fake_dtype_ok(x: Tensor) -> Tensor:
    """Twin of shifted_fake_dtype_bug: the fake keeps the input's dtype."""
    return fake_dtype_ok(x) + 1


# ------------------------------------------------------------------------ 4. undeclared write, no output
# A running maximum of |x|, as fp8 delayed scaling keeps one per tensor. `mutates_args` "must be
# accurate, otherwise, the behavior is undefined" (torch.library.custom_op's docs; `"unknown"` is the
# pessimistic choice: https://github.com/pytorch/pytorch/pull/129614).
@torch.library.custom_op(f"{NAMESPACE}::record_amax_bug", mutates_args=())  # BUG: it writes `amax`
def record_amax_bug(x: Tensor, amax: Tensor) -> None:
    torch.maximum(amax, x.detach().abs().amax(), out=amax)


@record_amax_bug.register_fake
def _(x: Tensor, amax: Tensor) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::record_amax_ok", mutates_args=("amax",))
def record_amax_ok(x: Tensor, amax: Tensor) -> None:
    torch.maximum(amax, x.detach().abs().amax(), out=amax)


def scaled_by_recorded_amax_bug(x: Tensor, amax: Tensor) -> Tensor:
    """The op writes its running max into `amax` without declaring it in `mutates_args`.

    An op that returns nothing and declares no mutation is, to compile, a call without effect: the
    graph drops it, `x / amax` divides by the old maximum, and the buffer is never updated. Eager runs
    the kernel and divides by the new maximum. Both backends are silently wrong.
    """
    record_amax_bug(x, amax)
    return x / amax


def scaled_by_recorded_amax_ok(x: Tensor, amax: Tensor) -> Tensor:
    """Twin of scaled_by_recorded_amax_bug: `mutates_args=("amax",)`, so compile keeps the write and its order."""
    record_amax_ok(x, amax)
    return x / amax


# ------------------------------------------------------------------------ 5. undeclared write, read before it
@torch.library.custom_op(f"{NAMESPACE}::amax_of_bug", mutates_args=())  # BUG: it writes `amax`
def amax_of_bug(x: Tensor, amax: Tensor) -> Tensor:
    current = x.abs().amax()
    torch.maximum(amax, current, out=amax)
    return current


@amax_of_bug.register_fake
def _(x: Tensor, amax: Tensor) -> Tensor:
    return x.new_empty(())


@torch.library.custom_op(f"{NAMESPACE}::amax_of_ok", mutates_args=("amax",))
def amax_of_ok(x: Tensor, amax: Tensor) -> Tensor:
    current = x.abs().amax()
    torch.maximum(amax, current, out=amax)
    return current


@amax_of_ok.register_fake
def _(x: Tensor, amax: Tensor) -> Tensor:
    return x.new_empty(())


def renormalized_bug(x: Tensor, amax: Tensor) -> Tensor:
    """Normalize by the running maximum recorded so far, rescale by this batch's, which the op records.

    The op writes `amax` without declaring it. Eager reads `amax` for `x / amax` before the op runs.
    Inductor, told that nothing writes `amax`, fuses `x / amax` into the kernel that multiplies by
    the op's result, which runs after the op, and reads the new maximum: silently wrong. aot_eager
    runs the graph in program order, so it is right.
    """
    normalized = (x / amax).clamp(-1, 1)
    current = amax_of_bug(x, amax)
    return normalized * current


def renormalized_ok(x: Tensor, amax: Tensor) -> Tensor:
    """Twin of renormalized_bug: `mutates_args=("amax",)` orders the read before the write."""
    normalized = (x / amax).clamp(-1, 1)
    current = amax_of_ok(x, amax)
    return normalized * current


# ------------------------------------------------------------------------ 6. backward reads Python state
# The weight of a gradient reversal layer, stepped by a schedule from outside the model.
reversal_weight = 1.0


class GradReversalBug(torch.autograd.Function):
    """Identity forward, backward -weight * grad, with the weight read when the backward runs."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return -reversal_weight * grad  # BUG: read at backward time


class GradReversalOk(torch.autograd.Function):
    """Twin of GradReversalBug: the weight is read in the forward and kept on ctx."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.weight = reversal_weight

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return -ctx.weight * grad


def reversed_grad_bug(x: Tensor) -> Tensor:
    """Gradient reversal whose backward reads the module-level weight when the backward runs.

    dynamo traces the backward while it compiles the forward and binds the weight it saw then.
    When the weight changes after the forward and before the backward, eager's gradient uses the new
    weight and the compiled one the old: silently wrong on both backends. (Before a forward, dynamo
    guards on the weight and recompiles.)
    """
    return GradReversalBug.apply(x)


def reversed_grad_ok(x: Tensor) -> Tensor:
    """Twin of reversed_grad_bug: the weight is read in the forward and kept on ctx."""
    return GradReversalOk.apply(x)


# The same layer as a torch.library custom op, as a kernel author registers one.
@torch.library.custom_op("opcheck_compile_corpus::reverse_grad", mutates_args=())
def _reverse_grad(x: Tensor) -> Tensor:
    return x.clone()


@_reverse_grad.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


def _reverse_grad_backward(ctx: Any, grad: Tensor) -> Tensor:
    return -reversal_weight * grad  # BUG: a registered backward reads the global


_reverse_grad.register_autograd(_reverse_grad_backward)


@torch.library.custom_op("opcheck_compile_corpus::reverse_grad_weighted", mutates_args=())
def _reverse_grad_weighted(x: Tensor, weight: float) -> Tensor:
    return x.clone()


@_reverse_grad_weighted.register_fake
def _(x: Tensor, weight: float) -> Tensor:
    return torch.empty_like(x)


def _keep_weight(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.weight = inputs[1]


def _reverse_grad_weighted_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    return -ctx.weight * grad, None


_reverse_grad_weighted.register_autograd(_reverse_grad_weighted_backward, setup_context=_keep_weight)


def reversed_grad_op_bug(x: Tensor) -> Tensor:
    """Gradient reversal as a custom op whose registered backward reads the module-level weight.

    AOTAutograd traces a custom op's backward when it compiles, without guards: the weight is
    frozen at its value then, for every later call, while eager reads it each time the backward
    runs. Silently wrong on both backends once the schedule moves the weight.
    """
    return _reverse_grad(x)


def reversed_grad_op_ok(x: Tensor) -> Tensor:
    """Twin of reversed_grad_op_bug: the weight is passed to the op, which keeps it on ctx (dynamo
    guards the read here and recompiles when it changes)."""
    return _reverse_grad_weighted(x, reversal_weight)


# ------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Case:
    """One mutant and its twin, and what a compile check must do to tell them apart.

    `how` says it in words. `reproduces` lists the backends where the mutant differs from eager (or
    raises) while the twin matches, on torch 2.13 and 2.14 alike. `case`: the compile check's case
    that shows it (a `compile.cases_off` key), where the sample as written does not.
    """

    name: str
    mutant: Callable[..., Any]
    twin: Callable[..., Any]
    make_inputs: Callable[[int, torch.dtype, torch.device | str], tuple[Tensor, ...]]
    how: str
    reproduces: tuple[str, ...] = BACKENDS
    case: str | None = None

    @property
    def why(self) -> str:
        """What the bug is and why compile exposes it: the mutant's docstring."""
        return self.mutant.__doc__ or ""


# Every case below shows on torch 2.13 and 2.14 alike, on the backends in its `reproduces`.
CASES = [
    Case("fake_stride", flattened_fake_stride_bug, flattened_fake_stride_ok, one_matrix, "outputs (raises)"),
    Case("fake_shape", row_sums_fake_shape_bug, row_sums_fake_shape_ok, one_matrix, "vjp (compile raises)"),
    # aot_eager runs the consumer eagerly on the real tensor, so only inductor's kernels misread it:
    # silently on torch 2.13, with a RuntimeError (its new dtype check) on 2.14.
    Case("fake_dtype", shifted_fake_dtype_bug, shifted_fake_dtype_ok, one_matrix, "outputs", reproduces=("inductor",)),
    Case(
        "undeclared_mutation_dropped",
        scaled_by_recorded_amax_bug,
        scaled_by_recorded_amax_ok,
        matrix_and_amax,
        "outputs and written inputs, fresh inputs per call",
    ),
    # aot_eager runs the graph in program order; inductor's fusion moves the read after the write.
    Case(
        "undeclared_mutation_reordered",
        renormalized_bug,
        renormalized_ok,
        activations_and_amax,
        "outputs and written inputs, fresh inputs per call",
        reproduces=("inductor",),
    ),
    Case(
        "backward_reads_global",
        reversed_grad_bug,
        reversed_grad_ok,
        one_matrix,
        "vjp with the global changed between forward and backward",
        case="backward_state",
    ),
    Case(
        "registered_backward_reads_global",
        reversed_grad_op_bug,
        reversed_grad_op_ok,
        one_matrix,
        "vjp with the global changed after the first compiled call",
        case="backward_state",
    ),
]


# ------------------------------------------------------------------------ torch's own bugs
# Code that is right, which compile gets wrong on the installed torch: the check must fail it too,
# since the model trained under compile is wrong. Each twin computes the same without the trigger.
def bump_zero_dim(x: Tensor, count: Tensor) -> Tensor:
    """A step counter kept in a 0-dim float64 tensor, bumped in place: torch 2.13 loses the write
    under compile (both backends); torch 2.14 keeps it."""
    count.add_(1)
    return x * 2


def bump_zero_dim_through_view(x: Tensor, count: Tensor) -> Tensor:
    """Twin of bump_zero_dim: the same write, through a 1-d view."""
    count.unsqueeze(0).add_(1)
    return x * 2


def matrix_and_zero_dim_counter(size: int, dtype: torch.dtype, device: torch.device | str) -> tuple[Tensor, ...]:
    """A matrix that requires grad and a 0-dim counter at 0."""
    return _randn(size, dtype, device), torch.zeros((), dtype=dtype, device=device)


def scale_then_record(x: Tensor, amax: Tensor) -> Tensor:
    """fp8-style delayed scaling: the scale from the recorded maximum, then the maximum updated in
    place. Under compile the backward recomputes `1 / amax` from the updated buffer, so the gradient
    is scaled by the new maximum (https://github.com/pytorch/pytorch/pull/197039)."""
    scale = 1 / amax
    amax.copy_(torch.maximum(amax, x.detach().abs().amax()))
    return x * scale


def scale_and_return_record(x: Tensor, amax: Tensor) -> tuple[Tensor, Tensor]:
    """Twin of scale_then_record: the new maximum is returned, not written."""
    scale = 1 / amax
    return x * scale, torch.maximum(amax, x.detach().abs().amax())


def matrix_and_1d_amax(size: int, dtype: torch.dtype, device: torch.device | str) -> tuple[Tensor, ...]:
    """A matrix that requires grad and a one-entry running maximum below its largest entry."""
    return _randn(size, dtype, device), torch.full((1,), 0.25, dtype=dtype, device=device)


@torch.library.custom_op(f"{NAMESPACE}::add_one_", mutates_args=("x",))
def add_one_(x: Tensor) -> None:
    x.add_(1)


def add_one_to_row_clone(x: Tensor) -> Tensor:
    """A declared in-place custom op on a clone of row 1: inductor hands it row 0's memory and
    returns row 0 + 1 (related: https://github.com/pytorch/pytorch/issues/131192,
    https://github.com/pytorch/pytorch/issues/153389)."""
    row = x[1].clone()
    add_one_(row)
    return row


def row_plus_one(x: Tensor) -> Tensor:
    """Twin of add_one_to_row_clone: out of place."""
    return x[1] + 1


def plain_matrix(size: int, dtype: torch.dtype, device: torch.device | str) -> tuple[Tensor, ...]:
    """A matrix that does not require grad."""
    return (_randn(size, dtype, device, requires_grad=False),)


@dataclass(frozen=True)
class TorchBug:
    """Right code that compile gets wrong, where `reproduces` (backends) on torches below `fixed_in`
    (None: every torch in range)."""

    name: str
    code: Callable[..., Any]
    twin: Callable[..., Any]
    make_inputs: Callable[[int, torch.dtype, torch.device | str], tuple[Tensor, ...]]
    reproduces: tuple[str, ...]
    fixed_in: str | None = None


TORCH_BUGS = [
    TorchBug(
        "zero_dim_float64_write",
        bump_zero_dim,
        bump_zero_dim_through_view,
        matrix_and_zero_dim_counter,
        BACKENDS,
        fixed_in="2.14",
    ),  # fmt: skip
    TorchBug("recompute_reads_written_input", scale_then_record, scale_and_return_record, matrix_and_1d_amax, BACKENDS),
    TorchBug("mutable_op_on_row_clone", add_one_to_row_clone, row_plus_one, plain_matrix, ("inductor",)),
]
