"""Operators written the ways PyTorch users write them, tested by the specs in op_specs/.

- `Cube`: a custom torch.autograd.Function with backward, jvp and vmap support.
- `opcheck_examples::scaled_tanh`: a torch.library custom op with register_autograd and
  register_fake, so torch.library.opcheck's registration checks apply too.
- `fused_gelu_f32`: a kernel that exists only for float32 (as fused CUDA/Triton kernels often
  do). It has no float64 path to gradcheck, so its spec checks it against `gelu_reference` with
  the low-precision check.
"""

from __future__ import annotations

import math

import torch


class Cube(torch.autograd.Function):
    """x ** 3, with a hand-written backward (3x²·g), jvp (3x²·t) and vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x * x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent * 3 * x * x


def cube(x: torch.Tensor) -> torch.Tensor:
    return Cube.apply(x)


@torch.library.custom_op("opcheck_examples::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * tanh(x), as an opaque custom op (autograd only through register_autograd)."""
    return (torch.tanh(x) * scale).clone()


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_tanh_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale


def _scaled_tanh_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    # d/dx scale*tanh(x) = scale * (1 - tanh(x)^2) = scale - y^2 / scale
    return grad * (ctx.scale - y * y / ctx.scale), None


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_scaled_tanh_setup)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    """tanh-approximated GELU in plain torch ops: runs (and differentiates) in any dtype."""
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


class _FusedGeluF32(torch.autograd.Function):
    @staticmethod
    def forward(x):
        if x.dtype != torch.float32:
            raise TypeError(f"fused_gelu_f32 is a float32 kernel, got {x.dtype}")
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + torch.tanh(inner))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = torch.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)


def fused_gelu_f32(x: torch.Tensor) -> torch.Tensor:
    return _FusedGeluF32.apply(x)
