"""A backward that returns its inputs' gradients in each other's place is named in every mode.

The full check compares the block with every input's numerical block; fast mode recomputes every
input's block when it localizes a failure; fast_mode="auto" beyond the full check sees the swap in
its projections (input j's analytical projections against input k's finite differences along input
j's directions), and where the failing block fits the budget names it from the recomputed blocks.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

import opcheck
from opcheck.engine.auto import projection_check as auto
from opcheck.engine.errors import GradcheckError
from opcheck.engine.reporting.pattern_hints import swapped_in_projections

SWAPPED = "the gradient for input 0 matches input 1's numerical gradient: are the returned gradients swapped?"


def _function(name: str, backward, *, jvp=None) -> type[torch.autograd.Function]:
    """f(x, y) = 2x + y², vmappable, with the given backward (and forward AD where jvp is given)."""

    def forward(x, y):
        return x * 2 + y * y

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    body = {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
        "generate_vmap_rule": True,
    }
    if jvp is not None:
        body["jvp"] = staticmethod(jvp)
    return type(name, (torch.autograd.Function,), body)


def _right_backward(ctx, grad):
    x, y = ctx.saved_tensors
    return grad * 2 * torch.ones_like(x), grad * 2 * y


def _swapped_backward(ctx, grad):
    """(grad_y, grad_x): the right gradients, each returned in the other's place."""
    return _right_backward(ctx, grad)[::-1]


def _half_x_backward(ctx, grad):
    """x's gradient half what it should be: wrong, but not another input's."""
    gx, gy = _right_backward(ctx, grad)
    return gx * 0.5, gy


def _jvp(ctx, tx, ty):
    _, y = ctx.saved_tensors
    return tx * 2 + 2 * y * ty


Right = _function("Right", _right_backward)
Swapped = _function("Swapped", _swapped_backward)
HalfX = _function("HalfX", _half_x_backward)
RightWithJvp = _function("RightWithJvp", _right_backward, jvp=_jvp)
SwappedWithJvp = _function("SwappedWithJvp", _swapped_backward, jvp=_jvp)  # forward AD right: the VJP stage fails


class SwappedBroadcast(torch.autograd.Function):
    """2x + y² with y (columns,) broadcast over x's rows; backward gives each input the other's
    formula, reduced or expanded to its shape: wrong, and the inputs' shapes differ."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * 2 + y * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * 2 * y, (grad * 2).sum(0)


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.rand(s, generator=g, dtype=torch.float64).add(0.5).requires_grad_() for s in shapes)


def _pair(shape, seed=0):
    return _inputs(shape, shape, seed=seed)


def _fail(func, inputs, **kwargs) -> GradcheckError:
    with pytest.raises(GradcheckError) as info:
        opcheck.gradcheck(func, inputs, **kwargs)
    return info.value


def _hints(err: GradcheckError) -> tuple[str, ...]:
    assert err.mismatch is not None
    return err.mismatch.hints


# Where each case runs: fast_mode with, for "auto", the Jacobian budget that picks the path.
MODES = [
    pytest.param(False, (3, 4), None, id="full"),
    pytest.param(True, (3, 4), None, id="fast"),
    pytest.param(True, (12, 12), None, id="fast-larger"),
    pytest.param("auto", (3, 4), None, id="auto-full"),
    pytest.param("auto", (12, 12), None, id="auto-projections-then-full"),
    pytest.param("auto", (8, 8), 4096, id="auto-block-recomputed"),
    pytest.param("auto", (8, 8), 1000, id="auto-projections-only"),
    pytest.param("auto", (40, 40), None, id="auto-projections-default-budget"),
]


def _kwargs(fast_mode, budget):
    return {"fast_mode": fast_mode} | ({} if budget is None else {"jacobian_budget": budget})


@pytest.mark.parametrize(("fast_mode", "shape", "budget"), MODES)
def test_swapped_gradients_are_named(fast_mode, shape, budget):
    inputs = _pair(shape)
    kwargs = _kwargs(fast_mode, budget)
    assert opcheck.gradcheck(Right.apply, inputs, **kwargs)
    err = _fail(Swapped.apply, inputs, **kwargs)
    assert _hints(err) == (SWAPPED,)  # a swap explains the whole block: the only hint, as in full mode
    assert f"hint: {SWAPPED}" in str(err)


@pytest.mark.parametrize(("fast_mode", "shape", "budget"), MODES)
def test_swapped_gradients_are_named_where_forward_ad_is_right(fast_mode, shape, budget):
    """With a right jvp, auto's J·U comes from forward AD and the VJP stage sees the swap."""
    inputs = _pair(shape)
    kwargs = _kwargs(fast_mode, budget)
    assert opcheck.gradcheck(RightWithJvp.apply, inputs, check_forward_ad=True, **kwargs)
    report = opcheck.gradcheck_report(SwappedWithJvp.apply, inputs, check_forward_ad=True, **kwargs)
    assert not report.passed and report.mismatch is not None
    assert report.mismatch.hints == (SWAPPED,)
    if fast_mode == "auto" and budget is not None:
        assert any("forward AD" in p for p in report.stats.auto_paths)


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("shape", [(3, 4), (12, 12)])
def test_the_first_line_stays_torchs(fast_mode, shape):
    inputs = _pair(shape)
    err = _fail(Swapped.apply, inputs, fast_mode=fast_mode)
    with pytest.raises(TorchGradcheckError) as info:
        torch.autograd.gradcheck(Swapped.apply, inputs, fast_mode=fast_mode)
    assert str(err).splitlines()[0] == str(info.value).splitlines()[0]
    assert str(err).index(SWAPPED) > len(str(err).splitlines()[0])


@pytest.mark.parametrize(("fast_mode", "shape", "budget"), MODES)
def test_a_wrong_gradient_of_the_same_shape_is_not_called_swapped(fast_mode, shape, budget):
    err = _fail(HalfX.apply, _pair(shape), **_kwargs(fast_mode, budget))
    assert not [h for h in _hints(err) if "swapped" in h]


@pytest.mark.parametrize(("fast_mode", "shape", "budget"), MODES)
def test_inputs_of_different_shapes_are_never_called_swapped(fast_mode, shape, budget):
    rows, cols = shape
    inputs = _inputs((rows, cols), (cols,))
    err = _fail(SwappedBroadcast.apply, inputs, **_kwargs(fast_mode, budget))
    assert not [h for h in _hints(err) if "swapped" in h]


def test_a_passing_call_never_looks_for_a_swap(monkeypatch):
    """The test runs on failures only: passing calls cost what they cost before."""

    def refuse(self, found):
        raise AssertionError("looked for a swap on a passing call")

    monkeypatch.setattr(auto._ProjectionCheck, "_swapped_with", refuse)
    for budget in (None, 1000):
        assert opcheck.gradcheck(Right.apply, _pair((40, 40)), **_kwargs("auto", budget))
        assert opcheck.gradcheck(RightWithJvp.apply, _pair((40, 40)), **_kwargs("auto", budget))
    # and a failing call does look (the patch above is what refuses)
    with pytest.raises(AssertionError, match="looked for a swap"):
        opcheck.gradcheck(Swapped.apply, _pair((40, 40)), fast_mode="auto")


def test_projections_that_match_both_inputs_say_nothing():
    """Where two inputs have the same Jacobian (x + y), a slightly wrong gradient of one matches
    the other's projections as well as its own: no swap is claimed."""
    g = torch.Generator().manual_seed(1)
    u = torch.randint(0, 2, (8, 16), generator=g, dtype=torch.float64) * 2 - 1
    right = u.clone()  # J·U of x + y along either input's directions
    allowed = 1e-5 + 1e-3 * right.abs()
    slightly_off = right * (1 + 1e-6)
    assert swapped_in_projections(slightly_off, 0, right, [None, (right, allowed)]) is None
    # the other input's projections matching, its own not: that input is named
    other = 3 * right
    assert swapped_in_projections(other, 0, right, [None, (other, 1e-5 + 1e-3 * other.abs())]) == 1
    # an input the output does not depend on matches nothing
    zero = torch.zeros_like(right)
    assert swapped_in_projections(zero, 0, right, [None, (zero, allowed)]) is None


def test_a_same_jacobian_pair_with_a_slightly_wrong_backward_is_not_called_swapped():
    """x + y with a right jvp and x's backward off by a factor 1 + 1e-6: only the VJP stage sees it,
    at the rounding bound, and y's finite differences match it as well as x's own J·U does."""

    def forward(x, y):
        return x + y

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, grad):
        return grad * (1 + 1e-6), grad.clone()

    def jvp(ctx, tx, ty):
        return tx + ty

    body = {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
        "jvp": staticmethod(jvp),
        "generate_vmap_rule": True,
    }
    SlightlyOff = type("SlightlyOff", (torch.autograd.Function,), body)
    report = opcheck.gradcheck_report(
        SlightlyOff.apply, _pair((40, 40)), fast_mode="auto", check_forward_ad=True, jacobian_budget=1000
    )
    assert not report.passed and report.mismatch is not None
    assert "VJP against JVP" in str(report.error)
    assert not [h for h in report.mismatch.hints if "swapped" in h]
