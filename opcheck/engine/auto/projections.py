"""fast_mode="auto"'s projections: their directions, their comparisons and their reports.

Shared by the step-by-step projection check (stepwise.py) and its fused pass (fused_projected.py),
which compare the same quantities at the same tolerances; stepwise.py's docstring says what they
guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from opcheck._records import record
from opcheck.engine.reporting.diagnostics import BlockMismatch
from opcheck.failure_facts import hint_lines

SEED = 0x5EED_A070
"""Seeds the directions U and cotangents V (one generator, inputs first)."""
WORST = 5
"""Projection entries a report lists."""

JVP_STAGE = "J·U projections against finite differences"
VJP_STAGE = "VJP against JVP projections"


def rademacher(shape: Sequence[int], like: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Entries ±1 of like's dtype and device, drawn on the CPU from g."""
    signs = torch.randint(0, 2, tuple(shape), generator=g, device="cpu").mul_(2).sub_(1)
    return signs.to(dtype=like.dtype, device=like.device)


def vjp_jvp_pairs(
    v: torch.Tensor, ju: torch.Tensor, g: torch.Tensor, u: torch.Tensor, nondet_tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The VJP stage's comparison of one block: (Jᵀv)·u against vᵀ(Ju) for every pair.

    v: (k', m) cotangents, ju: (k, m) J·U, g: (k', n) JᵀV, u: (k, n) directions. Returns
    (lhs = vᵀ(Ju), rhs = (Jᵀv)ᵀu, |lhs - rhs|, allowed, bad), each (k', k), at the rounding bound
    of auto's module doc.
    """
    lhs = v @ ju.t()
    rhs = g @ u.t()
    eps = torch.finfo(lhs.dtype).eps
    rho = 1024 * eps * math.sqrt(g.shape[1] + v.shape[1])
    allowed = rho * (v.abs() @ ju.abs().t() + g.abs() @ u.abs().t()) + nondet_tol * g.shape[1] + 1e-300
    err = (lhs - rhs).abs()
    return lhs, rhs, err, allowed, ~(err <= allowed)


def worst_positions(err: torch.Tensor, allowed: torch.Tensor, bad: torch.Tensor) -> list[tuple[int, int]]:
    """(row, column) of the WORST entries out of tolerance, most beyond it first (NaN the worst)."""
    excess = torch.where(bad, torch.nan_to_num(err - allowed, nan=math.inf), torch.full_like(err, -math.inf))
    order = torch.argsort(excess.reshape(-1), descending=True)[: min(WORST, int(bad.sum()))].tolist()
    return [divmod(flat, err.shape[1]) for flat in order]


@record
class ProjectionEntry:
    """One projection entry out of tolerance.

    In the JVP stage: (J u_direction)[output_index]; in the VJP stage: v_cotangentᵀ J u_direction.
    """

    output_index: tuple[int, ...] | None
    cotangent: int | None
    direction: int
    analytical: float
    numerical: float  # the reference: finite differences (JVP stage) or vᵀ(Ju) (VJP stage)
    abs_error: float
    allowed: float

    def describe(self) -> str:
        if self.output_index is not None:
            where, got, ref = (
                f"(J u_{self.direction})[{', '.join(map(str, self.output_index))}]",
                "analytical",
                "numerical",
            )
        else:
            where, got, ref = f"v_{self.cotangent}ᵀ J u_{self.direction}", "(Jᵀv)ᵀu from VJP", "vᵀ(Ju) from JVP"
        return (
            f"  {where}: {got} {self.analytical:.6g}, {ref} {self.numerical:.6g}, "
            f"abs err {self.abs_error:.4g}, allowed {self.allowed:.4g}"
        )


@record
class PinnedEntry:
    """A Jacobian entry out of tolerance, as the full check compares it."""

    output_index: tuple[int, ...]
    input_index: tuple[int, ...]
    analytical: float
    numerical: float
    abs_error: float
    allowed: float

    def describe(self) -> str:
        out, inp = (", ".join(map(str, ix)) for ix in (self.output_index, self.input_index))
        return (
            f"  output [{out}] / input [{inp}]: analytical {self.analytical:.6g}, numerical {self.numerical:.6g}, "
            f"abs err {self.abs_error:.4g}, allowed {self.allowed:.4g}"
        )


@record(eq=False)
class ProjectionMismatch(BlockMismatch):
    """A failed projection comparison of a block too large to recompute in full.

    `analytical` / `numerical` are (k, m) for the JVP stage (a row per direction, a column per
    output element) and (k', k) for the VJP stage ((JᵀV)ᵀU against Vᵀ(JU)).
    """

    comparison: str  # JVP_STAGE or VJP_STAGE
    source: str  # where J·U came from
    worst: tuple[ProjectionEntry, ...]
    not_recomputed: str = "beyond the budget"  # why the block was not recomputed in full
    pinned: tuple[PinnedEntry, ...] = ()  # Jacobian entries the full check fails (pinpoint.py)

    def describe(self) -> str:
        entries = self.input_shape and math.prod(self.input_shape) * math.prod(self.output_shape)
        shapes = f"(input shape {tuple(self.input_shape)}, output shape {tuple(self.output_shape)})"
        lines = [
            f"check: {self.check} ({self.path}), auto: {self.comparison} (J·U from {self.source}); "
            f"d {self.output_name} / d {self.input_name}"
        ]
        if self.comparison == JVP_STAGE:
            lines.append(
                f"{self.mismatched} of {self.total} projection entries (J u_l)[out] differ beyond "
                f"atol={self.atol:g} + rtol={self.rtol:g} * |numerical| {shapes}"
            )
        else:
            lines.append(
                f"{self.mismatched} of {self.total} pairs v_iᵀ J u_l differ between the VJP and the "
                f"JVP beyond the rounding bound {shapes}"
            )
        if self.pinned:
            lines.append(
                f"the block has {entries} Jacobian entries, {self.not_recomputed}; the full check fails it: "
                f"{len(self.pinned)} of its entries found out of tolerance, each as the full check compares it "
                "(fast_mode=False computes every entry):"
            )
            lines += [e.describe() for e in self.pinned[:WORST]]
        else:
            lines.append(
                f"the block has {entries} Jacobian entries, {self.not_recomputed}: not recomputed in full; "
                "these are projection entries, not Jacobian entries"
            )
        if self.worst:
            lines.append("worst projection entries:" if self.pinned else "worst entries:")
            lines += [e.describe() for e in self.worst]
        lines += hint_lines(self.hints)
        return "\n".join(lines)

    def worst_entry(self) -> str:
        """The first Jacobian entry the full check fails, else the first projection entry."""
        first = self.pinned[:1] or self.worst[:1]
        return first[0].describe().strip() if first else ""
