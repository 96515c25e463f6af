"""When a batched result may stand for the plain one: agreement up to reassociation."""

from __future__ import annotations

import torch

from opcheck.engine._util import identical


class Disagreement(Exception):
    """The batched result differs from the loop's on the probe column."""


def ulps_apart(got: torch.Tensor, want: torch.Tensor) -> float:
    """How far apart two results that `close` accepted are: max |got - want| in units of the last
    place of max |want| (0 where they are equal, as most batched kernels give)."""
    got, want = got.detach(), want.detach()
    if got.numel() == 0 or not (got.is_floating_point() or got.is_complex()) or identical(got, want):
        return 0.0
    diff = float(torch.sub(got, want).abs().nan_to_num(0.0, 0.0, 0.0).max())
    if diff == 0.0:
        return 0.0
    scale = float(want.abs().nan_to_num(0.0, 0.0, 0.0).max())
    eps = torch.finfo(got.real.dtype if got.is_complex() else got.dtype).eps
    return diff / (eps * scale) if scale > 0 else float("inf")


def close(got: torch.Tensor, want: torch.Tensor, extra_atol: float = 0.0) -> bool:
    """Agreement up to reassociation: what batched and plain kernels may differ by."""
    got, want = got.detach(), want.detach()
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.numel() == 0 or identical(got, want):  # bit for bit, as most batched kernels give
        return True
    if not (got.is_floating_point() or got.is_complex()):
        return False
    eps = torch.finfo(got.dtype).eps
    if (
        got.is_floating_point()
        and float(torch.sub(got, want).abs_().max()) <= 1e3 * eps * float(want.abs().max()) + extra_atol
    ):  # within the allowance below; NaN and inf never pass here
        return True
    scale = float(want.abs().nan_to_num(0.0, 0.0, 0.0).max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, rtol=1e3 * eps, atol=1e3 * eps * scale + extra_atol + 1e-300, equal_nan=True))


def combination_close(weights: torch.Tensor, rows: torch.Tensor, want: torch.Tensor, extra_atol: float = 0.0) -> bool:
    """A plain call along Σ_r w_r (direction r) against Σ_r w_r rows[r] of a batched one.

    The sum is computed here, so beyond close's allowance it may be off by the rounding of a
    length-b dot product, at most b * eps * Σ_r |w_r| |rows[r]| per entry (taken 4 times).
    """
    w = weights.to(rows.dtype)
    eps = torch.finfo(rows.dtype).eps
    rounding = 0.0
    if len(w) and rows.numel():  # no row, or rows of no element (an empty output): nothing to round
        rounding = 4 * len(w) * eps * float(torch.tensordot(w.abs(), rows.detach().abs(), 1).max())
    return close(torch.tensordot(w, rows, 1), want, extra_atol=extra_atol + rounding)
