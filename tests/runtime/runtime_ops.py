"""Ops with deliberate, well-placed bugs, for specs in tests/runtime to point at (`runtime_ops:name`).

The bugs are built from the parts in tests/broken_ops.py; each op here is a plain function, so
that a failure's `call:` row names it.
"""

from __future__ import annotations

import torch

from tests.broken_ops import (
    COS,
    EXP,
    SIN,
    SQUARE,
    Elementwise,
    in_dtype,
    rescaled,
    scaled,
    sin_via,
    sparse_mm,
    zero_dim,
)
from tests.broken_ops import double_writing_into_input as double_writing_into_input
from tests.broken_ops import square_writing_into_input as square_writing_into_input

# sin(x) whose backward doubles the gradient of element [0, 3] only (vmappable, so the engine's
# batched full check applies).
_OneWrongEntry = SIN.function("_OneWrongEntry", vmap=True, bug=scaled(2, at=(..., 0, 3)))


def one_wrong_entry(x):
    return _OneWrongEntry.apply(x)


# sin(x) whose float32 backward is 1% too large (the float64 and bfloat16 paths are right).
_SinWrongInFloat32 = SIN.function("_SinWrongInFloat32", old_style=True, bug=scaled(1.01, when=in_dtype(torch.float32)))


def sin_wrong_in_float32(x):
    return _SinWrongInFloat32.apply(x)


def exp_float32_forward_off(x):
    """exp whose float32 forward is 0.1% too large: a lowprec output failure."""
    y = torch.exp(x)
    return y * 1.001 if x.dtype == torch.float32 else y


_SquareWrong = SQUARE.function("_SquareWrong", old_style=True, bug=scaled(1.5))  # 3x instead of 2x: wrong everywhere


def square_wrong(x):
    return _SquareWrong.apply(x)


def _one_where_zero(grad, derivative):
    """grad times the derivative, taken as 1 where it is exactly 0 (a special case for masked-out
    entries gone wrong)."""
    return grad * torch.where(derivative == 0, torch.ones_like(derivative), derivative)


_SquareWrongAtZero = SQUARE.function("_SquareWrongAtZero", vmap=True, bug=_one_where_zero)


def square_wrong_at_zero(x):
    """x² whose backward is wrong only where x is exactly 0.0, a value uniform draws never hit
    (and the values of a file, such as a mask's row that is all off, may)."""
    return _SquareWrongAtZero.apply(x)


_ExpWrongOnScalars = EXP.function("_ExpWrongOnScalars", old_style=True, bug=scaled(2, when=zero_dim))


def exp_wrong_on_scalars(x):
    """exp whose backward is wrong for zero-dim inputs only."""
    return _ExpWrongOnScalars.apply(x)


_NoDoubleBackward = SIN.function("_NoDoubleBackward", old_style=True, once_differentiable=True)


def no_double_backward(x):
    """sin(x) whose backward is itself not differentiable (once_differentiable)."""
    return _NoDoubleBackward.apply(x)


KINK = 0.0
"""Where `kinked` has its kink; tests move it next to a drawn value."""


def kinked(x):
    return (x - KINK).abs()


def take_rows(x, index, mask, scale):
    """Index and mask arguments next to a differentiable one."""
    return x[index] * mask.to(x.dtype)[index] * scale


def weighted_sum(tensors, weights=None):
    """A tensor list and an optional tensor kwarg."""
    out = sum(t.sum() for t in tensors)
    return out * weights.sum() if weights is not None else out


def sample_generator(device, dtype, generator):
    x = torch.rand(3, 4, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)
    return (x.requires_grad_(),), {"dim": 1}


def sample_generator_plain(device, dtype, generator):
    """Returns bare args with nothing marked requires_grad."""
    return torch.rand(5, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device), 2.0


@torch.library.custom_op("opcheck_runtime_tests::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_sin_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _scaled_sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x) * ctx.scale, None


scaled_sin.register_autograd(_scaled_sin_backward, setup_context=_scaled_sin_setup)


@torch.library.custom_op("opcheck_runtime_tests::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    """A custom op with autograd but without a fake (meta) implementation."""
    return torch.cos(x)


def _no_fake_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _no_fake_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return -grad * torch.sin(x)


no_fake.register_autograd(_no_fake_backward, setup_context=_no_fake_setup)


# x**2 with a right backward and a jvp of 3x·t, or of 2.02x·t in float32 only.
_SquareWrongJvp = SQUARE.function("_SquareWrongJvp", jvp=True, jvp_bug=scaled(1.5))
_SquareWrongJvpInFloat32 = SQUARE.function(
    "_SquareWrongJvpInFloat32", jvp=True, jvp_bug=scaled(1.01, when=in_dtype(torch.float32))
)


def square_wrong_jvp(x):
    return _SquareWrongJvp.apply(x)


def square_wrong_jvp_in_float32(x):
    return _SquareWrongJvpInFloat32.apply(x)


# cos(x) whose derivative has the wrong sign (backward and jvp), and sin(x) with a right first
# derivative and a wrong second one: its backward uses that cos.
_CosWithWrongDerivative = COS.function("_CosWithWrongDerivative", jvp=True, bug=scaled(-1), jvp_bug=scaled(-1))
_SinWrongSecondDerivative = sin_via("_SinWrongSecondDerivative", _CosWithWrongDerivative)


def sin_wrong_second_derivative(x):
    return _SinWrongSecondDerivative.apply(x)


_SinWithoutJvp = SIN.function("_SinWithoutJvp", old_style=True)


def sin_without_jvp(x):
    return _SinWithoutJvp.apply(x)


def sawtooth(x):
    """x mod 2e-6: a jump within every finite-difference step, wherever the sample lands."""
    return torch.remainder(x, 2e-6)


def raises(x):
    raise RuntimeError("kernel exploded")


def generator_that_raises(device, dtype, generator):
    raise RuntimeError("no sample for you")


def _gelu_f32(x):
    if x.dtype != torch.float32:
        raise TypeError("float32 kernel")
    return torch.nn.functional.gelu(x, approximate="tanh")


# A float32-only kernel (raises on other dtypes) whose backward drops the tanh term.
_GeluF32WrongBackward = Elementwise(_gelu_f32, lambda x: 0.5 * (1 + torch.tanh(0.7978845608 * x))).function(
    "_GeluF32WrongBackward", old_style=True
)


def gelu_f32_wrong_backward(x):
    return _GeluF32WrongBackward.apply(x)


# torch.sparse.mm(a, b) for a sparse `a`; its float32 gradient of `a` is 1% too large at the first
# specified element (a masked gradient, like torch.sparse.mm's).
_SparseMmWrongInFloat32 = sparse_mm(
    "_SparseMmWrongInFloat32", lambda values: rescaled(values, 1.01, at=0, when=in_dtype(torch.float32))
)


def sparse_mm_wrong_in_float32(a, b):
    return _SparseMmWrongInFloat32.apply(a, b)


# A convolution with a backward and nothing else (a custom op: no forward AD, no double backward,
# no vmap rule), as a CUDA or Triton kernel is registered; CONV_CALLS counts its forward calls.
CONV_CALLS = [0]


@torch.library.custom_op("opcheck_runtime_tests::backward_only_conv", mutates_args=())
def backward_only_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    CONV_CALLS[0] += 1
    return torch.nn.functional.conv2d(x, w, padding=1)


@backward_only_conv.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[0], *x.shape[2:])


def _conv_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


@torch.library.custom_op("opcheck_runtime_tests::conv_backward", mutates_args=())
def _conv_backward_kernel(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward kernel, registered without autograd of its own: double backward raises."""
    return torch.nn.grad.conv2d_input(x.shape, w, g, padding=1), torch.nn.grad.conv2d_weight(x, w.shape, g, padding=1)


@_conv_backward_kernel.register_fake
def _(g, x, w):
    return torch.empty_like(x), torch.empty_like(w)


def _conv_backward(ctx, g):
    x, w = ctx.saved_tensors
    return _conv_backward_kernel(g, x, w)


backward_only_conv.register_autograd(_conv_backward, setup_context=_conv_setup)
