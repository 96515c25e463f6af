"""The full check's finite differences by groups of columns, where they cannot be batched.

A function that cannot be vmapped (no batching rule: a random op under a fixed seed, a kernel whose
forward has no vmap support while its backward is made of torch ops) pays two plain calls per
Jacobian column in the full check. Most such Jacobians are sparse: an elementwise op's is diagonal,
a row-wise op's block-diagonal. Backward's rows, one batched backward, give the analytical
Jacobian A first; its columns are then grouped so that no two columns of a group have a nonzero in
the same row (column_groups: Curtis, Powell and Reid's compression), and one call pair perturbs a
whole group at once, each column k by eps·w_k with random weights w_k in [1/2, 1]:

    d = (f(x + eps·w_G) - f(x - eps·w_G)) / 2eps  ≈  Σ_{k in G} w_k J[:, k]

In a row where A has a nonzero in the group (at most one, column k*), d / w_k* is that entry's
finite difference, compared with A[i, k*] at the full check's tolerance as the full check compares
it; a row where A has none in the group must have d = 0 up to atol. An entry that backward left out
(A[i, k] = 0 where J[i, k] is not) shows in its row of k's group, weighted by w_k: against zero, or
against the group's one nonzero entry k*, which then differs by (1 - w_k/w_k*)·J[i, k]. A weight
ratio within about rtol of 1 could hide that second case (a gradient written to the wrong element):
route.GROUP_WEIGHTINGS independent weightings must both do so. (The projections' random signs
agree on two given columns in all route.DIRECTIONS directions once in 2^DIRECTIONS.)

The pass decides only a pass, as every fused pass: a difference anywhere hands the call to the
step-by-step full check, column by column as torch's slow mode (at most 2·route.FULL_CHECK_ELEMENTS
calls), which decides and localizes it; the projections' random signs could pass a gradient moved
between two columns that the weights told apart. It runs for fast_mode="auto"'s
check of backward alone (no forward AD, whose columns are compared one by one), within
route.loop_columns calls; fast_mode=False keeps torch's column-by-column differences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from opcheck.engine import aux_checks, route
from opcheck.engine._util import allclose_promoted, diff_input_indices, exception_line, float_outputs
from opcheck.engine.auto.fused_backward import batched_backward
from opcheck.engine.auto.passes import Fallback
from opcheck.engine.batching import Differences, InputWritten
from opcheck.engine.comparison.compare import BACKWARD
from opcheck.engine.context import Blocks, Call, CheckContext
from opcheck.engine.evaluation.numerical import numerical_jacobian

CompareRows = Callable[[Blocks, list[torch.Tensor]], None]
"""compare_rows(numerical, rows): the full check's comparison of finite-difference columns with
backward's rows (fused._backward's), raising Fallback where they differ."""

__all__ = ["applies_to", "column_groups", "grouped_check", "groups_apply"]


def column_groups(pattern: torch.Tensor, most: int | None = None) -> list[list[int]] | None:
    """The columns of a (rows, columns) pattern (nonzero: True) in groups whose nonzero rows are
    disjoint, greedily in column order (a column without a nonzero joins the first group); None
    where they take more than `most` groups."""
    cols = pattern.shape[1] if pattern.dim() == 2 else 0
    if cols == 0:
        return []
    bits = np.packbits(pattern.detach().to("cpu", torch.bool).t().numpy(), axis=1, bitorder="little")
    masks: list[int] = []
    groups: list[list[int]] = []
    for k in range(cols):
        rows = int.from_bytes(bits[k].tobytes(), "little")
        for g, mask in enumerate(masks):
            if not mask & rows:
                masks[g] = mask | rows
                groups[g].append(k)
                break
        else:
            if most is not None and len(groups) >= most:
                return None
            masks.append(rows)
            groups.append([k])
    return groups


def groups_apply(ctx: CheckContext, call: Call) -> bool:
    """Whether grouped_check takes this call's finite differences where they cannot be batched."""
    flags = ctx.flags
    return applies_to(flags.auto, flags.check_backward_ad, flags.check_forward_ad, call.func_out, call.outputs)


def applies_to(auto: bool, backward: bool, forward: bool, outputs: Sequence[Any], grad_outputs: Sequence[Any]) -> bool:
    """grouped_check's reach: fast_mode="auto" checking backward alone (forward AD's columns are
    compared one by one), every output (`outputs`) a float tensor that requires grad (`grad_outputs`)."""
    if not (auto and backward) or forward:
        return False
    return bool(outputs) and len(float_outputs(outputs)) == len(outputs) == len(grad_outputs)


def grouped_check(ctx: CheckContext, call: Call, compare_rows: CompareRows) -> None:
    """The full check's comparison of backward with finite differences whose columns cannot be
    batched, backward's side checks riding along its batched rows: by groups of columns
    (see the module's doc), or by the loop, column by column, as route.grouped_differences says;
    compare_rows(numerical, rows) compares the loop's columns with backward's rows. Raises Fallback
    where anything differs, or where neither fits route.loop_columns."""
    ev, flags = ctx.evaluator, ctx.flags
    diff = diff_input_indices(call.inputs)
    columns = sum(int(call.inputs[idx].numel()) for idx in diff)
    over = columns > route.loop_columns(len(diff))  # the loop would cost more than the projections
    try:
        rows = batched_backward(ctx, call, [None] * len(call.outputs))  # per input (m, n_j)
    except Exception as e:  # where the loop costs more, the projections go first, as without the groups
        if not over:
            raise
        distrust = e.distrust if isinstance(e, Fallback) else ()
        raise Fallback(f"backward's rows: {exception_line(e)}", distrust, loops=True, projections=True) from e
    most = route.loop_columns(len(diff)) // route.GROUP_WEIGHTINGS + 1
    groups = [column_groups(a != 0, most) for a in rows]
    counts = [len(g) if g is not None else most for g in groups]
    by_groups = route.grouped_differences(counts, columns, len(diff))
    if by_groups is None:
        raise Fallback(
            f"finite differences cannot be batched: {columns} columns, one call pair each, in "
            f"{sum(counts)} groups, where the caller allows {route.loop_columns(len(diff))}",
            loops=True,
            projections=True,
        )
    if not by_groups:
        compare_rows(numerical_jacobian(ctx, call.func, call.inputs, call.func_out), rows)
        ev.stats.auto_paths.append("full")
        return
    diffs = Differences(ev, call.func, call.inputs, flags.eps)
    sizes = [o.numel() for o in call.outputs]
    generator = torch.Generator().manual_seed(aux_checks.SEED)
    for j, (idx, a, own) in enumerate(zip(diff, rows, groups)):
        x = call.inputs[idx].data
        for _ in range(route.GROUP_WEIGHTINGS):
            w = torch.rand(x.numel(), generator=generator, dtype=torch.float64).mul_(0.5).add_(0.5)
            w = w.to(dtype=x.dtype, device=x.device)
            for members in own or []:
                try:
                    agrees = _group_agrees(ctx, diffs, x, a, w, members, sizes, j)
                except InputWritten as e:  # torch's column loop shows what that does to its differences
                    raise Fallback(str(e), loops=True) from e
                if not agrees:
                    # the step-by-step full check decides, column by column, and localizes it: the
                    # projections' random directions could pass what the weights told apart
                    raise Fallback(f"backward: input {j} disagrees with grouped finite differences", loops=True)
    ev.stats.auto_paths.append("full (grouped finite differences)")


def _group_agrees(
    ctx: CheckContext,
    diffs: Differences,
    x: torch.Tensor,
    a: torch.Tensor,
    w: torch.Tensor,
    members: list[int],
    sizes: list[int],
    j: int,
) -> bool:
    """One call pair along the group `members` of input j (x its data, a its (m, n_j) rows of
    backward): whether every row agrees with backward's one entry in the group."""
    flags = ctx.flags
    index = torch.tensor(members, dtype=torch.long, device=x.device)
    delta = torch.zeros(x.numel(), dtype=x.dtype, device=x.device)
    delta[index] = w[index] * flags.eps
    d = torch.cat([c.reshape(-1) for c in diffs.along(x, delta.view(x.shape), unwritten=True)])
    block = a[:, index]
    nonzero = block != 0
    # each row's one nonzero entry of the group (or none: zero), and its weight (or 1)
    entry = torch.where(nonzero, block, torch.zeros_like(block)).sum(dim=1)
    weight = torch.where(nonzero, w[index].to(block.dtype), torch.zeros_like(block)).sum(dim=1)
    scale = torch.where(nonzero.any(dim=1), weight, torch.ones_like(weight))
    numerical = d.to(block.dtype) / scale
    offset = 0
    for i, size in enumerate(sizes):
        part = slice(offset, offset + size)
        where = BACKWARD.block(i, j).named(ctx, "grouped finite differences")
        if not allclose_promoted(entry[part], numerical[part], flags.rtol, flags.atol, where=where):
            return False
        offset += size
    return True
