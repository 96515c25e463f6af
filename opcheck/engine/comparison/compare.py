"""Comparing a Jacobian block, and saying so when it fails: torch's verdict and first line, then where.

The verdict is torch.allclose's (after type promotion); the first line is torch's own wording; the
lines after it come from diagnostics.find_mismatch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

import torch

from opcheck._records import record
from opcheck.engine._util import diff_input_indices, float_outputs
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.reporting import torch_words

if TYPE_CHECKING:  # the report's classes load with the first report (reporting/diagnostics.py)
    from opcheck.engine.reporting.diagnostics import BlockLabel, JacobianMismatch


@record
class Part:
    """Which Jacobian a comparison is of: forward-mode AD's (`forward`) or backward's; and, where
    complex outputs (backward) or inputs (forward) are checked part by part, which they are
    (complex_indices) and whether this is the imaginary part (test_imag) or the real one."""

    forward: bool = False
    complex_indices: Sequence[int] | None = None
    test_imag: bool = False

    def block(self, output_idx: int, input_idx: int) -> Block:
        return Block(output_idx, input_idx, self.forward, self.complex_indices, self.test_imag)


BACKWARD = Part()
FORWARD = Part(forward=True)


@record
class Block:
    """Which Jacobian block a comparison is about, as torch's messages name it (see Part)."""

    output_idx: int
    input_idx: int
    is_forward_ad: bool
    complex_indices: Sequence[int] | None = None
    test_imag: bool = False

    @property
    def part(self) -> str | None:
        """ "real" or "imaginary" where the block's output (backward) or input (forward) is complex."""
        if not self.complex_indices:
            return None
        idx = self.input_idx if self.is_forward_ad else self.output_idx
        return ("imaginary" if self.test_imag else "real") if idx in self.complex_indices else None

    def first_line(self) -> str:
        """torch's first line for this block's mismatch."""
        return torch_words.jacobian_mismatch(
            self.output_idx, self.input_idx, self.complex_indices, self.test_imag, self.is_forward_ad
        )

    def named(self, ctx: CheckContext, how: str = "") -> Callable[[], str]:
        """The block's comparison as a margin names it (opcheck.engine.margins), computed on demand:
        "VJP: d output 0 / d input 1", then the part and `how` where there are ("J·U from forward AD")."""
        return functools.partial(self._words, ctx, how)

    def _words(self, ctx: CheckContext, how: str) -> str:
        label = self.label(ctx, self.part)
        extra = [f"{label.part} part"] if label.part else []
        extra += [how] if how else []
        words = f"{label.path}: d {label.output_name} / d {label.input_name}"
        return f"{words} ({', '.join(extra)})" if extra else words

    def label(self, ctx: CheckContext, part: str | None) -> BlockLabel:
        """The block as a report names it (`part`: usually self.part)."""
        from opcheck.engine.reporting.diagnostics import BlockLabel

        forward = self.is_forward_ad
        return BlockLabel(
            check="forward AD" if forward else "backward",
            path=ctx.forward_path if forward else ctx.backward_path,
            output_idx=self.output_idx,
            input_idx=self.input_idx,
            output_name=ctx.output_name(self.output_idx),
            input_name=ctx.input_name(self.input_idx),
            part=part,
            named_inputs=ctx.named_inputs(self.output_idx, self.input_idx),
        )


def block_mismatch(
    ctx: CheckContext,
    block: Block,
    a: torch.Tensor,
    n: torch.Tensor,
    call: Call,
    numerical_of_inputs: Sequence[torch.Tensor | None] = (),
) -> JacobianMismatch:
    """The report of a block whose analytical a and numerical n disagree.

    Its output is numbered among the call's float outputs for forward AD, among the outputs that
    require grad for backward, as torch numbers them.
    """
    from opcheck.engine.reporting.diagnostics import find_mismatch

    inputs, outputs = call.inputs, call.func_out if block.is_forward_ad else call.outputs
    x = inputs[diff_input_indices(inputs)[block.input_idx]]
    floats = float_outputs(outputs)
    output_shape = tuple(floats[block.output_idx].shape) if block.output_idx < len(floats) else (a.shape[1],)
    flags = ctx.flags
    shapes = (tuple(x.shape), output_shape)
    mismatch = find_mismatch(
        a,
        n,
        rtol=flags.rtol,
        atol=flags.atol,
        label=block.label(ctx, block.part),
        shapes=shapes,
        numerical_of_inputs=numerical_of_inputs,
    )
    hint = ctx.layouts.hint(x, mismatch) if ctx.layouts is not None else None
    return replace(mismatch, hints=mismatch.hints + (hint,)) if hint else mismatch


def raise_mismatch(ctx: CheckContext, mismatch: JacobianMismatch, first_line: str, extra: str = "") -> NoReturn:
    ctx.fail(f"{first_line}\n{mismatch.describe()}{extra}", check=mismatch.check, path=mismatch.path, mismatch=mismatch)
