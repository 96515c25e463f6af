"""Deliberately broken autograd ops and their correct twins, built from named parts.

The engine's corpora (tests/engine/corpus.py, scale_mutants.py), the ops the mutation specs point
at (tests/mutation/mutants.py) and the runtime tests' ops (tests/runtime/runtime_ops.py) are all
built here, so that each idea (a stray factor, one wrong entry, a wrong jvp, a missing conj, ...)
is written once and every file states only its own numbers:

* `function` makes a `torch.autograd.Function` from a forward, a setup and a backward: in the
  modern style (forward, setup_context, an optional jvp and vmap rule) or in the old one
  (forward(ctx, ...)), as users write them.
* `Elementwise` is f(x) with its derivative f', computed from the saved input or output;
  `Elementwise.function` builds it with the backward `grad * f'` and the jvp `tangent * f'`.
* A *bug* is what that backward (or jvp) returns instead, from grad (or tangent) and the right
  derivative: `right` is the product; `scaled`, `conj_missing`, `ignores_grad_output`, ... are the
  deliberate mistakes. The twin of a mutant is the same call without its bug.
* `with_backward_function` and `sin_via` build ops whose second derivative is wrong while the
  first is right; `broadcast_mul`, `sin_cos` and `sparse_mm` the ops whose bug is not elementwise:
  a broadcast reduced over the wrong dim, an undefined grad_output, one value of a sparse gradient.

Imported as `tests.broken_ops`: pytest puts the repository root on the path (`pythonpath = ["."]`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable as _once_differentiable

Tensor = torch.Tensor

Bug = Callable[[Tensor, Any], Tensor]
"""What a backward (or jvp) returns, given grad (or tangent) and the right derivative f'."""

Where = int | tuple | Callable[[Tensor], Tensor]
"""Which elements a bug touches: an index into the gradient (`(0, 3)`, `(..., -1)`) or a mask of it."""


# ---------------------------------------------------------------------------------- Functions
def save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _save_nothing(ctx, inputs, output):
    pass


def function(name, forward, backward, *, setup=_save_nothing, jvp=None, old_style=False, vmap=False):
    """A `torch.autograd.Function` subclass named `name`, written from its parts.

    `setup(ctx, inputs, output)` saves what backward and jvp need. The modern style calls it as
    `setup_context`; the old style (`old_style=True`, forward(ctx, *inputs)) calls it at the end
    of forward. `vmap=True` sets `generate_vmap_rule` (modern style only).
    """
    if old_style and vmap:
        raise ValueError(f"{name}: an old-style Function has no vmap rule")
    if old_style:

        def forward_with_ctx(ctx, *inputs):
            output = forward(*inputs)
            setup(ctx, inputs, output)
            return output

        body = {"forward": staticmethod(forward_with_ctx)}
    else:
        body = {
            "forward": staticmethod(lambda *inputs: forward(*inputs)),
            "setup_context": staticmethod(setup),
            "generate_vmap_rule": vmap,
        }
    body["backward"] = staticmethod(backward)
    if jvp is not None:
        body["jvp"] = staticmethod(jvp)
    return type(name, (torch.autograd.Function,), {**body, "__qualname__": name})


# --------------------------------------------------------------------------------------- bugs
def right(grad, derivative):
    """The chain rule: grad times the derivative (no bug)."""
    return grad * derivative


def where_mask(t: Tensor, where: Where) -> Tensor:
    """A bool tensor shaped like `t`, True at `where`."""
    if callable(where):
        return where(t)
    mask = torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    mask[where] = True
    return mask


def tail(n: int) -> Callable[[Tensor], Tensor]:
    """The last `n` elements in row-major order (the remainder after a kernel's vectorized tiles)."""

    def mask(t):
        m = torch.zeros(t.shape, dtype=torch.bool, device=t.device)
        m.view(-1)[-n:] = True
        return m

    return mask


def in_dtype(dtype: torch.dtype) -> Callable[[Tensor], bool]:
    """For `when=`: only a gradient of this dtype (a fast path of one precision)."""
    return lambda t: t.dtype == dtype


def zero_dim(t: Tensor) -> bool:
    """For `when=`: only a zero-dim gradient."""
    return t.dim() == 0


def rescaled(t: Tensor, factor, *, at: Where | None = None, when: Callable[[Tensor], bool] | None = None) -> Tensor:
    """`t` times `factor`, everywhere or only `at` some elements, and only `when(t)` holds."""
    if when is not None and not when(t):
        return t
    if at is None:
        return t * factor
    return torch.where(where_mask(t, at), t * factor, t)


def scaled(factor, *, at: Where | None = None, when: Callable[[Tensor], bool] | None = None) -> Bug:
    """The right gradient times `factor` (a stray constant; -1: the sign is flipped), see `rescaled`.

    A factor of 1 is the mutant's twin: the same op, with the bug's arithmetic but no error.
    """
    return lambda grad, derivative: rescaled(grad * derivative, factor, at=at, when=when)


def conj_missing(*, at: Where | None = None) -> Bug:
    """grad times the derivative without its conj (PyTorch's convention is grad · conj(∂f/∂z))."""

    def bug(grad, derivative):
        wrong = grad * derivative.conj()
        return wrong if at is None else torch.where(where_mask(wrong, at), wrong, grad * derivative)

    return bug


def returned_as(convert: Callable[[Tensor], Tensor]) -> Bug:
    """The right values, returned converted (`Tensor.float`, `Tensor.to_sparse`, ...)."""
    return lambda grad, derivative: convert(grad * derivative)


def ignores_grad_output(grad, derivative):
    """The derivative alone: right only when grad_output is all ones, as in y.sum().backward()."""
    return derivative


def detached(grad, derivative):
    """grad times a detached derivative: the second derivative through x is lost."""
    return grad * derivative.detach()


def without_grad(grad, derivative):
    """The right values computed under torch.no_grad(): no second derivative at all."""
    with torch.no_grad():
        return grad * derivative


def plus_noise(noise: Callable[[Tensor], Tensor]) -> Bug:
    """The right gradient plus `noise(derivative)`: fresh on every call, not scaled by grad_output."""
    return lambda grad, derivative: grad * derivative + noise(derivative)


def noisy_derivative(noise: Callable[[Tensor], Tensor]) -> Bug:
    """grad times (derivative + `noise(derivative)`): nondeterministic, yet zero for a zero grad."""
    return lambda grad, derivative: grad * (derivative + noise(derivative))


def written_into_zeros(write: str) -> Bug:
    """The right gradient written into a fresh zero tensor by the method `write` ("copy_", "add_", "add").

    The fresh tensor is unbatched under vmap while the gradient is batched, so an in-place write
    fails there; "add" is the out-of-place twin.
    """
    return lambda grad, derivative: getattr(torch.zeros_like(derivative), write)(grad * derivative)


# -------------------------------------------------------------------------------- elementwise
@dataclasses.dataclass(frozen=True)
class Elementwise:
    """f applied elementwise, and its derivative f' from the saved input (`of="input"`) or output.

    A constant derivative (a number) saves nothing. `second` (f'') is for `with_backward_function`.
    """

    fn: Callable[[Tensor], Tensor]
    derivative: Callable[[Tensor], Any] | float
    of: str = "input"
    second: Callable[[Tensor], Tensor] | None = None

    def function(
        self,
        name,
        *,
        bug: Bug = right,
        jvp: bool = False,
        jvp_bug: Bug = right,
        jvp_of: str | None = None,
        jvp_derivative: Callable[[Tensor], Any] | None = None,
        old_style=False,
        vmap=False,
        once_differentiable=False,
    ):
        """The Function of f: backward `bug(grad, f')`, and with `jvp=True` a jvp `jvp_bug(tangent, f')`.

        The jvp may evaluate another derivative (`jvp_derivative`) or evaluate it on the other
        saved tensor (`jvp_of`).
        """
        constant = not callable(self.derivative)
        derivative = (lambda: self.derivative) if constant else self.derivative
        forward_derivative = jvp_derivative or derivative
        forward_of = jvp_of or self.of

        def setup(ctx, inputs, output):
            saved = {"input": inputs[0], "output": output}
            if not constant:
                ctx.save_for_backward(saved[self.of])
            if jvp:
                ctx.save_for_forward(saved[forward_of])

        def backward(ctx, grad):
            return bug(grad, derivative(*ctx.saved_tensors))

        def forward_grad(ctx, tangent):
            return jvp_bug(tangent, forward_derivative(*ctx.saved_tensors))

        return function(
            name,
            self.fn,
            _once_differentiable(backward) if once_differentiable else backward,
            setup=setup,
            jvp=forward_grad if jvp else None,
            old_style=old_style,
            vmap=vmap,
        )


SIN = Elementwise(torch.sin, torch.cos, second=lambda x: -torch.sin(x))
COS = Elementwise(torch.cos, lambda x: -torch.sin(x))
EXP = Elementwise(torch.exp, lambda y: y, of="output")
TANH = Elementwise(torch.tanh, lambda y: 1 - y * y, of="output")
SQUARE = Elementwise(lambda x: x * x, lambda x: 2 * x)


def with_backward_function(op: Elementwise, name, *, grad_bug: Bug = right, input_bug: Bug = right, old_style=False):
    """f whose backward is itself a Function of (grad, x), so that its own derivative can be wrong.

    That Function returns grad * f'(x); its backward is `grad_bug(gg, f'(x))` for grad and
    `input_bug(gg * grad, f''(x))` for x. The first derivative is right whatever the bugs.
    """

    def backward_of_backward(ctx, gg):
        grad, x = ctx.saved_tensors
        return grad_bug(gg, op.derivative(x)), input_bug(gg * grad, op.second(x))

    first = function(
        f"{name}Derivative",
        lambda grad, x: grad * op.derivative(x),
        backward_of_backward,
        setup=save_inputs,
        old_style=old_style,
    )
    return function(
        name, op.fn, lambda ctx, grad: first.apply(grad, *ctx.saved_tensors), setup=save_inputs, old_style=old_style
    )


def sin_via(name, cos_function):
    """sin whose backward is grad * `cos_function.apply(x)`, a Function of its own (as kernels reuse
    each other's autograd wrappers): that Function's jvp and backward make sin's second derivative.
    sin's own jvp is right."""
    return Elementwise(torch.sin, cos_function.apply).function(name, jvp=True, jvp_derivative=torch.cos)


# ----------------------------------------------------------------------------- not elementwise
def summed_to_size(t: Tensor, shape) -> Tensor:
    """The right reduction of a broadcast operand's gradient."""
    return t.sum_to_size(shape)


def summed_over_dim0(t: Tensor, shape) -> Tensor:
    """Reduced over dim 0 whatever the broadcast dim: a (3, 1) operand gets a (1, 4) gradient."""
    return t.sum(0, keepdim=True)


def summed_over_dim0_transposed(t: Tensor, shape) -> Tensor:
    """Reduced over the wrong dim and transposed, so that a square case "fits" the shape."""
    return t.sum(0, keepdim=True).t()


def broadcast_mul(name, reduce_a=summed_to_size, *, old_style=False):
    """a * b with `a` broadcast against `b`; `reduce_a(grad * b, a.shape)` is a's gradient."""

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return reduce_a(grad * b, a.shape), (grad * a).sum_to_size(b.shape)

    return function(name, lambda a, b: a * b, backward, setup=save_inputs, old_style=old_style)


def handles_undefined(x, grad_sin, grad_cos):
    """The right backward of (sin x, cos x): an undefined (None) grad_output adds nothing."""
    grad_x = torch.zeros_like(x)
    if grad_sin is not None:
        grad_x = grad_x + grad_sin * torch.cos(x)
    if grad_cos is not None:
        grad_x = grad_x - grad_cos * torch.sin(x)
    return grad_x


def assumes_defined(x, grad_sin, grad_cos):
    """Either grad_output may be None, and then `None * Tensor` raises TypeError."""
    return grad_sin * torch.cos(x) - grad_cos * torch.sin(x)


def stacks_defined_terms(x, grad_sin, grad_cos):
    """Copes with one undefined grad_output; with both, it stacks an empty list (RuntimeError)."""
    terms = []
    if grad_sin is not None:
        terms.append(grad_sin * torch.cos(x))
    if grad_cos is not None:
        terms.append(-grad_cos * torch.sin(x))
    return torch.stack(terms).sum(0)


def assumes_grad_sin_when_grad_cos_is_undefined(x, grad_sin, grad_cos):
    """Copes with one undefined grad_output; with both, `None * Tensor` raises TypeError."""
    if grad_sin is None and grad_cos is not None:
        return -grad_cos * torch.sin(x)
    if grad_cos is None:
        return grad_sin * torch.cos(x)
    return grad_sin * torch.cos(x) - grad_cos * torch.sin(x)


def sin_cos(name, backward, *, old_style=False):
    """(sin x, cos x) with grads not materialized: `backward(x, grad_sin, grad_cos)` may get None."""

    def setup(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(inputs[0])

    return function(
        name,
        lambda x: (torch.sin(x), torch.cos(x)),
        lambda ctx, grad_sin, grad_cos: backward(*ctx.saved_tensors, grad_sin, grad_cos),
        setup=setup,
        old_style=old_style,
    )


def sparse_mm(name, values_bug: Callable[[Tensor], Tensor] | None = None):
    """sparse COO `a` @ dense `b` with torch.sparse.mm's masked gradient: d a is specified where `a`
    is, one value per specified element (a row of grad times a row of b), and d b = aᵀ grad.

    `values_bug` maps those specified values to the ones returned. An undefined grad_output stays
    None, as for torch's own op.
    """

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)

    def backward(ctx, grad):
        if grad is None:
            return None, None
        a, b = ctx.saved_tensors
        rows, cols = a._indices()
        values = (grad[rows] * b[cols]).sum(-1)
        if values_bug is not None:
            values = values_bug(values)
        grad_a = torch.sparse_coo_tensor(a._indices(), values, a.shape, is_coalesced=True)
        return grad_a, torch.sparse.mm(a.t(), grad)

    return function(name, torch.sparse.mm, backward, setup=setup)


def mul(name, *, swapped=False):
    """a * b (same shapes) with backward (grad * b, grad * a), or with `swapped` the two returned in
    each other's place, as a binary kernel's backward that mixes up its outputs' order."""

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grads = (grad * b, grad * a)
        return grads[::-1] if swapped else grads

    return function(name, lambda a, b: a * b, backward, setup=save_inputs)


def row_sum(name, *, bug: Bug = right):
    """x.sum(-1): backward `bug(grad, 1)` (one value per row of x) broadcast back over x's last dim."""

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return bug(grad, 1.0).unsqueeze(-1).expand(x.shape).clone()

    return function(name, lambda x: x.sum(-1), backward, setup=save_inputs)


def rounded_to(dtype: torch.dtype, *, when: Callable[[Tensor], bool] | None = None) -> Bug:
    """The right gradient rounded to `dtype` and back (a kernel that computes in a narrower dtype),
    only `when(grad)` holds."""

    def bug(grad, derivative):
        right_grad = grad * derivative
        if when is not None and not when(right_grad):
            return right_grad
        return right_grad.to(dtype).to(right_grad.dtype)

    return bug


# ------------------------------------------------------------------- mutants named by hints
MulSwappedGradients = mul("MulSwappedGradients", swapped=True)
MulGradients = mul("MulGradients")
SinColumnThreeWrong = SIN.function("SinColumnThreeWrong", bug=scaled(2.0, at=(..., 3)))
SinColumnThreeRight = SIN.function("SinColumnThreeRight", bug=scaled(1.0, at=(..., 3)))
RowSumOneRowWrong = row_sum("RowSumOneRowWrong", bug=scaled(2.0, at=2))
RowSumOneRowRight = row_sum("RowSumOneRowRight", bug=scaled(1.0, at=2))
SinGradInBfloat16ForFloat32 = SIN.function(
    "SinGradInBfloat16ForFloat32", bug=rounded_to(torch.bfloat16, when=in_dtype(torch.float32))
)
SinGradInFloat32 = SIN.function("SinGradInFloat32", bug=rounded_to(torch.float32, when=in_dtype(torch.float32)))
SinGradOnePercentOffForFloat32 = SIN.function(
    "SinGradOnePercentOffForFloat32", bug=scaled(1.01, when=in_dtype(torch.float32))
)


def sin_grad_in_bfloat16_for_float32(x):
    return SinGradInBfloat16ForFloat32.apply(x)


def sin_grad_in_float32(x):
    return SinGradInFloat32.apply(x)


def sin_grad_one_percent_off_for_float32(x):
    return SinGradOnePercentOffForFloat32.apply(x)


# Ops that write into their inputs through the pointer, as Triton and CUDA kernels can: autograd's
# version counter does not see it (tests of clone_inputs and of the reentrancy failure).


class _SquareWritingIntoInput(torch.autograd.Function):
    """x * x whose backward adds 1 to its saved x through the pointer, as a kernel reusing its
    input's memory does: autograd's version counter does not see it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        out = g * 2 * x
        x.data.add_(1.0)
        return out


def square_writing_into_input(x):
    return _SquareWritingIntoInput.apply(x)


class _DoubleWritingIntoInput(torch.autograd.Function):
    """2x, left in x's own memory by the forward (through the pointer, as an in-place kernel)."""

    @staticmethod
    def forward(ctx, x):
        out = x * 2
        x.data.copy_(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return g * 2


def double_writing_into_input(x):
    return _DoubleWritingIntoInput.apply(x)
