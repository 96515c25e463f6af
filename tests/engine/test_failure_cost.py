"""A failing auto check costs about what a passing one does: a LayerNorm kernel whose weight gradient
sums only the first block of rows, or whose last row skips a term, fails in a small multiple of its
correct twin's calls of the op (counted, never timed; the batching decisions pinned by a clock that
never finds batching slower), beyond the Jacobian budget and within it, where the verdict stays the
full check's: the entries a failure names are ones the full check fails."""

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


def layer_norm(summed_rows: int | None, tail_uncentred: bool = False):
    """x̂·w over the last dim, as a kernel: a forward and a backward of its own, no vmap rule, no
    forward AD. summed_rows: the weight gradient sums only that many rows (one row block), else all;
    tail_uncentred: the last row's input gradient leaves out the mean and x̂ terms (a tail tile)."""

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
            if tail_uncentred:
                dx = torch.cat([dx[:-1], (rstd * gxhat)[-1:]])
            dw = (g * xhat)[:summed_rows].sum(0)
            return dx, dw

    return LayerNorm.apply


def _inputs(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(cols, dtype=torch.float64, generator=g).requires_grad_()
    return x, w


def _calls(fn, inputs, **kwargs) -> tuple[int, str]:
    calls, error = _run(fn, inputs, **kwargs)
    return calls, "passed" if error is None else str(error).splitlines()[0]


def _run(fn, inputs, **kwargs) -> tuple[int, GradcheckError | None]:
    """The op's calls (forward, backward, jvp) in one auto check, and its error if it failed."""
    CALLS.clear()
    error = None
    try:
        with batching_clock(_Ticks()):
            opcheck.gradcheck(fn, inputs, fast_mode="auto", **kwargs)
    except GradcheckError as e:
        error = e
    return sum(CALLS.values()), error


def _full_check_error(fn, inputs, **kwargs) -> GradcheckError:
    with pytest.raises(GradcheckError) as info:
        opcheck.gradcheck(fn, inputs, fast_mode=False, **kwargs)
    return info.value


def _assert_full_check_fails_the_entries(auto_error: GradcheckError, full: GradcheckError) -> None:
    """auto's first line is the full check's, and each entry auto names is one the full check's own
    block has out of tolerance, with the same analytical and numerical values."""
    assert str(auto_error).splitlines()[0] == str(full).splitlines()[0]
    pinned, block = auto_error.mismatch.pinned, full.mismatch
    assert pinned, str(auto_error)
    for entry in pinned:
        i = _flat(entry.input_index, block.input_shape)
        o = _flat(entry.output_index, block.output_shape)
        a, n = block.analytical[i, o].item(), block.numerical[i, o].item()
        assert abs(a - n) > block.atol + block.rtol * abs(n), entry
        assert entry.analytical == pytest.approx(a, rel=1e-9, abs=1e-12), entry
        assert entry.numerical == pytest.approx(n, rel=1e-9, abs=1e-12), entry


def _flat(index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    flat = 0
    for k, size in zip(index, shape):
        flat = flat * size + k
    return flat


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


@pytest.mark.parametrize("shape", [(16, 32), (24, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(
    "bug", [{"summed_rows": BLOCK}, {"tail_uncentred": True}], ids=["weight-grad-one-block", "tail-row"]
)
def test_a_failure_within_the_budget_costs_about_what_a_pass_does_and_is_the_full_checks(shape, bug):
    # Within the budget, auto fails exactly where the full check fails; the projections' failure
    # is narrowed to entries the full check fails, where running the full check took ~25x a pass.
    inputs = _inputs(*shape)
    passing, verdict = _calls(layer_norm(None), inputs)
    assert verdict == "passed"
    kernel = layer_norm(bug.get("summed_rows"), bug.get("tail_uncentred", False))
    failing, error = _run(kernel, inputs)
    assert error is not None
    assert failing <= FAILURE_COST * passing, (failing, passing)
    assert "the full check fails it" in str(error)
    _assert_full_check_fails_the_entries(error, _full_check_error(kernel, inputs))


def scaled(spread: float, *, forward_ad: bool = False, jvp_tail: bool = False):
    """x * 1e-3, elementwise, as a kernel without a vmap rule. spread: backward adds spread * sum(g)
    to every entry, so each wrong entry of J is off by `spread` alone (within atol=1e-5 below it,
    out beyond it) while a direction's J·u sums ~sqrt(n) of them. With forward_ad, a right jvp
    (jvp_tail: the last element's tangent doubled)."""

    def jvp(ctx, t):
        CALLS["jvp"] += 1
        out = t * 1e-3
        return torch.cat([out[:-1], 2 * out[-1:]]) if jvp_tail else out

    def backward(ctx, g):
        CALLS["backward"] += 1
        return g * 1e-3 + spread * g.sum()

    def forward(x):
        CALLS["forward"] += 1
        return x * 1e-3

    body = {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(lambda ctx, inputs, output: None),
        "backward": staticmethod(backward),
    }
    if forward_ad:
        body["jvp"] = staticmethod(jvp)
    return type("Scaled", (torch.autograd.Function,), body).apply


def _vector() -> tuple[torch.Tensor]:
    return (torch.randn(300, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_(),)


@pytest.mark.parametrize("forward_ad", [False, True], ids=["J·U from backward", "J·U from forward AD"])
def test_an_error_below_every_entrys_tolerance_passes_as_the_full_check_does(forward_ad):
    # The projections fail (J·u sums the entries' errors), no entry is out of tolerance on its own:
    # the full check decides, and passes, as torch's slow mode does.
    x = _vector()
    assert torch.autograd.gradcheck(scaled(6e-6, forward_ad=forward_ad), x)
    calls, error = _run(scaled(6e-6, forward_ad=forward_ad), x)
    assert error is None, str(error)
    passing, _ = _run(scaled(0, forward_ad=forward_ad), x)
    assert calls > 10 * passing  # the full check ran


@pytest.mark.parametrize("forward_ad", [False, True], ids=["J·U from backward", "J·U from forward AD"])
def test_an_entry_out_of_tolerance_fails_at_about_a_pass_cost(forward_ad):
    # With forward AD the projections' JVP stage passes and backward fails the VJP stage: the output
    # element comes from halving the cotangent, then the input element as without it.
    x = _vector()
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        torch.autograd.gradcheck(scaled(3e-5, forward_ad=forward_ad), x)
    passing, _ = _run(scaled(0, forward_ad=forward_ad), x)
    failing, error = _run(scaled(3e-5, forward_ad=forward_ad), x)
    assert error is not None
    assert failing <= FAILURE_COST * passing, (failing, passing)
    _assert_full_check_fails_the_entries(error, _full_check_error(scaled(3e-5, forward_ad=forward_ad), x))


def test_a_wrong_forward_ad_fails_at_about_a_pass_cost():
    x = _vector()
    kwargs = {"check_forward_ad": True, "check_backward_ad": False}
    passing, _ = _run(scaled(0, forward_ad=True), x, **kwargs)
    failing, error = _run(scaled(0, forward_ad=True, jvp_tail=True), x, **kwargs)
    assert error is not None
    assert failing <= FAILURE_COST * passing, (failing, passing)
    full = _full_check_error(scaled(0, forward_ad=True, jvp_tail=True), x, **kwargs)
    assert str(full).startswith("Jacobian computed with forward mode mismatch for output 0 with respect to input 0")
    _assert_full_check_fails_the_entries(error, full)
