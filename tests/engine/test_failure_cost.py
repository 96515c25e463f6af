"""A failing auto check costs about what a passing one does: a LayerNorm kernel whose weight gradient
sums only the first block of rows fails in a small multiple of its correct twin's calls of the op
(counted, never timed; the batching decisions pinned by a clock that never finds batching slower)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import opcheck
from opcheck.engine.batching import batching_clock

FAILURE_COST = 2
"""A failing check's calls of the op (forward and backward) at most this many times its passing twin's."""
BLOCK = 4
CALLS: Counter[str] = Counter()


class _Ticks:
    """Every span the adaptive rule measures lasts one second: batching is never judged slower."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def layer_norm(summed_rows: int | None):
    """x̂·w over the last dim, as a kernel: a forward and a backward of its own, no vmap rule, no
    forward AD. summed_rows: the weight gradient sums only that many rows (one row block), else all."""

    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            CALLS["forward"] += 1
            mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
            rstd = 1 / torch.sqrt(var + 1e-5)
            xhat = (x - mean) * rstd
            ctx.save_for_backward(xhat, rstd, w)
            return xhat * w

        @staticmethod
        def backward(ctx, g):
            CALLS["backward"] += 1
            xhat, rstd, w = ctx.saved_tensors
            gxhat = g * w
            dx = rstd * (gxhat - gxhat.mean(-1, keepdim=True) - xhat * (gxhat * xhat).mean(-1, keepdim=True))
            dw = (g * xhat)[:summed_rows].sum(0)
            return dx, dw

    return LayerNorm.apply


def _inputs(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(cols, dtype=torch.float64, generator=g).requires_grad_()
    return x, w


def _calls(fn, inputs) -> tuple[int, str]:
    CALLS.clear()
    try:
        with batching_clock(_Ticks()):
            opcheck.gradcheck(fn, inputs, fast_mode="auto")
        first = "passed"
    except GradcheckError as e:
        first = str(e).splitlines()[0]
    return CALLS["forward"] + CALLS["backward"], first


def test_torch_fails_the_kernel_and_passes_its_twin():
    inputs = _inputs(2 * BLOCK, 6)
    assert torch.autograd.gradcheck(layer_norm(None), inputs)
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to input 1"):
        torch.autograd.gradcheck(layer_norm(BLOCK), inputs)


@pytest.mark.parametrize("shape", [(64, 64), (128, 128)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_failure_beyond_the_budget_costs_about_what_a_pass_does(shape):
    passing, verdict = _calls(layer_norm(None), _inputs(*shape))
    assert verdict == "passed"
    failing, first = _calls(layer_norm(BLOCK), _inputs(*shape))
    assert first.startswith("Jacobian mismatch for output 0 with respect to input 1"), first
    # the VJP of the VJP disagrees with finite differences; backward's own rows at the elements where
    # it does confirm the failure, where every row of J took a backward per output element
    assert failing <= FAILURE_COST * passing, (failing, passing)
