"""Forward AD through a function that does not support it: opcheck raises what torch raises.

PyTorch's own tests (test_ops_fwd_gradients.py: test_forward_mode_AD, test_fn_fwgrad_bwgrad) call
gradcheck with check_forward_ad=True, and gradgradcheck with check_fwd_over_rev=True, on ops that
declare forward AD unsupported, and expect NotImplementedError. The drop-in lets torch's exception
through as torch does: the same type and first line, in slow and fast mode.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import opcheck


class ProductSumWithoutJvp(torch.autograd.Function):
    """(x * w).sum() with a backward and no jvp."""

    @staticmethod
    def forward(x, w):
        return (x * w).sum()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, g * x


class CosTimesWithoutJvp(torch.autograd.Function):
    """g * cos(x) with a backward and no jvp: sin's backward below."""

    @staticmethod
    def forward(g, x):
        return g * x.cos()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, gg):
        g, x = ctx.saved_tensors
        return gg * x.cos(), -gg * g * x.sin()


class SinWhoseBackwardHasNoJvp(torch.autograd.Function):
    """sin with a jvp, whose backward is a Function without one: forward over reverse needs it."""

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return CosTimesWithoutJvp.apply(g, x)

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.cos()


@functools.cache
def product_sum_op():
    """(x * w).sum() as a torch.library custom op whose autograd is registered without a jvp (as
    op_db's linear_cross_entropy chunked variants are). With every input dual and none requiring
    grad, its kernel runs without autograd and gives no tangent: torch's fast mode sees a zero JVP,
    then recomputes the block with the other inputs as given (requiring grad), where the op's
    autograd.Function raises NotImplementedError."""

    @torch.library.custom_op("opcheck_tests::product_sum", mutates_args=())
    def product_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x * w).sum()

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, g * x

    product_sum.register_autograd(backward, setup_context=setup_context)
    return product_sum


FUNCTIONS = {
    "function_without_jvp": (lambda: ProductSumWithoutJvp.apply, 2),
    "custom_op_without_jvp": (product_sum_op, 2),
    "custom_op_of_sin_without_jvp": (lambda: lambda x, w: product_sum_op()(x.sin(), w), 2),
    "backward_without_jvp": (lambda: SinWhoseBackwardHasNoJvp.apply, 1),
    "aten_op_without_forward_ad": (lambda: torch.cdist, 2),
}

CHECKS = {
    "gradcheck_forward_ad": ("gradcheck", dict(check_forward_ad=True, check_backward_ad=False)),
    "gradgradcheck_fwd_over_rev": (
        "gradgradcheck",
        dict(check_fwd_over_rev=True, check_rev_over_rev=False, check_undefined_grad=False),
    ),
}


def _inputs(n: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(n))


def _outcome(module, checker: str, fn, n: int, flags: dict) -> tuple[object, str]:
    """(what the check returned, "") or (the exception's type, its first line); opcheck's
    GradcheckError counts as torch's, which it subclasses."""
    torch.manual_seed(0)  # gradgradcheck draws its grad_outputs from the global generator
    try:
        return getattr(module, checker)(fn, _inputs(n), **flags), ""
    except Exception as e:  # noqa: BLE001 - the exception is the outcome
        kind = GradcheckError if isinstance(e, GradcheckError) else type(e)
        return kind, str(e).strip().splitlines()[0]


@pytest.mark.parametrize("fast_mode", [False, True], ids=["slow", "fast"])
@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_same_exception_and_first_line_as_torch(name, check, fast_mode):
    make, n = FUNCTIONS[name]
    checker, flags = CHECKS[check]
    flags = dict(flags, fast_mode=fast_mode)
    expected = _outcome(torch.autograd, checker, make(), n, flags)
    assert _outcome(opcheck, checker, make(), n, flags) == expected


def test_the_cases_exercise_the_missing_forward_ad():
    # Where torch's verdict is about the missing jvp or formula, as its tests expect.
    missing = ("You must implement the jvp function", "Trying to use forward AD with")
    for name, check, fast_mode in [
        ("function_without_jvp", "gradcheck_forward_ad", False),
        ("custom_op_without_jvp", "gradcheck_forward_ad", True),
        ("custom_op_of_sin_without_jvp", "gradgradcheck_fwd_over_rev", False),
        ("backward_without_jvp", "gradgradcheck_fwd_over_rev", True),
        ("aten_op_without_forward_ad", "gradcheck_forward_ad", True),
        ("aten_op_without_forward_ad", "gradgradcheck_fwd_over_rev", False),
    ]:
        make, n = FUNCTIONS[name]
        checker, flags = CHECKS[check]
        kind, line = _outcome(torch.autograd, checker, make(), n, dict(flags, fast_mode=fast_mode))
        assert kind is NotImplementedError and line.startswith(missing), (name, check, kind, line)
