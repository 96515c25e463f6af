"""Ops whose failing input is not at the position the engine numbers it."""

import torch


class _WrongWeightGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad * w, grad * x * 1.5  # the weight's gradient is 1.5 times too large


def scaled_product(x, mask, scale, w):
    """x * w with a null and a number between them: w is args[3], the engine's input 1."""
    assert mask is None
    return _WrongWeightGrad.apply(x, w) * scale


def keyword_weight(x, *, weight):
    return _WrongWeightGrad.apply(x, weight)


def scaled_product_reference(x, mask, scale, w):
    """scaled_product in plain torch ops: the right gradients, for the low-precision check."""
    return x * w * scale
