"""`opcheck_mutants::rms_norm_tail`: the example model's RMSNorm kernel with a tail-tile bug.

The op is examples/transformer.py's `opcheck_examples::rms_norm` (its forward, fake and
setup_context are reused as they are) but for one mistake in its backward, copied here with the
bug: in a row of two or more tiles, the last, partial tile stores rstd·g·w without the
mean-correction term -x·rstd³·mean(g·w·x). A row that fits one tile never reaches that branch, so
at a hand-written toy size ([3, 8]) the mutant is the correct op, and only a size with a partial
tail tile after full ones (hidden 80 = 32 + 32 + 16, the example model's) shows the bug: the
case `opcheck capture` exists for.
"""

from __future__ import annotations

import torch
from torch import Tensor

from examples.transformer import BLOCK, as_rows, column_tiles, rms_norm_setup, rms_norm_tiles, row_dots, rstd_rows


@torch.library.custom_op("opcheck_mutants::rms_norm_tail", mutates_args=())
def rms_norm_tail(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return rms_norm_tiles(x, weight, eps)


@rms_norm_tail.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


def backward_with_tail_bug(ctx, grad):
    """examples.transformer.rms_norm_backward, but for the tail tile of a multi-tile row."""
    x, weight = ctx.saved_tensors
    rows, grad_rows, n = as_rows(x), as_rows(grad), x.shape[-1]
    rstd = rstd_rows(rows, ctx.eps)
    correction = rstd**3 * row_dots(grad_rows, weight, rows) / n
    tiles = column_tiles(n)
    grad_x, grad_weight = [], []
    for cols in tiles:
        partial_tail = len(tiles) > 1 and cols.stop - cols.start < BLOCK
        if partial_tail:  # THE BUG: the masked tail tile of the multi-tile loop drops the correction
            grad_x.append(rstd * grad_rows[:, cols] * weight[cols])
        else:
            grad_x.append(rstd * grad_rows[:, cols] * weight[cols] - rows[:, cols] * correction)
        grad_weight.append((grad_rows[:, cols] * rows[:, cols] * rstd).sum(0))
    return torch.cat(grad_x, 1).reshape(x.shape), torch.cat(grad_weight), None


rms_norm_tail.register_autograd(backward_with_tail_bug, setup_context=rms_norm_setup)
