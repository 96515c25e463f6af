"""Rotary embeddings whose derivatives write into what autograd hands them, as public rope kernels
do: the backward rotates its grad_output in place and returns it, or the forward-AD rule rotates
its tangent in place. Both derivatives are right; only the write is wrong. Also a reference that
computes in float32 inside, and its float64 twin."""

from __future__ import annotations

import torch


def _angles(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency for x of shape (..., seq, 2 * half), in x's dtype."""
    seq, half = x.shape[-2], x.shape[-1] // 2
    freq = 1.0 / (100.0 ** (torch.arange(half, dtype=torch.float64) / half))
    theta = torch.arange(seq, dtype=torch.float64)[:, None] * freq[None, :]
    theta = torch.cat((theta, theta), -1).to(device=x.device, dtype=x.dtype)
    return theta.cos(), theta.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _rotate_half_transposed(g: torch.Tensor) -> torch.Tensor:
    g1, g2 = g.chunk(2, -1)
    return torch.cat((g2, -g1), -1)


def rope_reference(x: torch.Tensor) -> torch.Tensor:
    cos, sin = _angles(x)
    return x * cos + _rotate_half(x) * sin


def rope_reference_in_float32(x: torch.Tensor) -> torch.Tensor:
    """The same math computed in float32 whatever x's dtype, as kernel libraries' references often are."""
    return rope_reference(x.float()).to(x.dtype)


def _rope_backward(g: torch.Tensor) -> torch.Tensor:
    cos, sin = _angles(g)
    return g * cos + _rotate_half_transposed(g * sin)


class _RopeWritingGradOutput(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return rope_reference(x)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        pass

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[no-untyped-def]
        return grad_out.copy_(_rope_backward(grad_out))  # the result goes where the gradient came in

    @staticmethod
    def jvp(ctx, tangent):  # type: ignore[no-untyped-def]
        return rope_reference(tangent)


class _RopeWritingTangent(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return rope_reference(x)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        pass

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[no-untyped-def]
        return _rope_backward(grad_out)

    @staticmethod
    def jvp(ctx, tangent):  # type: ignore[no-untyped-def]
        return tangent.copy_(rope_reference(tangent))  # the tangent out is the tangent in


def rope_writing_grad_output(x: torch.Tensor) -> torch.Tensor:
    return _RopeWritingGradOutput.apply(x)


def rope_writing_tangent(x: torch.Tensor) -> torch.Tensor:
    return _RopeWritingTangent.apply(x)
