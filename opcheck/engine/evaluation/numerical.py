"""The numerical Jacobian: central differences of every output along every input element.

Computed in vmapped batches where the function allows (batching.fd_columns), else by torch's
loop, and laid out as torch lays it out, quirks included, so that verdicts agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opcheck.engine._util import Inputs, diff_input_indices, float_outputs
from opcheck.engine.batching import Differences, Segment, numerical_columns
from opcheck.engine.context import Blocks, CheckContext, NumericalCache
from opcheck.engine.reporting import torch_words


def numerical_jacobian(
    ctx: CheckContext, fn: Callable[..., Any], inputs: Inputs, outputs: tuple[Any, ...], *, is_forward_ad: bool = False
) -> Blocks:
    """Per input requiring grad, a tuple of (numel_in, numel_out) blocks, one per float/complex output."""
    key = NumericalCache.key(fn, inputs, outputs)
    cached = ctx.numerical_cache.get(key)
    if cached is not None:
        return cached
    if not is_forward_ad and any(o.is_complex() for o in outputs):
        raise ValueError(torch_words.numerical_complex_output())
    diff = diff_input_indices(inputs)
    segments: list[Segment] = [
        (idx, p) for idx in diff if inputs[idx].numel() for p in ((1, 1j) if inputs[idx].is_complex() else (1,))
    ]
    positions = None
    if ctx.layouts is not None:
        found = {idx: ctx.layouts.numerical_positions(inputs[idx]) for idx in diff}
        positions = {idx: pos for idx, pos in found.items() if pos is not None}
    diffs = Differences(ctx.evaluator, fn, inputs, ctx.flags.eps)
    if ctx.layouts is not None:
        diffs = ctx.layouts.differences(diffs)
    per_segment = dict(zip(segments, numerical_columns(diffs, segments, outputs, positions)))
    result = [_blocks(inputs[idx], idx, outputs, per_segment, is_forward_ad) for idx in diff]
    ev = ctx.evaluator
    ctx.numerical_cache.put(key, result, batched=ev.numerical_batched, ulps=ev.numerical_ulps)
    return result


def _blocks(
    x: torch.Tensor,
    idx: int,
    outputs: tuple[Any, ...],
    per_segment: dict[Segment, list[torch.Tensor]],
    is_forward_ad: bool,
) -> tuple[torch.Tensor, ...]:
    """Input idx's blocks, one per float output, from its segments' columns."""
    n = x.numel()
    if n == 0:
        cols = [o.new_zeros((0, o.numel())) for o in outputs]
    elif x.is_complex():
        cols = []
        for ds_dx, ds_dy in zip(per_segment[(idx, 1)], per_segment[(idx, 1j)]):
            if ds_dx.is_complex() and not is_forward_ad:
                raise AssertionError(torch_words.complex_ds_dx())
            cols.append(ds_dx + ds_dy * 1j)
    else:
        cols = per_segment[(idx, 1)]
    blocks = []
    # Matched by position, like torch: float output i gets column i of all outputs, so after a
    # non-float output (an int rank, indices) the columns shift; and each column is copied
    # into its row with broadcasting. Both are torch quirks, kept so that verdicts agree.
    for i, o in enumerate(float_outputs(outputs)):
        dtype = x.dtype if x.is_complex() else o.dtype
        if cols[i].numel() == n * o.numel():
            blocks.append(cols[i].reshape(n, o.numel()).to(dtype=dtype))
            continue
        block = torch.zeros((n, o.numel()), dtype=dtype, device=o.device)
        rows = cols[i].reshape(n, -1)
        for k in range(n):  # torch's row copy: a one-element column broadcasts, others raise its error
            block[k] = rows[k]
        blocks.append(block)
    return tuple(blocks)


SETTLE_BAND = 1e3
"""Vmapped and plain evaluations may differ by up to SETTLE_BAND * eps_dtype * max|output| (the
batched forward probe's allowance, batching.agreement), so a central difference by up to that over eps."""
SETTLE_MARGIN = 16.0
"""The other rows are taken to be off by up to this many times what the probe's row was off by..."""
SETTLE_FLOOR = 4.0
"""...and by a few ulps even where the probe's row was exact."""


def settle_rows(
    ctx: CheckContext,
    fn: Callable[..., Any],
    inputs: Inputs,
    outputs: tuple[Any, ...],
    analytical: torch.Tensor,
    numerical: torch.Tensor,
    output_idx: int,
    input_idx: int,
) -> torch.Tensor:
    """Make a block's verdict the one torch's plain calls give, when vmapped calls computed it.

    A vmapped evaluation rounds differently from a plain one; where the function's values are large
    (a product near 1e8) that moves a central difference by more than the tolerance's margin of some
    entry, and batching would change the verdict. The rows of the block (input elements) with an
    entry that close to the tolerance are recomputed with plain calls, in every output's block.
    How close counts is measured: the plain call that probed the vmapped rows was off by some ulps
    of the outputs' scale (none for most kernels), and the other rows are taken to be off by up to
    SETTLE_MARGIN times that, never less than SETTLE_FLOOR ulps nor more than SETTLE_BAND.
    """
    key = NumericalCache.key(fn, inputs, outputs)
    floats = float_outputs(outputs)
    if not ctx.numerical_cache.batched(key) or output_idx >= len(floats) or numerical.numel() == 0:
        return numerical
    flags = ctx.flags
    out = floats[output_idx].detach()
    scale = float(out.abs().nan_to_num(0.0, 0.0, 0.0).max()) if out.numel() else 0.0
    ulps = min(SETTLE_BAND, max(SETTLE_MARGIN * ctx.numerical_cache.ulps(key), SETTLE_FLOOR))
    band = ulps * torch.finfo(out.real.dtype if out.is_complex() else out.dtype).eps * scale / flags.eps
    if not band > 0:
        return numerical
    dtype = torch.promote_types(analytical.dtype, numerical.dtype)
    a, n = analytical.detach().to(dtype=dtype, device="cpu"), numerical.detach().to(dtype=dtype, device="cpu")
    # |(|a - n| - (atol + rtol |n|))| with few temporaries (a block can have 64M entries); abs of a
    # complex difference is real, so in place from there
    margin = torch.sub(a, n).abs().sub_(n.abs().mul_(flags.rtol).add_(flags.atol)).abs_()
    near = (margin <= band).any(dim=1)
    settled = ctx.numerical_cache.settled(key, input_idx)
    rows = [int(r) for r in torch.nonzero(near).flatten() if int(r) not in settled]
    if not rows:
        return numerical
    idx = diff_input_indices(inputs)[input_idx]
    blocks = ctx.numerical_cache.get(key) or []
    diffs = Differences(ctx.evaluator, fn, inputs, flags.eps)
    for r in rows:
        cols = diffs.column(idx, r)
        if inputs[idx].is_complex():
            cols = [dx + dy * 1j for dx, dy in zip(cols, diffs.column(idx, r, 1j))]
        for block, col in zip(blocks[input_idx], cols):
            if col.numel() != block.shape[1]:
                return numerical  # torch's broadcasting copy (see numerical_jacobian): left as it is
            block[r] = col.to(block.dtype)
        settled.add(r)
    ctx.evaluator.stats.fallbacks.append(f"settled {len(rows)} numerical rows of input {idx} by plain calls")
    ctx.evaluator.stats.settled_rows += len(rows)
    return numerical
