"""Ops with deliberate, well-placed bugs, for specs in tests/runtime to point at (`runtime_ops:name`)."""

from __future__ import annotations

import torch


class _OneWrongEntry(torch.autograd.Function):
    """sin(x) whose backward doubles the gradient of element [0, 3] only (vmappable, so the
    engine's batched full check applies)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gx = g * x.cos()
        wrong = torch.zeros(x.shape[-2:], dtype=torch.bool, device=x.device)
        wrong[0, 3] = True
        return torch.where(wrong, 2 * gx, gx)


def one_wrong_entry(x):
    return _OneWrongEntry.apply(x)


class _SinWrongInFloat32(torch.autograd.Function):
    """sin(x) whose float32 backward is 1% too large (the float64 and bfloat16 paths are right)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gx = g * x.cos()
        return gx * 1.01 if gx.dtype == torch.float32 else gx


def sin_wrong_in_float32(x):
    return _SinWrongInFloat32.apply(x)


def exp_float32_forward_off(x):
    """exp whose float32 forward is 0.1% too large: a lowprec output failure."""
    y = torch.exp(x)
    return y * 1.001 if x.dtype == torch.float32 else y


class _SquareWrong(torch.autograd.Function):
    """x**2 with backward 3x (instead of 2x): wrong everywhere."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * g * x


def square_wrong(x):
    return _SquareWrong.apply(x)


class _ExpWrongOnScalars(torch.autograd.Function):
    """exp whose backward is wrong for zero-dim inputs only."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y * (2 if y.dim() == 0 else 1)


def exp_wrong_on_scalars(x):
    return _ExpWrongOnScalars.apply(x)


class _NoDoubleBackward(torch.autograd.Function):
    """sin(x) whose backward is itself not differentiable (once_differentiable)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


def no_double_backward(x):
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


class _SquareWrongJvp(torch.autograd.Function):
    """x**2 with a right backward and a jvp of 3x·t (in float32 only when `only_float32`)."""

    @staticmethod
    def forward(x, only_float32):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])
        ctx.only_float32 = inputs[1]

    @staticmethod
    def backward(ctx, g, *_):
        (x,) = ctx.saved_tensors
        return 2 * g * x, None

    @staticmethod
    def jvp(ctx, t, _):
        (x,) = ctx.saved_tensors
        wrong = x.dtype == torch.float32 or not ctx.only_float32
        return (2.02 if ctx.only_float32 else 3) * x * t if wrong else 2 * x * t


def square_wrong_jvp(x):
    return _SquareWrongJvp.apply(x, False)


def square_wrong_jvp_in_float32(x):
    return _SquareWrongJvp.apply(x, True)


class _CosWithWrongDerivative(torch.autograd.Function):
    """cos(x) whose derivative has the wrong sign (backward and jvp)."""

    @staticmethod
    def forward(x):
        return x.cos()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.sin()

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.sin()


class _SinWrongSecondDerivative(torch.autograd.Function):
    """sin(x): right first derivative, wrong second (its backward uses the wrong-signed cos)."""

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * _CosWithWrongDerivative.apply(x)

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.cos()


def sin_wrong_second_derivative(x):
    return _SinWrongSecondDerivative.apply(x)


class _SinWithoutJvp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


def sin_without_jvp(x):
    return _SinWithoutJvp.apply(x)


def sawtooth(x):
    """x mod 2e-6: a jump within every finite-difference step, wherever the sample lands."""
    return torch.remainder(x, 2e-6)


def raises(x):
    raise RuntimeError("kernel exploded")


def generator_that_raises(device, dtype, generator):
    raise RuntimeError("no sample for you")


class _GeluF32WrongBackward(torch.autograd.Function):
    """A float32-only kernel (raises on other dtypes) whose backward drops the tanh term."""

    @staticmethod
    def forward(ctx, x):
        if x.dtype != torch.float32:
            raise TypeError("float32 kernel")
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 0.5 * (1 + torch.tanh(0.7978845608 * x))


def gelu_f32_wrong_backward(x):
    return _GeluF32WrongBackward.apply(x)


class _SparseMmWrongInFloat32(torch.autograd.Function):
    """torch.mm(a, b) for a sparse `a`; its float32 gradient of `a` is 1% too large at the first
    specified element (a masked gradient, like torch.sparse.mm's)."""

    @staticmethod
    def forward(a, b):
        return torch.mm(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        # An undefined grad_output stays None: torch cannot compare a sparse zero gradient with 0.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None
        a, b = ctx.saved_tensors
        ga = (g @ b.mT).sparse_mask(a).coalesce()
        values = ga._values().clone()
        if values.dtype == torch.float32:
            values[0] *= 1.01
        return torch.sparse_coo_tensor(ga._indices(), values, ga.shape, is_coalesced=True), a.t() @ g


def sparse_mm_wrong_in_float32(a, b):
    return _SparseMmWrongInFloat32.apply(a, b)
