"""Whether a reference computes in float64: a reference that casts to float32 inside (the shape
of many references kernel libraries ship) measures the op against float32 arithmetic, and at
float32 that lowers the bar to nothing.

The test: the reference is run on its inputs (and cotangent) moved by a relative SMALL and by a
relative LARGE, entry by entry at random. The inputs are low-precision values, exact in float32,
and SMALL (2^-27) is below half a float32 rounding (2^-25 relative at least), so a reference that
rounds its inputs to float32 sees the very same values and returns bit for bit the same results;
a float64 reference sees the change, 25 bits above its own rounding. LARGE (2^-12) moves any
reference. An entry is blind when LARGE moves it and SMALL does not; the reference is not a
float64 one when at least half the entries of its outputs and VJP together are blind (and two at
least). Piecewise-constant results (round, floor, a clamped region) are blind at a few entries,
never at half of them; so is an entry whose float64 value cancels (a loss of 1e-12 computed as
30 - 30.000000000001), while the gradients beside it move.

What it can miss: a reference that computes in float32 and adds a float64 term at the end (a
residual), or whose backward alone runs in float32 while its VJP is not compared; either moves
under SMALL.
"""

from __future__ import annotations

import torch

SMALL = 2.0**-27
"""Below half a float32 rounding of any input value (relative 2^-25 at least), far above float64's."""
LARGE = 2.0**-12
"""Above any rounding of float32, float16 and bfloat16: every smooth result moves."""
BLIND_SHARE = 0.5
"""The share of the entries that must be blind to SMALL for the reference to be called float32."""
MIN_BLIND = 2
"""One entry is no evidence: a single float64 value may cancel below the change SMALL makes."""


def blind_share(base: torch.Tensor, small: torch.Tensor, large: torch.Tensor | None) -> tuple[int, int]:
    """(entries that LARGE moves and SMALL does not, entries compared): the finite entries of one
    part of the reference's results, unmoved, moved by SMALL and moved by LARGE. Without `large`,
    every entry counts as moved by it: the count bounds the blind entries from above."""
    b, s = _dense(base), _dense(small)
    g = _dense(large) if large is not None else None
    if b.shape != s.shape or (g is not None and b.shape != g.shape) or not (b.is_floating_point() or b.is_complex()):
        return 0, 0
    finite = torch.isfinite(b) & torch.isfinite(s)
    blind = finite & (s == b)
    if g is not None:
        finite &= torch.isfinite(g)
        blind &= finite & (g != b)
    return int(blind.sum()), int(finite.sum())


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to_dense() if t.layout != torch.strided else t.detach()


def is_blind(blind: int, total: int) -> bool:
    """At least BLIND_SHARE of the entries are blind, and MIN_BLIND at least."""
    return blind >= MIN_BLIND and blind >= BLIND_SHARE * total


def not_float64_text(who: str, what: str, blind: int, total: int, failing: bool) -> str:
    """The finding: `what` ("output 0, VJP: gradient of input 1") of `who` ("the reference") is
    blind at `blind` of `total` entries."""
    text = (
        f"{who} does not compute in float64: its results ({what}) stay bit for bit the same at {blind} of "
        f"{total} entries when its inputs move by a relative {SMALL:.1e}, below float32's rounding, and move when "
        f"they move by {LARGE:.1e}: it rounds to float32 (or narrower) inside, so the check would measure "
        "the op against float32 arithmetic, not against the exact result."
    )
    if failing:
        return text + (
            "\nfix: make the reference compute in float64: no `.float()`, `.to(torch.float32)` or float32 "
            "buffers inside it (upcast at its start if it must), or leave `reference:` out to compare with "
            "the op's own float64 run"
        )
    return text + (
        " At float16 and bfloat16 a float32 reference's own error is far below the dtype's rounding, so the "
        "check stands; at float32 it would fail."
    )
