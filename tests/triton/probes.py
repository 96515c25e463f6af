"""Small kernels that show one interpreter gap each: a float32 -> bfloat16 cast, a tl.sum of
bfloat16 values and a tl.cumprod of them. Kernels are defined in a file: the interpreter reads a kernel's source."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _cast_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=mask).to(tl.bfloat16), mask=mask)


def to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """float32 `x` cast to bfloat16 inside a kernel."""
    y = torch.empty_like(x, dtype=torch.bfloat16)
    _cast_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y


@triton.jit
def _sum_kernel(X, OUT, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(OUT, tl.sum(x, axis=0))
    tl.store(OUT + 1, tl.max(x, axis=0))


def sum_and_max(x: torch.Tensor) -> torch.Tensor:
    """[sum, max] of a 1-d bfloat16 `x`, reduced by a kernel straight on the bfloat16 loads."""
    out = torch.empty(2, dtype=x.dtype)
    _sum_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return out


@triton.jit
def _cumprod_kernel(X, OUT, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=1.0)
    tl.store(OUT + offs, tl.cumprod(x, axis=0), mask=offs < n)


def cumprod(x: torch.Tensor) -> torch.Tensor:
    """The cumulative product of a 1-d `x`, scanned by a kernel straight on the loads."""
    out = torch.empty_like(x)
    _cumprod_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return out
