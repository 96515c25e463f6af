"""How close a passing check came to its bound: the worst error / allowed of its comparisons.

A pass says nothing about how close it came: an entry at 0.99 of its allowance passes as one at
0.01 does. A caller that wants to know opens `recording_margins()` around gradcheck/gradgradcheck
calls and reads the recorder's `worst` after; nothing is computed while none is open, and the
checks' arguments, verdicts and messages are the same either way.

What feeds it: every entrywise comparison of an analytical quantity against finite differences at
the call's own tolerance, |a - n| <= atol + rtol * |n|, that passed; its ratio is
max |a - n| / (atol + rtol * |n|), at most 1 (an entry with a zero allowance counts 0 where it
matches exactly). Those are
- the full check's Jacobian blocks (fast_mode=False, and fast_mode="auto"'s full check and its
  fused pass);
- torch's fast mode's projections vᵀJu (atol scaled by the projections, as torch scales it);
- fast_mode="auto"'s projections: J·U against finite differences, and backward's JᵀV against the
  finite differences' (the fused pass's JᵀV stage).
Not fed: comparisons of two analytical quantities at a bound set by rounding, not by atol and rtol
(the VJP against the JVP, batched against plain, reentrancy, zero and undefined grad_outputs),
whose ratio would not say how close a gradient came to the tolerance the user chose; and
comparisons that did not pass (a J·U source or a fused pass handed on to the next), which decide
nothing about a passing verdict. The ratio is computed from the same differences the comparison
takes (one more division and max per comparison); no function is called again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from opcheck._records import record

__all__ = ["Margin", "MarginRecorder", "current_recorder", "recording_margins", "worst_ratio"]


@record
class Margin:
    """The worst comparison seen: error / allowed, and which comparison it was in the engine's words
    ("VJP: d output 0 / d input 1")."""

    ratio: float
    where: str


class MarginRecorder:
    """The worst margin among the comparisons noted while it was open."""

    def __init__(self) -> None:
        self.worst: Margin | None = None
        self.comparisons = 0

    def note(self, ratio: float, where: Callable[[], str]) -> None:
        """One passing comparison's ratio; `where` names it, called only when it is the worst so far."""
        self.comparisons += 1
        if self.worst is None or ratio > self.worst.ratio:
            self.worst = Margin(ratio, where())


_RECORDER: ContextVar[MarginRecorder | None] = ContextVar("opcheck_margin_recorder", default=None)


def current_recorder() -> MarginRecorder | None:
    """The innermost open recorder, or None (then the comparisons compute no ratio)."""
    return _RECORDER.get()


@contextmanager
def recording_margins() -> Iterator[MarginRecorder]:
    """Record the worst margin of the checks run inside the block (nested blocks record their own)."""
    recorder = MarginRecorder()
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


def ratio_of(diff: torch.Tensor, allowed: torch.Tensor) -> float:
    """max(diff / allowed) of a passing comparison: a matching entry with no allowance (atol 0 at a
    zero numerical entry) counts 0."""
    if not diff.numel():
        return 0.0
    return float(torch.div(diff, allowed).nan_to_num_(nan=0.0).max())


def worst_ratio(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> float:
    """max |a - b| / (atol + rtol * |b|) over the entries of a comparison that passed torch.allclose
    (equal infinities count 0, as they compare equal there)."""
    diff = torch.sub(a, b).abs()
    return ratio_of(diff.nan_to_num_(nan=0.0), b.abs().mul(rtol).add_(atol))
