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
    masks: list[int] = []
    groups: list[list[int]] = []
    for k, rows in enumerate(_row_sets(pattern.detach().to("cpu", torch.bool))):
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


_BITS = 62
"""Rows per int64 word of _row_sets (below the sign bit)."""


def _row_sets(pattern: torch.Tensor) -> list[int]:
    """Per column of a bool (rows, columns) pattern, its nonzero rows as the bits of a Python int."""
    rows = pattern.shape[0]
    powers = torch.ones(_BITS, dtype=torch.int64).bitwise_left_shift_(torch.arange(_BITS))
    words = []
    for start in range(0, rows, _BITS):
        part = pattern[start : start + _BITS].to(torch.int64)
        words.append((part * powers[: part.shape[0]].unsqueeze(1)).sum(dim=0).tolist())
    sets = [0] * pattern.shape[1]
    for w, values in enumerate(words):
        shift = w * _BITS
        for k, value in enumerate(values):
            sets[k] |= value << shift
    return sets


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
    ev = ctx.evaluator
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
    a = torch.cat([r.to(rows[0].dtype) for r in rows], dim=1)  # (m, n): every input's columns side by side
    groups = column_groups(a != 0, most)
    count = len(groups) if groups is not None else most
    by_groups = route.grouped_differences(count, columns, len(diff))
    if by_groups is None:
        raise Fallback(
            f"finite differences cannot be batched: {columns} columns, one call pair each, in "
            f"{count} groups, where the caller allows {route.loop_columns(len(diff))}",
            loops=True,
            projections=True,
        )
    if not by_groups:
        compare_rows(numerical_jacobian(ctx, call.func, call.inputs, call.func_out), rows)
        ev.stats.auto_paths.append("full")
        return
    try:
        agrees = _groups_agree(ctx, call, a, groups or [])
    except InputWritten as e:  # torch's column loop shows what that does to its differences
        raise Fallback(str(e), loops=True) from e
    if not agrees:
        # the step-by-step full check decides, column by column, and localizes it: the projections'
        # random directions could pass what the weights told apart
        raise Fallback("backward disagrees with grouped finite differences", loops=True)
    ev.stats.auto_paths.append("full (grouped finite differences)")


def _groups_agree(ctx: CheckContext, call: Call, a: torch.Tensor, groups: list[list[int]]) -> bool:
    """One call pair per group and weighting, each column k of the group moved by eps·w_k; whether
    every row agrees with backward's one entry in the group (a: backward's rows (m, n), every
    differentiable input's columns side by side)."""
    flags = ctx.flags
    data = [call.inputs[idx].data for idx in diff_input_indices(call.inputs)]
    starts = [0]
    for x in data:
        starts.append(starts[-1] + x.numel())
    spans = list(zip(starts, starts[1:]))
    n = starts[-1]
    group_of = [0] * n
    for g, members in enumerate(groups):
        for k in members:
            group_of[k] = g
    in_group = torch.tensor(group_of).unsqueeze(0) == torch.arange(len(groups)).unsqueeze(1)  # (groups, n)
    touched = [[any(lo <= k < hi for k in members) for lo, hi in spans] for members in groups]
    diffs = Differences(ctx.evaluator, call.func, call.inputs, flags.eps)
    generator = torch.Generator().manual_seed(aux_checks.SEED)
    weights, differences = [], []
    for _ in range(route.GROUP_WEIGHTINGS):
        w = torch.rand(n, generator=generator, dtype=torch.float64).mul_(0.5).add_(0.5)
        weights.append(w)
        deltas = in_group * (w * flags.eps)  # per group, every column's move
        per_input = [deltas[:, lo:hi].to(dtype=x.dtype, device=x.device) for x, (lo, hi) in zip(data, spans)]
        for g, inputs_moved in enumerate(touched):
            moves = [(x, p[g].view(x.shape)) for x, p, t in zip(data, per_input, inputs_moved) if t]
            d = diffs.along_parts(moves, unwritten=True)
            differences.append(torch.cat([c.reshape(-1) for c in d]))
    # Per row and group: backward's one entry in the group (zero where it has none), its weight,
    # and whether it has one; a sum over the group has at most one nonzero term.
    dtype = torch.promote_types(a.dtype, torch.float64) if a.dtype.is_floating_point else torch.float64
    a64 = a.detach().to(dtype=dtype, device="cpu")
    groups_t = in_group.t().to(dtype)  # (n, groups)
    nonzero = (a64 != 0).to(dtype)
    entry = torch.where(a64 != 0, a64, 0.0) @ groups_t
    owned = (nonzero @ groups_t) > 0
    numerical = torch.stack(differences).to(dtype=dtype, device="cpu")  # (weightings * groups, m)
    numerical = numerical.view(route.GROUP_WEIGHTINGS, len(groups), -1).permute(2, 0, 1)
    scale = torch.stack([torch.where(owned, (nonzero * w) @ groups_t, 1.0) for w in weights], dim=1)
    numerical = numerical / scale
    expected = entry.unsqueeze(1).expand_as(numerical)
    if len(call.outputs) == len(data) == 1:
        where = BACKWARD.block(0, 0).named(ctx)
        return allclose_promoted(expected.reshape(-1), numerical.reshape(-1), flags.rtol, flags.atol, where=where)
    # block by block (output i, the input j of the entry's column), as the margins name them; a row
    # without an entry in the group counts as the first input's
    offset = 0
    for i, o in enumerate(call.outputs):
        part = slice(offset, offset + o.numel())
        for j, (lo, hi) in enumerate(spans):
            mine = (nonzero[part, lo:hi] @ groups_t[lo:hi]) > 0
            if j == 0:
                mine |= ~owned[part]
            mask = mine.unsqueeze(1).expand_as(numerical[part])
            if mask.any():
                where = BACKWARD.block(i, j).named(ctx)
                a_ij, n_ij = expected[part][mask], numerical[part][mask]
                if not allclose_promoted(a_ij, n_ij, flags.rtol, flags.atol, where=where):
                    return False
        offset += o.numel()
    return True
