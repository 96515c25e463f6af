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
