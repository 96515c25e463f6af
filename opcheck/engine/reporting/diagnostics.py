"""Localize a Jacobian mismatch: which entries, by how much, and what the pattern suggests."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import field, fields
from typing import Any

import torch
from torch import Tensor

from opcheck._records import record
from opcheck.engine._util import unravel
from opcheck.engine.reporting.hints import abs_max, hints_for, index_text, number_text, shape_text
from opcheck.failure_facts import FailureFacts, hint_lines

WORST_ENTRIES = 5
"""Jacobian entries a report lists, the worst first."""

Shape = tuple[int, ...]

FORWARD_AD_CHECK = "forward AD"
"""BlockLabel.check of a forward-mode Jacobian block (torch: "Jacobian computed with forward mode mismatch")."""


@record
class EntryError:
    """One Jacobian entry d output[output_index] / d input[input_index] that is out of tolerance."""

    output_index: tuple[int, ...]
    input_index: tuple[int, ...]
    analytical: complex | float
    numerical: complex | float
    abs_error: float
    rel_error: float


@record(eq=False)
class BlockLabel:
    """Which (output, input) block a report is about, as it names it."""

    check: str  # "backward", "forward AD"
    path: str  # "VJP", "JVP", "VJP of VJP", "JVP of VJP"
    output_idx: int
    input_idx: int
    output_name: str
    input_name: str
    part: str | None  # "real" or "imaginary" when complex outputs/inputs are checked part by part
    # the inputs the names speak of, by the numbers they write (CheckContext.named_inputs)
    named_inputs: tuple[int, ...] = field(default=(), kw_only=True)

    @property
    def forward_mode(self) -> bool:
        """Whether the block is a forward-mode (JVP) Jacobian, computed from tangents, not from backward."""
        return self.check == FORWARD_AD_CHECK

    def label_fields(self) -> dict[str, Any]:
        """The label's fields by name, to build a report of this block."""
        return {f.name: getattr(self, f.name) for f in fields(BlockLabel)}


@record(eq=False)
class BlockMismatch(BlockLabel):
    """A failed comparison of one (output, input) block: what the Jacobian mismatches have in common."""

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    atol: float
    rtol: float
    mismatched: int
    total: int
    hints: tuple[str, ...]
    analytical: torch.Tensor = field(repr=False)
    numerical: torch.Tensor = field(repr=False)

    def describe(self) -> str:
        raise NotImplementedError

    def worst_entry(self) -> str:
        """The first entry `describe` lists as worst, as it writes it; "" when it lists none."""
        raise NotImplementedError

    def facts(self) -> FailureFacts:
        """What the report names, as values: the block and its worst entry, the hints, the inputs."""
        block = f"d {self.output_name} / d {self.input_name}" + (f", {self.part} part" if self.part else "")
        entry = self.worst_entry()
        return FailureFacts(worst=f"{block}, {entry}" if entry else "", hints=self.hints, inputs=self.named_inputs)


@record(eq=False)
class JacobianMismatch(BlockMismatch):
    """A failed comparison of one (output, input) Jacobian block.

    `analytical` and `numerical` are laid out as torch's gradcheck lays them out: one row per input
    element, one column per output element.
    """

    worst: tuple[EntryError, ...]

    def describe(self) -> str:
        lines = [
            f"check: {self.check} ({self.path}); d {self.output_name} / d {self.input_name}"
            + (f", {self.part} part" if self.part else ""),
            f"{self.mismatched} of {self.total} Jacobian entries differ beyond atol={self.atol:g} + "
            f"rtol={self.rtol:g} * |numerical| (input shape {shape_text(self.input_shape)}, "
            f"output shape {shape_text(self.output_shape)})",
        ]
        if self.worst:
            lines.append("worst entries:")
            lines += [f"  {_entry_text(e)}" for e in self.worst]
        lines += hint_lines(self.hints)
        return "\n".join(lines)

    def worst_entry(self) -> str:
        return _entry_text(self.worst[0]) if self.worst else ""


def _entry_text(e: EntryError) -> str:
    return (
        f"d out{index_text(e.output_index)} / d in{index_text(e.input_index)}: analytical "
        f"{number_text(e.analytical)}, numerical {number_text(e.numerical)}, abs err {e.abs_error:.4g}, "
        f"rel err {e.rel_error:.4g}"
    )


def find_mismatch(
    analytical: Tensor,
    numerical: Tensor,
    *,
    rtol: float,
    atol: float,
    label: BlockLabel,
    shapes: tuple[Shape, Shape],
    numerical_of_inputs: Sequence[Tensor | None] = (),
) -> JacobianMismatch:
    """Build the report for a block that failed allclose(analytical, numerical, rtol, atol).

    shapes: the block's (input shape, output shape). numerical_of_inputs: where the caller holds
    them (the full check), the numerical blocks of every input for the same output, by input
    index, so that a gradient returned for the wrong input is named.
    """
    input_shape, output_shape = shapes
    dtype = torch.promote_types(analytical.dtype, numerical.dtype)
    a = analytical.detach().to(device="cpu", dtype=dtype)
    n = numerical.detach().to(device="cpu", dtype=dtype)
    # A block can hold millions of entries (4096 x 4096: 16.7M), and a report is made on every
    # failure: each pass below is one over the block, the rest works on the failing entries only.
    norms = abs_max(a), abs_max(n)
    diff = torch.sub(a, n).abs() if dtype.is_complex else torch.sub(a, n).abs_()
    allowed = n.abs().mul_(rtol).add_(atol)
    if all(map(math.isfinite, norms)):
        bad = diff.le(allowed).logical_not_()
    else:  # isclose's own rules for NaN and inf (an inf is close only to the same inf)
        bad = torch.isclose(a, n, rtol=rtol, atol=atol).logical_not_()
    failing = torch.nonzero(bad.reshape(-1)).flatten()
    diff_bad, allowed_bad = diff.reshape(-1)[failing], allowed.reshape(-1)[failing]
    del allowed
    excess = torch.where(diff_bad.isfinite() & allowed_bad.isfinite(), diff_bad - allowed_bad, math.inf)
    worst = []
    for k in _largest(excess, min(WORST_ENTRIES, failing.numel())):
        row, col = divmod(int(failing[k]), a.shape[1])
        av, nv = a[row, col].item(), n[row, col].item()
        d = diff[row, col].item()
        worst.append(
            EntryError(
                output_index=unravel(col, output_shape),
                input_index=unravel(row, input_shape),
                analytical=av,
                numerical=nv,
                abs_error=d,
                rel_error=d / abs(nv) if nv != 0 else math.inf,
            )
        )
    hints, also_named = hints_for(
        a,
        n,
        bad,
        rtol=rtol,
        atol=atol,
        input_shape=input_shape,
        output_shape=output_shape,
        names=(label.input_name, label.output_name),
        input_idx=label.input_idx,
        numerical_of_inputs=numerical_of_inputs,
        forward=label.forward_mode,
        failing=failing,
        norms=norms,
    )
    return JacobianMismatch(
        **{**label.label_fields(), "named_inputs": (*label.named_inputs, *also_named)},
        input_shape=input_shape,
        output_shape=output_shape,
        atol=atol,
        rtol=rtol,
        mismatched=failing.numel(),
        total=bad.numel(),
        worst=tuple(worst),
        hints=tuple(hints),
        analytical=analytical,
        numerical=numerical,
    )


def _largest(x: torch.Tensor, k: int) -> list[int]:
    """Flat indices of the k largest entries, largest first, ties in index order (no full sort:
    a 4096 x 4096 block has 16.7M entries)."""
    if k <= 0:
        return []
    kth = torch.topk(x, k, sorted=True).values[-1]
    candidates = torch.nonzero(x >= kth).flatten()  # every entry tied with the k-th too
    order = torch.sort(x[candidates], descending=True, stable=True).indices
    return candidates[order[:k]].tolist()
