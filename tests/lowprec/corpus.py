"""Low-precision mutants: kernels written to be wrong the way low-precision kernels are, each with a
correct twin and a float64 reference.

Every kernel here is written as kernel authors write them: an autograd.Function whose forward and
backward load the low-precision inputs, compute in float32, and round once at the store. A mutant
differs from its twin in one place. `Mutant.dtypes` are the dtypes where the mutant is a bug (where
its change is not a no-op: rounding to bfloat16 inside a bfloat16 kernel changes nothing); the twin
runs at float32, float16 and bfloat16.

The samples go where such bugs show: a true class that dominates its row (p -> 1), rows whose length
is not a multiple of the block size, a mean that dwarfs the spread, logits past exp's range.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK = 128


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what is wrong, in a kernel author's words
    mutant: Callable
    twin: Callable
    reference: Callable  # float64 PyTorch composite
    inputs: Callable[[torch.dtype, torch.Generator], tuple]  # the sample at a low dtype
    dtypes: tuple[torch.dtype, ...]  # where the mutant is a bug


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32)


def _through(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).to(torch.float32)


# ------------------------------------------------------------------ cross-entropy (mean over rows)
def _cross_entropy(round_prob: bool):
    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target):
            x = _f32(logits)
            lse = torch.logsumexp(x, dim=-1)
            loss = (lse - x.gather(1, target[:, None])[:, 0]).mean()
            ctx.save_for_backward(logits, target)
            return loss.to(logits.dtype)

        @staticmethod
        def backward(ctx, g):
            logits, target = ctx.saved_tensors
            p = torch.softmax(_f32(logits), dim=-1)
            if round_prob:  # the probability is stored at the low dtype before 1 is subtracted
                p = _through(p, logits.dtype)
            p[torch.arange(p.shape[0]), target] -= 1
            return (p * _f32(g) / p.shape[0]).to(logits.dtype), None

    return CrossEntropy.apply


def _dominant_logits(dtype, gen, n=16, c=1000):
    x = torch.randn(n, c, generator=gen, dtype=torch.float64) * 2
    target = torch.randint(0, c, (n,), generator=gen)
    x[torch.arange(n), target] += 14.0  # p of the true class -> 1 - 1e-3
    return x.to(dtype).requires_grad_(), target


def _ce_reference(logits, target):
    return F.cross_entropy(logits, target)


# ------------------------------------------------------------------ RMSNorm
def _rms_norm(accumulate_low: bool = False, eps_in_denominator: bool = True):
    eps = 1e-6

    def mean_sq(x32, dtype):
        if not accumulate_low:
            return (x32 * x32).mean(-1, keepdim=True)
        acc = torch.zeros(x32.shape[:-1], dtype=dtype)
        for j in range(x32.shape[-1]):  # one running sum per row, stored at the low dtype
            acc = (acc.to(torch.float32) + x32[..., j] * x32[..., j]).to(dtype)
        return acc.to(torch.float32)[..., None] / x32.shape[-1]

    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            x32, w32 = _f32(x), _f32(w)
            ms = mean_sq(x32, x.dtype)
            rstd = torch.rsqrt(ms + eps) if eps_in_denominator else torch.rsqrt(ms)
            ctx.save_for_backward(x, w, rstd)
            return (x32 * rstd * w32).to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, w, rstd = ctx.saved_tensors
            x32, w32, g32 = _f32(x), _f32(w), _f32(g)
            xhat = x32 * rstd
            gw = g32 * w32
            dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
            dw = (g32 * xhat).sum(0)
            return dx.to(x.dtype), dw.to(w.dtype)

    return RMSNorm.apply


def _rms_inputs(dtype, gen, n=4, d=1000):
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) + 1.0
    w = 1 + 0.1 * torch.randn(d, generator=gen, dtype=torch.float64)
    return x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()


def _rms_small_inputs(dtype, gen, n=4, d=1000):
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * 3e-3
    w = 1 + 0.1 * torch.randn(d, generator=gen, dtype=torch.float64)
    return x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()


def _rms_reference(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


# ------------------------------------------------------------------ SwiGLU, blocked over columns
def _swiglu(tail_via_bfloat16: bool):
    def store(y32, dtype):
        if tail_via_bfloat16:  # the tail block's store goes through the wrong dtype
            tail = (y32.shape[-1] // BLOCK) * BLOCK
            y32 = torch.cat([y32[..., :tail], _through(y32[..., tail:], torch.bfloat16)], dim=-1)
        return y32.to(dtype)

    class SwiGLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            a32, b32 = _f32(a), _f32(b)
            ctx.save_for_backward(a, b)
            return store(F.silu(a32) * b32, a.dtype)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            a32, b32, g32 = _f32(a), _f32(b), _f32(g)
            s = torch.sigmoid(a32)
            da = g32 * b32 * s * (1 + a32 * (1 - s))
            db = g32 * a32 * s
            return store(da, a.dtype), store(db, b.dtype)

    return SwiGLU.apply


def _swiglu_inputs(dtype, gen, n=4, d=1000):
    a = torch.randn(n, d, generator=gen, dtype=torch.float64) * 2
    b = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()


def _swiglu_reference(a, b):
    return F.silu(a) * b


# ------------------------------------------------------------------ softmax
def _softmax(subtract_max: bool):
    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x32 = _f32(x)
            if subtract_max:
                x32 = x32 - x32.amax(-1, keepdim=True)
            e = torch.exp(x32)
            y = e / e.sum(-1, keepdim=True)
            ctx.save_for_backward(y)
            return y.to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            g32 = _f32(g)
            return (y * (g32 - (g32 * y).sum(-1, keepdim=True))).to(g.dtype)

    return Softmax.apply


def _large_logits(dtype, gen, n=8, d=200):
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * 4 + 60.0
    x[0, 0] = 95.0  # past float32 exp's range (88.7)
    return (x.to(dtype).requires_grad_(),)


def _softmax_reference(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


# ------------------------------------------------------------------ layer norm's variance
def _layer_norm(one_pass: bool):
    eps = 1e-5

    def var(x32):
        if one_pass:  # E[x^2] - E[x]^2: cancels when the mean dwarfs the spread
            return (x32 * x32).mean(-1, keepdim=True) - x32.mean(-1, keepdim=True) ** 2
        return ((x32 - x32.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True)

    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x32 = _f32(x)
            rstd = torch.rsqrt(var(x32).clamp_min(0) + eps)
            xhat = (x32 - x32.mean(-1, keepdim=True)) * rstd
            ctx.save_for_backward(xhat, rstd)
            return xhat.to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            xhat, rstd = ctx.saved_tensors
            g32 = _f32(g)
            dx = rstd * (g32 - g32.mean(-1, keepdim=True) - xhat * (g32 * xhat).mean(-1, keepdim=True))
            return dx.to(g.dtype)

    return LayerNorm.apply


def _offset_rows(dtype, gen, n=4, d=1000):
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) + 300.0
    return (x.to(dtype).requires_grad_(),)


def _layer_norm_reference(x, eps=1e-5):
    xc = x - x.mean(-1, keepdim=True)
    return xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "ce_rounded_probability",
        "cross-entropy backward stores p at the low dtype before subtracting 1 for the true class",
        _cross_entropy(round_prob=True),
        _cross_entropy(round_prob=False),
        _ce_reference,
        _dominant_logits,
        (torch.float16, torch.bfloat16),
    ),
    Mutant(
        "rms_norm_low_accumulator",
        "RMSNorm accumulates the sum of squares in the low dtype",
        _rms_norm(accumulate_low=True),
        _rms_norm(),
        _rms_reference,
        _rms_inputs,
        (torch.float16, torch.bfloat16),
    ),
    Mutant(
        "rms_norm_missing_eps",
        "RMSNorm leaves eps out of the denominator (a small term)",
        _rms_norm(eps_in_denominator=False),
        _rms_norm(),
        _rms_reference,
        _rms_small_inputs,
        LOW_DTYPES,
    ),
    Mutant(
        "swiglu_tail_block_cast",
        "SwiGLU stores its last, partial column block through bfloat16",
        _swiglu(tail_via_bfloat16=True),
        _swiglu(tail_via_bfloat16=False),
        _swiglu_reference,
        _swiglu_inputs,
        (torch.float32, torch.float16),
    ),
    Mutant(
        "softmax_no_max_subtraction",
        "softmax exponentiates the logits without subtracting the row's max",
        _softmax(subtract_max=False),
        _softmax(subtract_max=True),
        _softmax_reference,
        _large_logits,
        LOW_DTYPES,
    ),
    Mutant(
        "layer_norm_one_pass_variance",
        "layer norm's variance as E[x^2] - E[x]^2 (a reduction in a cancelling form)",
        _layer_norm(one_pass=True),
        _layer_norm(one_pass=False),
        _layer_norm_reference,
        _offset_rows,
        (torch.float32,),
    ),
)
