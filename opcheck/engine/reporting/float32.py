"""Whether an op given float64 inputs computes in float32: then a float64 gradient check cannot
judge it, and its failure is no kink.

A kernel that casts to float32 inside (a Triton kernel, `x.float()`) returns float64 tensors that
hold float32 values, or values that do not change when its inputs are rounded to float32. Its
finite differences then carry float32 rounding divided by eps (about 1e-7 / 1e-6 of the output),
errors of several percent that also change with eps, which reads as a kink. Both tests are
decisive on random float64 inputs: a value computed in float64 is a float32 value with
probability about 2**-29, so a few distinct values that all are settle it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

DISTINCT_VALUES = 4
"""Distinct informative values needed before a tensor counts as float32 values. Integers and
short binary fractions (0.5, 0.375: float16 values) are float32 values in any precision, and say
nothing."""


def float32_values(x: Tensor) -> bool:
    """Whether float64 (or complex128) `x` holds float32 values only, with at least DISTINCT_VALUES
    distinct informative ones (finite, neither integers nor float16 values)."""
    values = _informative(x)
    return values is not None and bool(torch.equal(values.to(torch.float32).to(torch.float64), values))


def float32_evidence(fn: Callable[..., object], inputs: Sequence[Tensor]) -> str | None:
    """Why `fn` seems to compute in float32 at these float64 inputs, or None.

    Calls fn on copies of `inputs` (under no_grad), and, unless its outputs already are float32
    values, once more with every float64 input rounded to float32.
    """
    wide = [t for t in inputs if _float64(t)]
    if not wide or all(float32_values(t) or _informative(t) is None for t in wide):
        return None  # inputs that are float32 values (explicit, integer) would prove nothing
    try:
        with torch.no_grad():
            outputs = _float64_outputs(fn(*(t.detach().clone() for t in inputs)))
            if not outputs or not any(_informative(o) is not None for o in outputs):
                return None
            if all(float32_values(o) for o in outputs if _informative(o) is not None):
                return "its float64 outputs are float32 values"
            rounded = [t.detach().to(torch.float32).to(t.dtype) if _float64(t) else t.detach().clone() for t in inputs]
            again = _float64_outputs(fn(*rounded))
    except Exception:  # a second call that fails says nothing about precision
        return None
    if len(again) == len(outputs) and all(_same(a, b) for a, b in zip(outputs, again)):
        return "its float64 outputs do not change when its inputs are rounded to float32"
    return None


def _float64(t: object) -> bool:
    return isinstance(t, Tensor) and t.layout == torch.strided and t.dtype in (torch.float64, torch.complex128)


def _informative(x: Tensor) -> Tensor | None:
    """x's informative entries (finite, neither integers nor float16 values) as a flat float64 tensor,
    or None when x is not float64 or has fewer than DISTINCT_VALUES distinct ones."""
    if not _float64(x):
        return None
    flat = (torch.view_as_real(x) if x.is_complex() else x).detach().reshape(-1)
    short = flat.to(torch.float16).to(flat.dtype) == flat
    values = flat[flat.isfinite() & (flat != flat.round()) & ~short]
    if values.numel() < DISTINCT_VALUES or torch.unique(values).numel() < DISTINCT_VALUES:
        return None
    return values


def _float64_outputs(out: object) -> list[Tensor]:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in outs if _float64(o)]


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b) or torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
