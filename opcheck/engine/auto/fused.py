"""The full check and its side checks folded into few calls.

fast_mode="auto" runs it up to route.FULL_CHECK_ELEMENTS input and output elements, and within the
budget after a projection pass (fused_projected.py) that did not pass the call; fast_mode=False
runs it first within the default budget (route.full_mode_fused), the step-by-step full check
deciding what it does not pass.

Run step by step (modes.full.full_check, then aux_checks), one gradcheck call costs about a dozen
separate evaluations: the vmapped finite differences and a plain probe call, two batched passes of
VJP rows (the second only to test reentrancy) and a plain probe, a vmapped and two plain VJPs for
the batched-gradient check, a VJP with zero grad_outputs, the undefined-grad_output pass. On
small inputs each costs more in Python than in kernels, so the step-by-step full check costs
more than torch's fast mode although both compute little. The fused pass computes the same
entries with fewer calls:

- **Finite differences**: every column of every input in one vmapped call (per input beyond
  batching.settings.FUSE_MAX_COLUMNS columns), plus one unperturbed row compared with the plain output
  already computed; no plain probe call. With forward AD checked, the same call also gives the
  JVP columns (rows x ± eps e_k carry zero tangents, rows x the tangent e_k; the rows enter
  torch.func.vmap as dual tensors, passes.jvps_at_points); with the batched forward-AD check on,
  one legacy-vmap call of make_dual gives them instead (that check's own machinery; the vmapped
  dual rows where the legacy vmap cannot run the function). Either way one plain
  JVP along a dense random direction must agree with the same combination of the columns.
- **VJP rows**: one batched backward over all outputs at once. Its cotangents are the one-hot rows
  of every output element (the Jacobian), then, per output, the first random cotangent of the
  step-by-step batched-gradient check, then an all-zero row. From FUNCTORCH_ROWS rows on it is
  torch.func's vmapped pullback (batching rules for backward kernels the legacy vmap runs row by
  row), else the legacy batched backward (is_grads_batched); with the batched-gradient check on
  and torch.func's rows, one more legacy call over the random rows keeps that check about the
  legacy vmap. Rows whose random row disagrees with the plain backward are not trusted: torch.func's
  give way to the legacy ones (torch 2.13's vmap over cdist's backward is wrong where rows
  differ), the legacy ones to the step-by-step check.
- **Plain VJPs**, two per output, along that random cotangent: the two must be identical up to
  nondet_tol (reentrancy, as torch's fast mode tests it), and equal to its batched row
  (torch.allclose's defaults, as the batched-gradient check compares; with that check off, up to
  reassociation). A random cotangent weighs every row, so a plain backward that differs from the
  batched one anywhere shows, where a one-hot probe sees one row.
- **Zero grad_output**: the all-zero batched row must be zero (exactly, or allclose when masked).
- **Undefined grad_output**: the outputs already computed are wrapped in UndefinedGrad instead of
  calling the function again (with several outputs, the per-output passes call it as torch does).
- **Forward AD's side checks**: the batched forward-AD check compares its vmapped JVPs with the
  fused columns instead of one plain JVP per tangent; the undefined-tangent check runs as in the
  step-by-step check, except with one differentiable input, where its undefined-tangent call has
  no dual input, so no output has a tangent to compare and the check cannot fail.

Every Jacobian entry is compared with its finite difference at the full check's tolerance, as in
the step-by-step check. The pass decides only a pass: when anything in it disagrees, raises, or
does not apply (complex or sparse inputs, non-tensor outputs, an output that does not require
grad, more rows than fit the memory budget, batching off), the call runs the step-by-step check
from the start, so a failure, its wording and its order are the step-by-step check's; where a
batched result disagreed with a plain call, that rerun does without that batching (Fallback's
`distrust`), so torch's one-at-a-time algorithm decides. What the fused pass tests differently: reentrancy on one
random combination of rows per output (torch's fast mode does the same; the step-by-step full
check compares two batched passes of every row), and the zero-grad_output test on the batched
backward (a plain backward that differs from the batched one disagrees with its batched row and
sends the call to the step-by-step check).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from opcheck.engine import aux_checks
from opcheck.engine._util import (
    Inputs,
    allclose_promoted,
    as_tuple,
    detached,
    diff_input_indices,
    float_outputs,
    legacy_vmap,
)
from opcheck.engine.auto.fused_backward import batched_backward
from opcheck.engine.auto.grouped import grouped_check, groups_apply
from opcheck.engine.auto.passes import (
    Fallback,
    applies,
    jvps_at_points,
    legacy_jvps,
    only_a_pass,
    outputs_at_points,
    outputs_once,
    plain_jvp,
    real_call,
    tied_to_plain,
)
from opcheck.engine.batching import (
    LoopOverBudget,
    close,
    difference_quotient,
    settings,
)
from opcheck.engine.comparison.compare import BACKWARD, FORWARD
from opcheck.engine.context import Blocks, Call, CheckContext
from opcheck.engine.errors import GradcheckError
from opcheck.engine.evaluation.numerical import numerical_jacobian
from opcheck.engine.route import loop_columns

__all__ = ["Fallback", "fused_check"]


def fused_check(ctx: CheckContext, call: Call) -> None:
    """Every check of one gradcheck call (those ctx.flags ask for), fused; returns when all pass,
    raises Fallback otherwise.

    Complex outputs are checked as torch.view_as_real (..., 2): the Jacobian of that view holds the
    step-by-step check's real-part and imaginary-part blocks side by side.
    """
    flags, ev = ctx.flags, ctx.evaluator
    func, inputs, func_out, outputs = call.func, call.inputs, call.func_out, call.outputs
    real, has_complex = real_call(call)
    applies(ctx, real)
    with ev.fused_pass(legacy_jvp_first=flags.check_batched_forward_grad), only_a_pass():
        try:
            numerical, analytical, batched_forward_checked = _jacobians(ctx, real)
        except LoopOverBudget:  # columns that cannot be batched, by groups (backward alone)
            grouped_check(ctx, real, lambda numerical, rows: _compare_rows(ctx, real, numerical, rows))
            numerical, analytical, batched_forward_checked = [], [], False
        else:
            if flags.check_backward_ad:
                _backward(ctx, real, numerical)
                ev.stats.auto_paths.append("full")
        if flags.check_forward_ad:
            _compare_forward(ctx, numerical, analytical)
            ev.stats.auto_paths.append("full")
            if flags.check_undefined_grad and len(diff_input_indices(inputs)) > 1:
                # With one differentiable input the undefined-tangent call has no dual input, so no
                # output has a tangent to compare: the check cannot fail, and is not run.
                zero_tangent = None if has_complex else _zero_tangent_jvps(analytical)
                aux_checks.check_undefined_forward_mode(ctx, func, outputs, inputs, zero_tangent)
        if flags.check_batched_forward_grad and not batched_forward_checked:
            expected = None if has_complex else _expected_jvps(inputs, func_out, analytical)
            aux_checks.check_batched_grad_forward_ad(ctx, func, inputs, expected)
        if flags.check_backward_ad and flags.check_undefined_grad:
            aux_checks.check_undefined_backward_mode(ctx, outputs_once(func, func_out), outputs, inputs)
    ev.stats.fused = True


def _jacobians(ctx: CheckContext, call: Call) -> tuple[Blocks, Blocks, bool]:
    """The numerical Jacobian and, with forward AD checked, the forward-AD one (else empty); and
    whether the latter's columns came from the legacy vmap (the batched forward-AD check's machinery)."""
    flags, func, inputs, func_out = ctx.flags, call.func, call.inputs, call.func_out
    if flags.check_forward_ad and _fits_one_call(inputs):
        # With the batched forward-AD check on, the columns come from the legacy vmap, that check's
        # own machinery (where this torch has it), tied to a plain JVP like torch.func's.
        legacy = flags.check_batched_forward_grad
        if not legacy or legacy_vmap is not None:
            return _forward_jacobians(ctx, call, legacy)
    numerical = _numerical(ctx, call)  # [input][output] (n_j, m_i)
    if not flags.check_forward_ad:
        return numerical, [], False
    # With the batched forward-AD check on, the columns come from the legacy vmap, that check's own
    # machinery, probed by a plain JVP along a dense direction: vmapped against one at a time is
    # then tested, on every column.
    from opcheck.engine.evaluation.analytical import analytical_jvp_jacobian  # forward AD's: on first use

    analytical = analytical_jvp_jacobian(ctx, func, inputs, func_out)
    return numerical, analytical, ctx.evaluator.jvp_kind_used == "jvp"


def _numerical(ctx: CheckContext, call: Call) -> Blocks:
    """The numerical Jacobian, where its columns can be batched or are few enough to loop over.

    Without vmap support each column is two plain calls, and beyond route.loop_columns the
    step-by-step projections, a call pair per direction, go first.
    """
    ev = ctx.evaluator
    grouped = groups_apply(ctx, call)  # the columns go to grouped_check instead of the loop
    ev.loop_columns = 0 if grouped else loop_columns(len(diff_input_indices(call.inputs)), auto=ctx.flags.auto)
    try:
        return numerical_jacobian(ctx, call.func, call.inputs, call.func_out)
    except LoopOverBudget as e:
        if grouped:  # fused_check takes them, by groups of columns or by the loop
            raise
        raise Fallback(f"finite differences cannot be batched: {e}", loops=True, projections=True) from e
    finally:
        ev.loop_columns = None


def _compare_forward(ctx: CheckContext, numerical: Blocks, analytical: Blocks) -> None:
    for j, per_output in enumerate(numerical):
        for i, n in enumerate(per_output):
            where = FORWARD.block(i, j).named(ctx)
            if not allclose_promoted(analytical[j][i], n, ctx.flags.rtol, ctx.flags.atol, where=where):
                raise Fallback(f"forward AD: output {i}, input {j} disagrees with finite differences")


def _fits_one_call(inputs: Inputs) -> bool:
    n = sum(int(inputs[j].numel()) for j in diff_input_indices(inputs))
    return 0 < n <= settings.FUSE_MAX_COLUMNS


def _forward_jacobians(ctx: CheckContext, call: Call, legacy: bool) -> tuple[Blocks, Blocks, bool]:
    """Finite differences and forward-AD columns in one or two vmapped calls.

    Rows x - eps e_k and x + eps e_k give the central differences, rows x with the tangent e_k the
    columns J e_k: all from one vmapped call on dual tensors (passes.jvps_at_points; the perturbed
    rows carry zero tangents), or with `legacy` the perturbed rows from a vmapped call of the
    function and the tangents from make_dual under the legacy vmap (as torch's batched forward-AD
    check computes them; where it cannot run the function, jvps_at_points gives them). One plain
    JVP along a dense random direction must agree with the same combination of the batched columns,
    and the plain output with the unperturbed row. Returns ([input][output] numerical, same
    analytical, whether the columns came from the legacy vmap).
    """
    ev, eps, func, inputs = ctx.evaluator, ctx.flags.eps, call.func, call.inputs
    diff = diff_input_indices(inputs)
    base = detached(inputs)
    sizes = [inputs[j].numel() for j in diff]
    n = sum(sizes)
    deltas, tangents = _one_hot_rows(base, diff, sizes, eps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if legacy:
            outs, columns, legacy = _legacy_rows(ctx, call, base, diff, deltas, tangents, n)
        else:
            points = [base[j] + d for j, d in zip(diff, deltas)]
            outs, touts = jvps_at_points(ev, func, base, diff, points, tangents)
            columns = tuple(t[2 * n :] for t in touts)
    refs = float_outputs(call.func_out)
    if len(outs) != len(refs) or len(columns) != len(refs):
        raise Fallback("number of outputs changed under vmap")
    numerical: list[list[torch.Tensor]] = [[] for _ in diff]
    analytical: list[list[torch.Tensor]] = [[] for _ in diff]
    g = torch.Generator().manual_seed(aux_checks.SEED)
    u = torch.randn(n, generator=g, dtype=torch.float64).to(dtype=base[diff[0]].dtype)
    plain = plain_jvp(ev, func, inputs, diff, sizes, u)
    for o, ref, to, po in zip(outs, refs, columns, plain):
        if o.shape[1:] != ref.shape or o.dtype != ref.dtype or to.shape[1:] != ref.shape or to.dtype != ref.dtype:
            raise Fallback("output shape or dtype changed under vmap")
        if not close(o[2 * n], ref.detach()):
            raise Fallback("vmapped evaluation at the unperturbed point differs from the plain call", ("forward",))
        fd = difference_quotient(o[:n], o[n : 2 * n], eps).reshape(n, ref.numel())
        cols = to.reshape(n, ref.numel())
        if not tied_to_plain(ctx, u, cols, po):
            raise Fallback("batched JVP differs from the plain JVP", ("jvp",) if legacy else ("jvp_func", "jvp"))
        offset = 0
        for jj, size in enumerate(sizes):
            numerical[jj].append(fd[offset : offset + size])
            analytical[jj].append(cols[offset : offset + size])
            offset += size
    return [tuple(b) for b in numerical], [tuple(b) for b in analytical], legacy


def _legacy_rows(
    ctx: CheckContext,
    call: Call,
    base: list[Any],
    diff: list[int],
    deltas: list[torch.Tensor],
    tangents: list[torch.Tensor],
    n: int,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], bool]:
    """The function's float outputs at base + the first 2n + 1 rows of deltas (one torch.func.vmap
    call), and the tangents of the last n rows of `tangents` from make_dual under the legacy vmap
    (every tangent's dtype checked, ctx.check_forward_dtype); where the legacy vmap raises, from
    passes.jvps_at_points. Returns (outputs, tangents, whether the legacy vmap gave them)."""
    from opcheck.engine.batching.jvp_columns import ForwardCalls  # forward AD's: on first use

    ev = ctx.evaluator
    outs = outputs_at_points(ev, call.func, base, diff, *(d[: 2 * n + 1] for d in deltas))
    calls = ForwardCalls(ev, call.func, call.inputs, ctx.check_forward_dtype)
    try:
        return as_tuple(outs), legacy_jvps(ev, calls, diff, *(t[2 * n :] for t in tangents)), True
    except GradcheckError:
        raise
    except Exception as e:  # noqa: BLE001 - the legacy vmap cannot run it: torch.func.vmap's columns
        ev.give_up("jvp", e)
    points = [base[j] + d[2 * n :] for j, d in zip(diff, deltas)]
    _, touts = jvps_at_points(ev, call.func, base, diff, points, [t[2 * n :] for t in tangents])
    return as_tuple(outs), touts, False


def _one_hot_rows(
    base: list[Any], diff: list[int], sizes: list[int], eps: float
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per input, the 3n rows' perturbations (-eps, then +eps, on the diagonal of its block of
    columns; x + (-eps) is x - eps exactly) and tangents (e_k in the last n rows)."""
    n = sum(sizes)
    deltas, tangents = [], []
    offset = 0
    for j, size in zip(diff, sizes):
        d = base[j].new_zeros((3 * n, size))
        t = base[j].new_zeros((3 * n, size))
        d[offset : offset + size].diagonal().fill_(-eps)
        d[n + offset : n + offset + size].diagonal().fill_(eps)
        t[2 * n + offset : 2 * n + offset + size].diagonal().fill_(1)
        deltas.append(d.view(3 * n, *base[j].shape))
        tangents.append(t.view(3 * n, *base[j].shape))
        offset += size
    return deltas, tangents


def _expected_jvps(inputs: Inputs, func_out: tuple[Any, ...], analytical: Blocks) -> aux_checks.ExpectedJvps:
    """The batched forward-AD check's one-at-a-time JVPs, from the fused pass's columns.

    Those columns agree with a plain JVP along a dense direction up to rounding; an output without
    a tangent, and a non-float one, has zeros, as that check's JVP function returns.
    """
    position = {j: jj for jj, j in enumerate(diff_input_indices(inputs))}

    def expected(input_idx: int, tangents: list[torch.Tensor]) -> list[torch.Tensor]:
        t = torch.stack(tangents).reshape(len(tangents), -1)
        cols = analytical[position[input_idx]]
        result = []
        for i, o in enumerate(func_out):
            if i < len(cols):
                result.append((t.to(cols[i].dtype) @ cols[i]).reshape(len(tangents), *o.shape))
            else:
                result.append(torch.zeros((len(tangents), *o.shape), dtype=o.dtype, device=o.device))
        return result

    return expected


def _zero_tangent_jvps(analytical: Blocks) -> aux_checks.ZeroTangentJvps:
    """The undefined-tangent check's zero-tangent JVPs, from the fused pass's columns: J·u with the
    k-th input's part of u zeroed, per float output (flat)."""

    def jvps(k: int, all_u: list[Any]) -> list[Any]:
        n_out = len(analytical[0]) if analytical else 0
        return [
            sum(all_u[jj].to(analytical[jj][i].dtype) @ analytical[jj][i] for jj in range(len(all_u)) if jj != k)
            for i in range(n_out)
        ]

    return jvps


def _backward(ctx: CheckContext, call: Call, numerical: Blocks) -> None:
    """The Jacobian rows (one-hot cotangents) and the side checks, in one batched backward."""
    _compare_rows(ctx, call, numerical, batched_backward(ctx, call, [None] * len(call.outputs)))


def _compare_rows(ctx: CheckContext, call: Call, numerical: Blocks, flat: list[torch.Tensor]) -> None:
    """Backward's rows (per input, output by output) against the finite differences' columns."""
    # numerical holds every float output's differences; backward's rows, those that require grad
    grad_positions = [q for q, o in enumerate(float_outputs(call.func_out)) if o.requires_grad]
    for j, f in enumerate(flat):
        offset = 0
        for i, (o, q) in enumerate(zip(call.outputs, grad_positions)):
            size = o.numel()
            a, where = f[offset : offset + size].t(), BACKWARD.block(i, j).named(ctx)
            if not allclose_promoted(a, numerical[j][q], ctx.flags.rtol, ctx.flags.atol, where=where):
                raise Fallback(f"backward: output {i}, input {j} disagrees with finite differences")
            offset += size
