"""Localized gradient bugs at real sizes, each beside its correct twin.

Every mutant is an autograd.Function whose backward (or jvp, or double backward) is right except
on a small region: a tail tile, one row, one column, one attention head, one entry (the bugs of
tests/broken_ops.py, at real sizes). The twin is the same class built with the error factor 1.0,
so it differs from the mutant only in the bug.
`torch_fast_misses` records that torch.autograd.gradcheck(fast_mode=True) passes the mutant (the
point of fast_mode="auto"); where it is None torch's fast mode happens to catch it and nothing is
claimed. Inputs come from private seeded generators.

Some classes define a correct jvp and a vmap rule, so the auto check gets J·U from forward AD and
checks backward against it (the VJP stage); the others have neither, so J·U comes from the VJP of
the VJP or from VJP rows and the finite-difference stage finds the bug.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tests.broken_ops import SIN, Elementwise, rescaled, scaled, tail, with_backward_function  # noqa: E402
from tests.broken_ops import conj_missing as _conj_missing  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    make_inputs: Callable[[], tuple]
    wrong: Callable[..., Any]
    right: Callable[..., Any]
    checker: str = "gradcheck"  # or "gradgradcheck"
    flags: dict = dataclasses.field(default_factory=dict)
    torch_fast_misses: bool | None = True


def _randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def _tail_scale(shape, n_wrong, factor):
    """Ones, but `factor` on the last `n_wrong` elements: for a hand-written Function's tail bug."""
    s = torch.ones(shape, dtype=torch.float64)
    s.view(-1)[-n_wrong:] = factor
    return s


# ------------------------------------------------------------------------------ elementwise
def _sin_tail(factor, jvp):
    return SIN.function("SinTail", jvp=jvp, vmap=jvp, bug=scaled(factor, at=tail(7))).apply


def _one_entry(factor):
    exp = Elementwise(torch.exp, torch.exp)
    return exp.function("ExpOneEntry", jvp=True, vmap=True, bug=scaled(factor, at=(50, 37))).apply


# ----------------------------------------------------------------------------------- matmul
def matmul_last_column(factor):
    class MatmulLastColumn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a @ b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g @ b.t(), rescaled(a.t() @ g, factor, at=(..., -1))

    return MatmulLastColumn.apply


# ---------------------------------------------------------------------------------- softmax
def softmax_one_row(factor, row=17):
    class SoftmaxRows(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return torch.softmax(x, dim=-1)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(output)
            ctx.y = output

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            gx = y * (g - (g * y).sum(-1, keepdim=True))
            return rescaled(gx, factor, at=(..., row, slice(None)))

        @staticmethod
        def jvp(ctx, t):
            y = ctx.y
            return y * (t - (t * y).sum(-1, keepdim=True))

    return SoftmaxRows.apply


# -------------------------------------------------------------------------------- attention
def attention_one_head(factor, head=1):
    """softmax(q kᵀ / sqrt(d)) v per head; the backward of one head is `factor` off."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
            ctx.save_for_backward(q, k, v, p)
            return p @ v

        @staticmethod
        def backward(ctx, g):
            q, k, v, p = ctx.saved_tensors
            s = 1 / math.sqrt(q.shape[-1])
            gv = p.transpose(-1, -2) @ g
            gp = g @ v.transpose(-1, -2)
            gs = p * (gp - (gp * p).sum(-1, keepdim=True)) * s
            gq, gk = gs @ k, gs.transpose(-1, -2) @ q
            return rescaled(gq, factor, at=head), gk, gv

    return Attention.apply


# ------------------------------------------------------------------------------------ conv2d
def conv_last_row(factor):
    class Conv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return F.conv2d(x, w, padding=1)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            gx = torch.nn.grad.conv2d_input(x.shape, w, g, padding=1)
            gw = torch.nn.grad.conv2d_weight(x, w.shape, g, padding=1)
            return rescaled(gx, factor, at=(..., -1, slice(None))), gw

    return Conv.apply


# ------------------------------------------------------------------------------ forward AD
def jvp_tail(factor):
    """Correct backward; the jvp is `factor` off on the last 7 elements."""
    return SIN.function("SinJvpTail", jvp=True, jvp_bug=scaled(factor, at=tail(7))).apply


# --------------------------------------------------------------------------- double backward
def double_backward_tail(factor):
    """sin whose backward is itself a Function; that Function's backward (wrt grad) is wrong on the tail."""
    return with_backward_function(SIN, "SinTail", grad_bug=scaled(factor, at=tail(7)), old_style=True).apply


# ----------------------------------------------------------------------------------- complex
def _crandn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.complex128).requires_grad_()


COMPLEX_SIN = Elementwise(torch.sin, lambda z: torch.cos(z).conj())


def complex_sin(*, conj_missing=False, factor=1.0, jvp_factor=1.0, with_jvp=False, n_wrong=7):
    """sin on complex tensors; backward is grad * conj(cos z), wrong on the last n_wrong elements.

    conj_missing: the tail uses cos z instead of its conjugate; factor / jvp_factor: the tail of
    backward / jvp is scaled.
    """
    wrong = tail(n_wrong)
    return COMPLEX_SIN.function(
        "ComplexSin",
        bug=_conj_missing(at=wrong) if conj_missing else scaled(factor, at=wrong),
        jvp=with_jvp,
        vmap=with_jvp,
        jvp_derivative=torch.cos,
        jvp_bug=scaled(jvp_factor, at=wrong),
    ).apply


def _pair(make, wrong_factor):
    return make(wrong_factor), make(1.0)


def _mutant(id, make_inputs, make, wrong_factor, **kw):
    wrong, right = _pair(make, wrong_factor)
    return Mutant(id, make_inputs, wrong, right, **kw)


MUTANTS = [
    _mutant("sin_64x64_tail7", lambda: (_randn(64, 64, seed=1),), lambda f: _sin_tail(f, True), 1.1),
    _mutant("sin_128x128_tail7_nojvp", lambda: (_randn(128, 128, seed=2),), lambda f: _sin_tail(f, False), 1.1),
    _mutant(
        "matmul_64_last_column", lambda: (_randn(64, 64, seed=3), _randn(64, 64, seed=4)), matmul_last_column, 1.05
    ),
    _mutant("softmax_64x128_one_row", lambda: (_randn(64, 128, seed=5),), softmax_one_row, 1.05),
    _mutant(
        "attention_2x32x16_head", lambda: tuple(_randn(2, 32, 16, seed=s) for s in (6, 7, 8)), attention_one_head, 1.02
    ),
    _mutant(
        "conv2d_2x4x16x16_last_row",
        lambda: (_randn(2, 4, 16, 16, seed=9), _randn(4, 4, 3, 3, seed=10)),
        conv_last_row,
        1.1,
    ),
    _mutant("exp_96x96_one_entry", lambda: (_randn(96, 96, seed=11),), _one_entry, 1.01),
    _mutant(
        "jvp_64x64_tail7",
        lambda: (_randn(64, 64, seed=12),),
        jvp_tail,
        1.1,
        flags=dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False),
        torch_fast_misses=None,
    ),  # torch's fast forward mode compares J·u entrywise and catches it
    Mutant(
        "csin_64x64_tail7_no_conj", lambda: (_crandn(64, 64, seed=14),), complex_sin(conj_missing=True), complex_sin()
    ),
    Mutant(
        "csin_64x64_tail7_1pct",
        lambda: (_crandn(64, 64, seed=15),),
        complex_sin(factor=1.01, with_jvp=True),
        complex_sin(with_jvp=True),
    ),
    Mutant(
        "csin_64x64_jvp_tail7_1pct",
        lambda: (_crandn(64, 64, seed=16),),
        complex_sin(jvp_factor=1.01, with_jvp=True),
        complex_sin(with_jvp=True),
        flags=dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False),
    ),
    _mutant(
        "double_backward_64x64_tail7",
        lambda: (_randn(64, 64, seed=13),),
        double_backward_tail,
        1.1,
        checker="gradgradcheck",
    ),
]
