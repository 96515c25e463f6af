"""fast_mode="auto" on larger Jacobians: the projection check and its side checks folded into few calls.

The full check needs one evaluation per Jacobian column and one backward row per output element,
so from a few hundred entries on it costs more than torch's fast mode, whose handful of calls do
not grow with the input. This pass runs the projection check of opcheck.engine.auto.stepwise instead (per
differentiable input j, k = projections.DIRECTIONS Rademacher directions U_j; per output, k' =
projections.COTANGENTS Rademacher cotangents V_i; the same comparisons, at the same tolerances), in about
as many calls as torch's fast mode:

- **Two vmapped calls** give the finite differences and J·U: one of the function at x and at
  x ± eps u (the central differences along u; the row at x is compared with the plain output), one
  on dual tensors at x with the tangents u (passes.jvps_at_points; their tangents are J·u). Apart,
  neither call carries rows it does not need: on a large input the rows' copies, not the calls,
  are the cost. With the batched forward-AD check on, J·U comes instead from the legacy vmap (that
  check's own machinery). When forward AD is checked, one plain JVP along a dense random
  combination of the directions must agree with the same combination of the batched rows. In the
  backward check forward AD is only a tool: where it is missing, J·U comes from the VJP of the VJP
  (backward differentiated in its grad_output), and where backward has no derivative either (a
  kernel registered with a backward alone), from backward's rows reduced against U: m backward
  rows, fewer than the full check's.
- **JVP stage**: every (J·U)[output element, direction] against its finite difference, entrywise,
  at atol + rtol * |numerical|.
- **One batched backward** (fused_backward.batched_backward) over V, per output the batched-gradient check's
  random cotangent and an all-zero row, with two plain backward passes along that random cotangent
  (reentrancy, batched against plain).
- **VJP stage**: (Jᵀv)·u against vᵀ(Ju) for every pair, at the rounding bound (projections.vjp_jvp_pairs).
- **JᵀV stage**, instead of J·U from backward's rows and the VJP stage, where the 2n rows of the
  finite differences of every column cost less than backward's m rows (timed per row on the pass's
  two batched calls; the legacy batched backward may run its kernel one row at a time):
  the batched backward's JᵀV against the finite differences of every column (one vmapped call of
  2n rows), entrywise for every input element and cotangent, at atol + rtol * |numerical|.
- **Undefined tangent / grad_output**: the zero-tangent JVPs of the undefined-tangent check are extra
  rows of the vmapped call; the undefined-grad_output check reuses the outputs already computed.

As fused.py's pass, this one only decides a pass: a disagreement, an exception, or a case it does
not cover (complex or sparse inputs, more rows than fit the memory budget, ...) raises
passes.Fallback, and the caller goes on with the full check (within the Jacobian budget, where it
is the verdict) or the step-by-step projection check (beyond it), which say what is wrong. A
function that cannot be vmapped (Fallback.loops), and one with complex inputs that the passes did
not take through their real views, goes to the step-by-step projections first even within the
budget, since they run a handful of calls where the full check runs two per column; a failure
there is again the full check's to decide.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from opcheck.engine import aux_checks
from opcheck.engine._util import (
    Func,
    Inputs,
    allclose_promoted,
    autograd_grad,
    batched_grad,
    detached,
    diff_input_indices,
    exception_line,
    float_outputs,
    legacy_vmap,
    requires_grad,
)
from opcheck.engine.auto.fused_backward import batched_backward
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
from opcheck.engine.auto.projections import SEED, rademacher, vjp_jvp_pairs
from opcheck.engine.auto.sources import Projection, rows_along
from opcheck.engine.batching import ForwardCalls, close, difference_quotient
from opcheck.engine.comparison.compare import BACKWARD, FORWARD, Part
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.evaluation.numerical import numerical_jacobian
from opcheck.engine.modes.fast import make_vectors, real_direction
from opcheck.engine.route import COTANGENTS, DIRECTIONS

__all__ = ["projected_check"]

PerInputOutput = list[list[torch.Tensor]]
"""[input][output] (k, m) projections."""


def projected_check(ctx: CheckContext, call: Call) -> None:
    """Every check of one gradcheck call (those ctx.flags ask for), projected and fused; returns
    when all pass, raises Fallback."""
    flags, ev = ctx.flags, ctx.evaluator
    func, inputs, func_out, outputs = call.func, call.inputs, call.func_out, call.outputs
    real, has_complex = real_call(call)
    applies(ctx, real, projected=True)
    diff = diff_input_indices(inputs)
    g = torch.Generator().manual_seed(SEED)
    directions = [rademacher((DIRECTIONS, *inputs[j].shape), inputs[j], g) for j in diff]
    cotangents = [rademacher((COTANGENTS, *o.shape), o, g) for o in real.outputs]
    zero_tangent_rows = flags.check_forward_ad and flags.check_undefined_grad and len(diff) > 1 and not has_complex
    with only_a_pass():
        rows = _ForwardRows(ctx, real.func, inputs, directions, zero_tangent_rows)
        fd, ju, zero_tangent = rows.run(real.func_out, flags.check_forward_ad, flags.check_batched_forward_grad)
        source, grads = "J·U from forward AD", None
        if ju is None:  # forward AD is missing (only backward is checked): backward gives J·U
            grads = batched_backward(ctx, real, cotangents, timed=True)
            ju, source = _jvp_from_backward(ctx, real, diff, directions, cotangents, fd, rows.row_seconds)
        checked = FORWARD if grads is None and flags.check_forward_ad else BACKWARD  # forward AD: a tool otherwise
        if ju is not None and not _agrees(ctx, ju, fd, checked, source):
            raise Fallback(f"{source} disagrees with finite differences")
        if flags.check_backward_ad:
            if grads is None:
                grads = batched_backward(ctx, real, cotangents)
            if ju is None:
                _column_stage(ctx, real, diff, grads, cotangents)
            else:
                _vjp_stage(ctx, diff, grads, ju, directions, cotangents)
            ev.stats.auto_paths.append(f"projected ({source}, fused)")
        if flags.check_forward_ad:
            ev.stats.auto_paths.append("projected (J·U from forward AD, fused)")
            if flags.check_undefined_grad and len(diff) > 1:
                aux_checks.check_undefined_forward_mode(ctx, func, outputs, inputs, zero_tangent)
        if flags.check_backward_ad and flags.check_undefined_grad:
            aux_checks.check_undefined_backward_mode(ctx, outputs_once(func, func_out), outputs, inputs)
    ev.stats.fused = True


def _vjp_stage(
    ctx: CheckContext,
    diff: list[int],
    grads: list[torch.Tensor],
    ju: PerInputOutput,
    directions: list[torch.Tensor],
    cotangents: list[torch.Tensor],
) -> None:
    """(Jᵀv)·u against vᵀ(Ju) for every pair, at the rounding bound."""
    for jj, rows in enumerate(grads):
        u = directions[jj].reshape(DIRECTIONS, -1)
        for i, v in enumerate(cotangents):
            g_i = rows[i * COTANGENTS : (i + 1) * COTANGENTS]
            *_, bad = vjp_jvp_pairs(v.reshape(COTANGENTS, -1), ju[jj][i], g_i, u, ctx.flags.nondet_tol)
            if bool(bad.any()):
                raise Fallback(f"VJP stage: output {i}, input {diff[jj]}: JᵀV disagrees with J·U")


ZeroTangent = aux_checks.ZeroTangentJvps


class _ForwardRows:
    """The rows of the pass's two vmapped calls: x, then per input x ∓ eps u for its k directions
    (the central differences); and x with the tangents u (their tangents are J·u), with the
    undefined-tangent check the extra rows of its directions."""

    def __init__(
        self, ctx: CheckContext, func: Func, inputs: Inputs, directions: list[torch.Tensor], zero_tangent_rows: bool
    ):
        self.ctx, self.func, self.inputs = ctx, func, inputs
        self.diff = diff = diff_input_indices(inputs)
        self.base = base = detached(inputs)
        self.sizes = sizes = [inputs[j].numel() for j in diff]
        self.zero_tangent_rows = zero_tangent_rows
        k, n_inputs, eps = DIRECTIONS, len(diff), ctx.flags.eps
        # Tangent rows (flat over every differentiable input): k per input along its directions, then
        # per input the undefined-tangent check's direction with that input's part zeroed.
        dense = [d.reshape(k, -1) for d in directions]
        if n_inputs == 1:
            tangents = dense
        else:
            tangents = [base[j].new_zeros((k * n_inputs, size)) for j, size in zip(diff, sizes)]
            for jj in range(n_inputs):
                tangents[jj][jj * k : (jj + 1) * k] = dense[jj]
        if zero_tangent_rows:
            _, all_u = make_vectors([inputs[j] for j in diff], None, use_forward_ad=True)
            extra = [base[j].new_zeros((n_inputs, size)) for j, size in zip(diff, sizes)]
            for row in range(n_inputs):
                for jj in range(n_inputs):
                    if jj != row:
                        extra[jj][row] = real_direction(all_u[jj]).reshape(-1)
            tangents = [torch.cat([t, e]) for t, e in zip(tangents, extra)]
        self.tangents, self.t_rows = tangents, tangents[0].shape[0]
        # Evaluated rows: x itself, then per input x - eps u for its k directions, then x + eps u.
        deltas = [base[j].new_zeros((1 + 2 * k * n_inputs, size)) for j, size in zip(diff, sizes)]
        for jj in range(n_inputs):
            torch.mul(dense[jj], -eps, out=deltas[jj][1 + jj * k : 1 + (jj + 1) * k])
            torch.mul(dense[jj], eps, out=deltas[jj][1 + (n_inputs + jj) * k : 1 + (n_inputs + jj + 1) * k])
        self.deltas, self.p_rows = deltas, 2 * k * n_inputs
        self.row_seconds = 0.0  # seconds per row of the vmapped evaluation (run)

    def shaped(self, rows: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per input, its (rows, numel) block as (rows, *shape)."""
        return [t.view(t.shape[0], *self.base[j].shape) for j, t in zip(self.diff, rows)]

    def run(
        self, func_out: tuple[Any, ...], tie: bool, legacy: bool
    ) -> tuple[PerInputOutput, PerInputOutput | None, ZeroTangent | None]:
        """Central differences and J·U along the directions: ([input][output] (k, m) each, zero_tangent).

        zero_tangent: the undefined-tangent check's JVPs (check_undefined_forward_mode's hook), from
        extra rows, or None. tie: forward AD is what is checked, so the batched JVP rows must agree
        with a plain JVP along a dense combination of them. legacy: J·U from the legacy vmap (the
        batched forward-AD check's machinery), the finite differences from a call of their own.
        """
        ev = self.ctx.evaluator
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                outs, seconds = ev.timed(
                    outputs_at_points, ev, self.func, self.base, self.diff, *self.shaped(self.deltas)
                )
                self.row_seconds = seconds / (1 + self.p_rows)
            except Exception as e:  # the function one call at a time
                raise Fallback(f"under vmap: {exception_line(e)}", loops=True) from e
            touts = self._jvps(tie, legacy)
        centers, primals = [o[0] for o in outs], [o[1:] for o in outs]
        floats_ = float_outputs(func_out)
        if len(primals) != len(floats_) or (touts is not None and len(touts) != len(floats_)):
            raise Fallback("number of outputs changed under vmap")
        for o, c, ref in zip(primals, centers, floats_):
            if o.shape[1:] != ref.shape or o.dtype != ref.dtype:
                raise Fallback("output shape or dtype changed under vmap")
            if not close(c, ref.detach()):
                raise Fallback("vmapped evaluation at the unperturbed point differs from the plain call", ("forward",))
        fd = self._differences(primals)
        if touts is None:
            return fd, None, None
        return (fd, *self._tangent_rows(touts, floats_, tie))

    def _jvps(self, tie: bool, legacy: bool) -> tuple[torch.Tensor, ...] | None:
        """J·U at x, one row per tangent: from make_dual under the legacy vmap with `legacy`, else
        from dual tensors under torch.func.vmap (passes.jvps_at_points). None where that fails and
        forward AD is only a tool (the caller takes J·U from backward)."""
        ev, base, diff = self.ctx.evaluator, self.base, self.diff
        try:
            if legacy:
                if legacy_vmap is None:  # pragma: no cover - depends on the torch release
                    return None
                calls = ForwardCalls(ev, self.func, self.inputs, _any_dtype)
                return legacy_jvps(ev, calls, diff, *self.shaped(self.tangents))
            # x once per row, a copy of its own: the function may write into its inputs.
            points = [base[j].expand(self.t_rows, *base[j].shape).clone() for j in diff]
            return jvps_at_points(ev, self.func, base, diff, points, self.shaped(self.tangents))[1]
        except Exception as e:
            if tie or legacy:  # forward AD is what is checked: its columns would run one at a time
                raise Fallback(f"forward AD under vmap: {exception_line(e)}", loops=True) from e
            return None

    def _differences(self, primals: list[torch.Tensor]) -> PerInputOutput:
        k, n_inputs, eps = DIRECTIONS, len(self.diff), self.ctx.flags.eps
        fd: PerInputOutput = [[] for _ in self.diff]
        for o in primals:
            o = o.reshape(self.p_rows, -1)
            for jj in range(n_inputs):
                minus, plus = o[jj * k : (jj + 1) * k], o[(n_inputs + jj) * k : (n_inputs + jj + 1) * k]
                fd[jj].append(difference_quotient(minus, plus, eps))
        return fd

    def _tangent_rows(
        self, touts: tuple[torch.Tensor, ...], floats_: list[torch.Tensor], tie: bool
    ) -> tuple[PerInputOutput, ZeroTangent | None]:
        """J·U from the tangent rows (tied to a plain JVP when forward AD is checked), and the
        undefined-tangent check's hook where its rows are there."""
        for t, ref in zip(touts, floats_):
            if t.shape[1:] != ref.shape or t.dtype != ref.dtype:
                raise Fallback("tangent shape or dtype differs from its output's under vmap")
        flat_t = [t.reshape(self.t_rows, -1) for t in touts]
        if tie:
            w = torch.randn(self.t_rows, generator=torch.Generator().manual_seed(SEED + 1), dtype=torch.float64)
            u = torch.cat([(w.to(t.dtype) @ t) for t in self.tangents])
            plain = plain_jvp(self.ctx.evaluator, self.func, self.inputs, self.diff, self.sizes, u)
            for rows, po in zip(flat_t, plain):
                if not tied_to_plain(self.ctx, w, rows, po):
                    raise Fallback("batched JVP differs from the plain JVP", ("jvp_func", "jvp"))
        k, n_inputs = DIRECTIONS, len(self.diff)
        ju = [[t[jj * k : (jj + 1) * k] for t in flat_t] for jj in range(n_inputs)]
        if not self.zero_tangent_rows:
            return ju, None

        def zero_tangent(row: int, _all_u: list[Any]) -> list[Any]:
            return [t[k * n_inputs + row] for t in flat_t]

        return ju, zero_tangent


def _any_dtype(primal: torch.Tensor, tangent: torch.Tensor) -> None:
    """The legacy rows' tangents are compared with finite differences: no dtype check of their own."""


def _agrees(ctx: CheckContext, ju: PerInputOutput, fd: PerInputOutput, part: Part, source: str) -> bool:
    """The JVP stage: every (J·U)[direction, output element] against its finite difference (`part`
    and `source`: what the JVP's margin is named by, the check J·U came from and how)."""
    return all(
        allclose_promoted(ju[jj][i], n, ctx.flags.rtol, ctx.flags.atol, where=part.block(i, jj).named(ctx, source))
        for jj, per_output in enumerate(fd)
        for i, n in enumerate(per_output)
    )


def _jvp_from_backward(
    ctx: CheckContext,
    call: Call,
    diff: list[int],
    directions: list[torch.Tensor],
    cotangents: list[torch.Tensor],
    fd: PerInputOutput,
    forward_row_seconds: float,
) -> tuple[PerInputOutput | None, str]:
    """J·U where forward AD is missing, and its source: the VJP of the VJP; where backward has no
    derivative (it raises, or what it gives disagrees with the finite differences, as a backward
    marked once_differentiable does under vmap), backward's own rows; or None where the finite
    differences of every column cost less than those rows (columns_cost_less, by the seconds per
    row of the pass's vmapped evaluation and of its batched backward)."""
    try:
        ju = _vjp_of_vjp(ctx, call.outputs, call.inputs, directions, cotangents)
        if _agrees(ctx, ju, fd, BACKWARD, "J·U from the VJP of the VJP"):
            return ju, "J·U from the VJP of the VJP"
        why = "disagrees with finite differences"
    except Exception as e:  # noqa: BLE001 - backward has no derivative: its rows give J·U
        why = exception_line(e)
    ctx.evaluator.stats.fallbacks.append(f"projected: J·U from the VJP of the VJP: {why}")
    n, m = sum(call.inputs[j].numel() for j in diff), sum(o.numel() for o in call.outputs)
    backward_row_seconds = ctx.evaluator.backward_row_seconds
    if backward_row_seconds is not None and columns_cost_less(
        n, m, 2 * n * forward_row_seconds, m * backward_row_seconds, ctx.flags.jacobian_budget
    ):
        return None, "JᵀV against finite-difference columns"
    return _jvp_from_rows(ctx, call, diff, directions, cotangents), "J·U from VJP rows"


def columns_cost_less(n: int, m: int, columns_seconds: float, rows_seconds: float, budget: int) -> bool:
    """Whether the finite differences of every column (2n rows of vmapped evaluations) cost less
    than backward's m rows, within the Jacobian budget: where the batched backward runs its kernel
    one row at a time (the legacy vmap has no batching rule for it), a row costs a backward call."""
    return n * m <= budget and columns_seconds < rows_seconds


def _column_stage(
    ctx: CheckContext, call: Call, diff: list[int], grads: list[torch.Tensor], cotangents: list[torch.Tensor]
) -> None:
    """Backward's JᵀV (from the batched backward) against the finite differences' JᵀV, for every
    input element (entrywise) and every cotangent: the finite differences of every column in one
    vmapped call (numerical_jacobian, the full check's), where backward's rows would run one at a
    time. A backward wrong in one row or one input element shows there, as in the JVP stage."""
    ev = ctx.evaluator
    with ev.fused_pass():  # the unperturbed row is compared with the outputs already computed
        numerical = numerical_jacobian(ctx, call.func, call.inputs, call.func_out)
    for jj, rows in enumerate(grads):
        for i, v in enumerate(cotangents):
            block = numerical[jj][i]  # (n_j, m_i): this input's part of Jᵀ for this output
            want = (block @ v.reshape(COTANGENTS, -1).to(block.dtype).t()).t()
            got = rows[i * COTANGENTS : (i + 1) * COTANGENTS]
            where = BACKWARD.block(i, jj).named(ctx, "JᵀV against finite-difference columns")
            if not allclose_promoted(got, want, ctx.flags.rtol, ctx.flags.atol, where=where):
                raise Fallback(f"JᵀV stage: output {i}, input {diff[jj]}: backward disagrees with finite differences")


def _jvp_from_rows(
    ctx: CheckContext, call: Call, diff: list[int], directions: list[torch.Tensor], cotangents: list[torch.Tensor]
) -> PerInputOutput:
    """J·U from backward's rows, where there is neither forward AD nor a derivative of backward (a
    kernel registered with a backward alone): eᵣᵀJ for every output element r, in batches, reduced
    against U (sources.rows_along, the step-by-step check's last source). m backward rows, where the
    full check would add 2n evaluations of the function to the same rows; built from backward
    itself, the JVP stage then checks backward against the finite differences entrywise."""
    positions = list(range(len(call.func_out)))
    return rows_along(Projection(ctx, call, diff, positions, directions, cotangents))


def _vjp_of_vjp(
    ctx: CheckContext,
    outputs: tuple[torch.Tensor, ...],
    inputs: Inputs,
    directions: list[torch.Tensor],
    cotangents: list[torch.Tensor],
) -> PerInputOutput:
    """J·U from backward, where forward AD is missing: g(v) = Jᵀv is linear in v, and the VJP of g
    with cotangent u is J·u. Per input, per output, (k, m); Fallback when backward is not differentiable.

    Built from backward itself, this J·U checks backward against the finite differences (entrywise);
    the VJP stage after it only checks consistency.
    """
    ev = ctx.evaluator
    diff_inputs = [a for a in inputs if requires_grad(a)]
    vs = [v[0].clone().requires_grad_() for v in cotangents]  # any value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grads = autograd_grad(outputs, diff_inputs, vs, create_graph=True)
        ev.stats.vjp_calls += 1
        result = []
        for g, u in zip(grads, directions):
            if g is None:
                result.append([o.new_zeros((DIRECTIONS, o.numel())) for o in outputs])
                continue
            if not g.requires_grad:
                raise Fallback("backward is not differentiable (its result does not require grad)")
            rows = batched_grad([g], vs, [u])
            ev.stats.batched_vjp_calls += 1
            result.append(
                [
                    r.reshape(DIRECTIONS, -1) if r is not None else o.new_zeros((DIRECTIONS, o.numel()))
                    for r, o in zip(rows, outputs)
                ]
            )
    return result
