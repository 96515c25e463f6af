"""Triton mutants of the low-precision corpus, each with its correct twin: the same kernel with a
`BUG` constexpr off. They run on CPU under the Triton interpreter (examples.triton_kernels sets it
up); bfloat16 is left out, as the interpreter cannot compute in it.

- `triton_ce_rounded_probability`: cross-entropy backward stores p at the low dtype before
  subtracting 1 for the true class;
- `triton_layer_norm_one_pass_variance`: a layer norm forward computes the variance as
  E[x^2] - E[x]^2, which cancels when the mean dwarfs the spread;
- `triton_tail_block_cast`: a blocked SwiGLU forward stores its last, partial column block through
  float16 in a float32 kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import examples.triton_kernels as tk  # sets TRITON_INTERPRET=1 where torch sees no GPU
from examples.triton_kernels import tl, triton
from tests.lowprec.corpus import Mutant, _dominant_logits, _f32, _layer_norm_reference, _offset_rows, _swiglu_inputs

COLUMN_BLOCK = 128


@triton.jit
def _ce_bwd_kernel(LOGITS, TARGETS, DLOGITS, n_cols, n_rows, BUG: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(LOGITS + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    target = tl.load(TARGETS + row)
    e = tl.exp(x - tl.max(x, axis=0))
    p = e / tl.sum(e, axis=0)
    if BUG:
        p = p.to(DLOGITS.dtype.element_ty).to(tl.float32)
    grad = (p - tl.where(cols == target, 1.0, 0.0)) / n_rows
    tl.store(DLOGITS + row * n_cols + cols, grad.to(DLOGITS.dtype.element_ty), mask=mask)


def _cross_entropy(bug: bool):
    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target):
            ctx.save_for_backward(logits, target)
            return F.cross_entropy(_f32(logits), target).to(logits.dtype)

        @staticmethod
        def backward(ctx, g):
            logits, target = ctx.saved_tensors
            logits = logits.contiguous()
            n_rows, n_cols = logits.shape
            dlogits = torch.empty_like(logits)
            _ce_bwd_kernel[(n_rows,)](
                logits, target, dlogits, n_cols, n_rows, BUG=bug, BLOCK_SIZE=triton.next_power_of_2(n_cols)
            )
            return dlogits * g, None

    return CrossEntropy.apply


@triton.jit
def _layer_norm_fwd_kernel(X, Y, n_cols, eps, BUG: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    if BUG:  # E[x^2] - E[x]^2: cancels when the mean dwarfs the spread
        var = tl.sum(x * x, axis=0) / n_cols - mean * mean
    else:
        xc = tl.where(mask, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(tl.maximum(var, 0.0) + eps)
    tl.store(Y + row * n_cols + cols, ((x - mean) * rstd).to(Y.dtype.element_ty), mask=mask)


def _layer_norm(bug: bool):
    def layer_norm(x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _layer_norm_fwd_kernel[(x.shape[0],)](
            x.detach(), y, x.shape[1], 1e-5, BUG=bug, BLOCK_SIZE=triton.next_power_of_2(x.shape[1])
        )
        return y

    return layer_norm


@triton.jit
def _swiglu_fwd_kernel(A, B, OUT, n_cols, BUG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    a = tl.load(A + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    if BUG:
        if (block + 1) * BLOCK > n_cols:  # the partial tail block goes through float16
            y = y.to(tl.float16).to(tl.float32)
    tl.store(OUT + row * n_cols + cols, y.to(OUT.dtype.element_ty), mask=mask)


def _swiglu(bug: bool):
    def swiglu(a, b):
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        grid = (a.shape[0], triton.cdiv(a.shape[1], COLUMN_BLOCK))
        _swiglu_fwd_kernel[grid](a.detach(), b.detach(), out, a.shape[1], BUG=bug, BLOCK=COLUMN_BLOCK)
        return out

    return swiglu


def _swiglu_reference(a, b):
    return F.silu(a) * b


def _no_grad(make_inputs):
    """The sample without requires_grad: these forward-only kernels have no autograd formula."""

    def inputs(dtype, gen):
        return tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in make_inputs(dtype, gen))

    return inputs


TRITON_DTYPES = (torch.float32, torch.float16)
"""The dtypes the interpreter computes (it has no bfloat16 arithmetic)."""

TRITON_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "triton_ce_rounded_probability",
        "a Triton cross-entropy backward stores p at the low dtype before subtracting 1",
        _cross_entropy(bug=True),
        _cross_entropy(bug=False),
        F.cross_entropy,
        _dominant_logits,
        (torch.float16,),
    ),
    Mutant(
        "triton_layer_norm_one_pass_variance",
        "a Triton layer norm computes the variance as E[x^2] - E[x]^2",
        _layer_norm(bug=True),
        _layer_norm(bug=False),
        _layer_norm_reference,
        _no_grad(_offset_rows),
        (torch.float32,),
    ),
    Mutant(
        "triton_tail_block_cast",
        "a blocked Triton SwiGLU stores its partial tail block through float16",
        _swiglu(bug=True),
        _swiglu(bug=False),
        _swiglu_reference,
        _no_grad(_swiglu_inputs),
        (torch.float32,),
    ),
)

__all__ = ["TRITON_DTYPES", "TRITON_MUTANTS", "tk"]
