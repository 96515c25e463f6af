"""The comparison of large Jacobian blocks gives torch.allclose's answer, band by band."""

from __future__ import annotations

import math

import pytest
import torch

from opcheck.engine import _util


def _blocks(kind: str):
    g = torch.Generator().manual_seed(7)
    n = torch.randn(300, 257, generator=g, dtype=torch.float64)
    a = n.clone()
    if kind == "equal":
        pass
    elif kind == "within":
        a += 1e-4 * n.abs() * torch.rand(n.shape, generator=g, dtype=torch.float64)
    elif kind == "one entry":
        a[299, 256] += 1e-3
    elif kind == "inf in expected":
        n[10, 3], a[10, 3] = math.inf, 1.0
    elif kind == "inf both":
        n[10, 3] = a[10, 3] = math.inf
    elif kind == "nan":
        a[150, 100] = math.nan
    elif kind == "transposed view":
        a = n.t().contiguous().t().clone()
        a = a.t().contiguous().t()  # same values, column-major storage, as analytical VJP blocks are
        a[0, 0] += 1.0
    elif kind == "complex":
        n = torch.complex(n, n.flip(0))
        a = n.clone()
        a[5, 5] += 1e-2j
    return a, n


@pytest.mark.parametrize(
    "kind", ["equal", "within", "one entry", "inf in expected", "inf both", "nan", "transposed view", "complex"]
)
@pytest.mark.parametrize("chunk", [1 << 16, 64])
def test_banded_comparison_agrees_with_allclose(kind, chunk, monkeypatch):
    monkeypatch.setattr(_util, "_COMPARE_CHUNK", chunk)
    a, n = _blocks(kind)
    assert _util.allclose_promoted(a, n, 1e-3, 1e-5) == bool(torch.allclose(a, n, 1e-3, 1e-5))
