"""Hints that name where a wrong gradient lives: another input's gradient, or one index of a tensor.

hints.hints_for asks swapped_input right after the non-finite check (a swap explains the whole
block), and index_hint with the hints about what the wrong entries have in common. A swap can only
be seen where the other inputs' numerical blocks are at hand: find_mismatch's numerical_of_inputs.
Where no block is held (fast_mode="auto"'s projections), swapped_in_projections sees a swap in the
projections: input j's analytical projections along its directions against another input's
numerical ones along the same directions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from opcheck.engine._util import unravel

Shape = tuple[int, ...]


def swapped_input(
    a: Tensor,
    input_idx: int,
    numerical_of_inputs: Sequence[Tensor | None],
    close: Callable[[Tensor, Tensor], bool],
) -> int | None:
    """The other input whose numerical block (same output) the analytical block of input
    `input_idx` equals (swapped_message is the hint); None when there is none.

    numerical_of_inputs: the numerical Jacobian block of every input for this output, by input
    index; None where it is not at hand.
    """
    for k, other in enumerate(numerical_of_inputs):
        if k == input_idx or other is None or tuple(other.shape) != tuple(a.shape):
            continue
        other = other.detach().to(device=a.device, dtype=torch.promote_types(a.dtype, other.dtype))
        if not bool(other.ne(0).any()):
            continue  # an input the output does not depend on says nothing about a swap
        if close(a.to(other.dtype), other):
            return k
    return None


def swapped_message(input_idx: int, other_idx: int) -> str:
    """The hint for a gradient of input `input_idx` that is input `other_idx`'s."""
    return (
        f"the gradient for input {input_idx} matches input {other_idx}'s numerical gradient: are the "
        "returned gradients swapped?"
    )


def swapped_in_projections(
    a: Tensor,
    input_idx: int,
    own: Tensor,
    others: Sequence[tuple[Tensor, Tensor] | None],
) -> int | None:
    """The input whose numerical projections input `input_idx`'s analytical ones `a` match, not its own.

    others: by input index, (the numerical projections of that input's block taken along input
    `input_idx`'s directions, the entrywise allowance for a match), or None where the input cannot
    have the gradient (another shape or dtype). own: the reference `a` failed against; a match that
    holds for it too at the same allowance says nothing (both inputs have the same Jacobian), and
    this keeps the test no looser than the comparison that failed. Returns that input's index, or None.
    """
    for k, pair in enumerate(others):
        if k == input_idx or pair is None:
            continue
        value, allowed = pair
        if tuple(value.shape) != tuple(a.shape) or not bool(value.ne(0).any()):
            continue
        if _within(a, value, allowed) and not _within(a, own.to(a.device), allowed):
            return k
    return None


def _within(a: Tensor, b: Tensor, allowed: Tensor) -> bool:
    return bool(((a - b).abs() <= allowed).all())


def index_hint(bad: Tensor, input_shape: Shape, output_shape: Shape, names: tuple[str, str]) -> str | None:
    """Every wrong entry shares one index along some dim of the input or of the output.

    bad: the block's mismatches, one row per input element, one column per output element.
    names: the block's (input name, output name). One wrong input element or entry is said
    elsewhere; this names the slice (a column of a matrix, a channel) the wrong entries lie on.
    """
    rows = bad.any(dim=1).nonzero().flatten().tolist()
    cols = bad.any(dim=0).nonzero().flatten().tolist()
    if len(rows) <= 1 and len(cols) <= 1:
        return None  # one entry: its own hint
    parts = []
    if len(rows) > 1:
        parts += _shared_index("input", rows, input_shape, names[0])
    if len(cols) > 1:
        parts += _shared_index("output", cols, output_shape, names[1])
    if not parts:
        return None
    return "every wrong entry has " + " and ".join(parts)


def _shared_index(kind: str, flats: list[int], shape: Shape, name: str) -> list[str]:
    """`kind index [:, 3] (column 3 of NAME)` for each dim along which every flat position agrees."""
    if len(shape) < 2:
        return []
    coords = [unravel(k, shape) for k in flats]
    found = []
    for d, size in enumerate(shape):
        if size <= 1:
            continue
        values = {c[d] for c in coords}
        if len(values) == 1:
            (v,) = values
            index = "[" + ", ".join(str(v) if e == d else ":" for e in range(len(shape))) + "]"
            found.append(f"{kind} index {index} ({_slice_name(d, v, len(shape))} of {name})")
    return found


def _slice_name(dim: int, value: int, ndim: int) -> str:
    if ndim == 2:
        return f"{'row' if dim == 0 else 'column'} {value}"
    return f"index {value} along dim {dim}"
