"""fast_mode="auto"'s finite differences by groups of columns (opcheck/engine/auto/grouped.py): a
function whose forward cannot be vmapped, checked for backward alone, perturbs at once the columns
that share no row of backward's Jacobian. It must pass what torch's slow mode passes, and fail,
in that pass already, a backward that moves a gradient entry to another column."""

from __future__ import annotations

import pytest
import torch

import opcheck
from opcheck.engine.auto.grouped import column_groups
from opcheck.engine.route import GROUP_WEIGHTINGS
from opcheck.runtime.cost.estimate import Calls
from opcheck.runtime.cost.probe import Probe
from opcheck.runtime.cost.standin import dry_run


def test_columns_sharing_no_row_fall_in_one_group():
    eye = torch.eye(6, dtype=torch.bool)
    assert column_groups(eye) == [list(range(6))]
    tridiagonal = eye | eye.roll(1, 0) | eye.roll(-1, 0)
    tridiagonal[0, -1] = tridiagonal[-1, 0] = False
    assert column_groups(tridiagonal) == [[0, 3], [1, 4], [2, 5]]
    dense = torch.ones(3, 4, dtype=torch.bool)
    assert column_groups(dense) == [[0], [1], [2], [3]]
    assert column_groups(dense, most=3) is None  # beyond `most` groups it stops counting
    empty_column = torch.tensor([[True, False, False], [False, False, True]])
    assert column_groups(empty_column) == [[0, 1, 2]]
    assert column_groups(torch.zeros(0, 0, dtype=torch.bool)) == []
    tall = torch.eye(100, dtype=torch.bool)  # rows beyond one machine word
    assert column_groups(tall) == [list(range(100))]
    tall[99, 0] = True  # column 0 now shares row 99 with column 99
    assert column_groups(tall) == [list(range(99)), [99]]


class _Square(torch.autograd.Function):
    """x² with no vmap rule (as a kernel without a batching rule) and a backward of torch ops, which
    batches; `moved` = (a, b) adds the gradient of element b to element a's and drops b's (a
    backward that writes into the wrong position). Counts its forward calls."""

    moved: tuple[int, int] | None = None
    calls = 0

    @staticmethod
    def forward(ctx, x):
        _Square.calls += 1
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        grad = 2 * x * g
        if _Square.moved is not None:
            a, b = _Square.moved
            grad = grad.clone()
            grad[..., a] = grad[..., a] + grad[..., b]
            grad[..., b] = 0
        return grad


def _report(x, moved=None):
    _Square.moved, _Square.calls = moved, 0
    try:
        return opcheck.gradcheck_report(_Square.apply, (x,), fast_mode="auto")
    finally:
        _Square.moved = None


def test_a_diagonal_jacobian_takes_a_call_pair_per_weighting():
    x = torch.linspace(-1.5, 1.5, 24, dtype=torch.float64).requires_grad_()
    r = _report(x)
    assert r.passed and r.stats.auto_paths == ["full (grouped finite differences)"], r.stats
    assert r.stats.fused and _Square.calls == 1 + 2 * GROUP_WEIGHTINGS  # the call, then the groups' pairs


@pytest.mark.parametrize("moved", [(3, 5), (0, 23), (23, 0), (10, 11), (16, 18)])
def test_a_gradient_moved_to_another_column_fails_the_grouped_pass(moved):
    # The moved entry's column has no nonzero left in backward's rows, so it joins the group of
    # the column that took its gradient: only the weights tell the two apart. The step-by-step
    # full check then decides, as torch's slow mode (the projections' random signs agree on
    # columns 16 and 18 in every direction, and would pass it).
    x = torch.linspace(-1.5, 1.5, 24, dtype=torch.float64).requires_grad_()
    r = _report(x, moved)
    assert not r.passed and r.stats.auto_paths == ["full"], r.stats
    assert any("disagrees with grouped finite differences" in f for f in r.stats.fallbacks), r.stats.fallbacks
    _Square.moved = moved
    try:  # torch's slow mode fails it too
        assert not torch.autograd.gradcheck(_Square.apply, (x,), raise_exception=False)
    finally:
        _Square.moved = None


class _RowSoftmax(torch.autograd.Function):
    """softmax over the last dimension with no vmap rule: a block-diagonal Jacobian, one block per
    row, whose columns fall in as many groups as a row has elements. `scale` scales the backward
    of the last row."""

    scale = 1.0

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        grad = y * (g - (g * y).sum(-1, keepdim=True))
        grad[-1] *= _RowSoftmax.scale
        return grad


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_a_row_wise_op_is_grouped_by_the_length_of_a_row_and_agrees_with_torch(scale):
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    _RowSoftmax.scale = scale
    try:
        r = opcheck.gradcheck_report(_RowSoftmax.apply, (x,), fast_mode="auto")
        expected = torch.autograd.gradcheck(_RowSoftmax.apply, (x,), raise_exception=False)
    finally:
        _RowSoftmax.scale = 1.0
    assert r.passed == expected == (scale == 1.0), r.message
    if expected:  # 3 groups: 3 * GROUP_WEIGHTINGS call pairs, fewer than the 18 columns'
        assert r.stats.auto_paths == ["full (grouped finite differences)"] and r.stats.calls == 6 * GROUP_WEIGHTINGS


class _Product(torch.autograd.Function):
    """x * y with no vmap rule; `scale` scales y's gradient. Counts its forward calls."""

    scale = 1.0
    calls = 0

    @staticmethod
    def forward(ctx, x, y):
        _Product.calls += 1
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x * _Product.scale


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_the_columns_of_every_input_share_the_groups(scale):
    # x's and y's columns of an elementwise product share no row within an input, and share rows
    # across inputs: two groups (x's, y's), each a call pair per weighting
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(12, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(2))
    _Product.scale, _Product.calls = scale, 0
    try:
        r = opcheck.gradcheck_report(_Product.apply, (x, y), fast_mode="auto")
        calls = _Product.calls
        expected = torch.autograd.gradcheck(_Product.apply, (x, y), raise_exception=False)
    finally:
        _Product.scale = 1.0
    assert r.passed == expected == (scale == 1.0), r.message
    if expected:
        assert r.stats.auto_paths == ["full (grouped finite differences)"]
        assert calls == 1 + 2 * 2 * GROUP_WEIGHTINGS
        # the cost estimate counts the same groups, from its probe's batched backward
        probe = Probe(_Product.apply, (x, y))
        plan = dry_run(probe, dict(fast_mode="auto")).plan(probe)
        assert Calls.of(plan).forward == calls, (plan.evals, plan.path)
    else:
        assert any("grouped finite differences" in f for f in r.stats.fallbacks), r.stats.fallbacks
