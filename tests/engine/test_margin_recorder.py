"""The margin a passing check records: the worst |analytical - numerical| / (atol + rtol * |numerical|)
among its comparisons (opcheck.engine.margins), in every fast_mode, without changing a verdict."""

from __future__ import annotations

import pytest
import torch

import opcheck
from opcheck.engine.margins import recording_margins


def _scaled_by(off: float):
    """2 * x, whose backward is 2 * (1 + off): every gradient entry off by `off`, relative."""

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (2 * (1 + off))

    return Scaled.apply


def _second_input_off(off: float):
    """x * y, whose gradient of y is off by `off` (relative); the gradient of x is right."""

    class Product(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, g * x * (1 + off)

    return Product.apply


def _x(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) + 1).requires_grad_()


MODES = [
    pytest.param(False, 6, id="full"),
    pytest.param(True, 6, id="fast"),
    pytest.param("auto", 6, id="auto-full"),  # within 128 elements: the full check, fused
    pytest.param("auto", 300, id="auto-projections"),  # beyond: J·U against finite differences
]


@pytest.mark.parametrize("off", [1e-4, 5e-4, 9e-4])
@pytest.mark.parametrize(("fast_mode", "n"), MODES)
def test_a_backward_off_by_a_known_relative_amount_records_that_fraction_of_rtol(fast_mode, n, off):
    # atol 0: every allowance is rtol * |numerical|, so each compared quantity (an entry, a J·u
    # entry, vᵀJu) is off by `off` of itself and its ratio is off / rtol, in every mode; the
    # Jacobian's zero entries (allowance 0, difference 0) count 0.
    with recording_margins() as margins:
        assert opcheck.gradcheck(_scaled_by(off), (_x(n),), atol=0.0, rtol=1e-3, fast_mode=fast_mode)
    assert margins.worst is not None
    assert margins.worst.ratio == pytest.approx(off / 1e-3, rel=1e-4)
    assert margins.worst.where.startswith("VJP: d output 0 / d input 0")


def test_the_ratio_uses_atol_and_rtol_as_the_comparison_does():
    off, atol, rtol = 1e-4, 1e-5, 1e-3
    with recording_margins() as margins:
        assert opcheck.gradcheck(_scaled_by(off), (_x(1),), atol=atol, rtol=rtol)
    assert margins.worst.ratio == pytest.approx(2 * off / (atol + rtol * 2), rel=1e-4)


def test_the_worst_block_is_named():
    with recording_margins() as margins:
        assert opcheck.gradcheck(_second_input_off(5e-4), (_x(4, 1), _x(4, 2)), atol=0.0)
    assert margins.worst.where == "VJP: d output 0 / d input 1"
    assert margins.worst.ratio == pytest.approx(0.5, rel=1e-4)
    assert margins.comparisons >= 2  # both inputs' blocks were compared


def test_forward_ad_and_second_order_checks_name_their_path():
    x = _x(5)
    with recording_margins() as forward:
        assert opcheck.gradcheck(torch.sin, (x,), check_forward_ad=True, check_backward_ad=False, fast_mode=False)
    with recording_margins() as second:
        assert opcheck.gradgradcheck(torch.sin, (x,), fast_mode=False)
    assert forward.worst.where == "JVP: d output 0 / d input 0"
    assert second.worst.where.startswith("VJP of VJP: ")
    assert 0 < forward.worst.ratio < 1e-3 and 0 < second.worst.ratio < 1e-3  # finite differences' error only


def test_a_failing_check_keeps_its_verdict_and_notes_no_pass():
    with recording_margins() as margins, pytest.raises(opcheck.GradcheckError, match="Jacobian mismatch"):
        opcheck.gradcheck(_scaled_by(2e-3), (_x(1),), atol=0.0, rtol=1e-3)
    assert margins.worst is None  # its one comparison failed


def test_without_a_recorder_nothing_is_recorded_and_verdicts_stand():
    assert opcheck.gradcheck(_scaled_by(5e-4), (_x(3),), atol=0.0)
    with recording_margins() as outer:
        with recording_margins() as inner:
            assert opcheck.gradcheck(_scaled_by(5e-4), (_x(3),), atol=0.0)
        assert opcheck.gradcheck(_scaled_by(1e-4), (_x(3),), atol=0.0)
    assert inner.worst.ratio == pytest.approx(0.5, rel=1e-4)
    assert outer.worst.ratio == pytest.approx(0.1, rel=1e-4)  # nested blocks record their own


def test_torch_allclose_decides_the_ratio_where_the_banded_comparison_cannot():
    from opcheck.engine._util import allclose_promoted

    inf = float("inf")
    a, b = torch.tensor([[1.0005, inf, 0.0]], dtype=torch.float64), torch.tensor([[1.0, inf, 0.0]])
    with recording_margins() as equal_infinities:  # inf == inf passes torch.allclose; it counts 0
        assert allclose_promoted(a, b, 1e-3, 0.0, where=lambda: "x")
    with recording_margins() as three_dims:  # no bands: torch.allclose, then the ratio of the whole
        assert allclose_promoted(torch.full((2, 2, 2), 1.0005), torch.ones(2, 2, 2), 1e-3, 0.0, where=lambda: "y")
    assert equal_infinities.worst.ratio == pytest.approx(0.5, rel=1e-3)
    assert three_dims.worst.ratio == pytest.approx(0.5, rel=1e-3)
