"""A user's module as specs name it (`opcheck_spec_fixture:Square.apply`), for the spec tests."""

import torch


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def small_inputs(device, dtype, generator):
    x = torch.rand(3, device=device, dtype=dtype, generator=generator, requires_grad=True)
    return (x,), {}


NOT_CALLABLE = 3


def takes_anything(*args, **kwargs):
    """For specs that show every argument kind; the loader never calls the op."""
    return args[0]


def scaled(x, /, scale=1.0, *, shift):
    """A signature with every kind of parameter a call can bind: positional-only, keyword-only."""
    return x * scale + shift


def with_options(x, **options):
    """Takes any keyword argument."""
    return x
