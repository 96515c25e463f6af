"""fast_mode="auto" on larger Jacobians: the projection check and its side checks folded into few calls.

The full check needs one evaluation per Jacobian column and one backward row per output element,
so from a few hundred entries on it costs more than torch's fast mode, whose handful of calls do
not grow with the input. This pass runs the projection check of opcheck.engine.auto instead (per
differentiable input j, k = auto.DIRECTIONS Rademacher directions U_j; per output, k' =
auto.COTANGENTS Rademacher cotangents V_i; the same comparisons, at the same tolerances), in about
as many calls as torch's fast mode:

- **One vmapped torch.func.jvp** gives the finite differences and J·U: rows x ± eps u carry zero
  tangents (their primals are the central differences along u), rows x carry the tangent u (their
  tangents are J·u, and the first one's primal is the unperturbed output, compared with the plain
  one). With the batched forward-AD check on, J·U comes instead from the legacy vmap (that check's
  own machinery) and the finite differences from a vmapped call of the function. When forward AD is
  checked, one plain JVP along a dense random combination of the directions must agree with the
  same combination of the batched rows. In the backward check forward AD is only a tool: where it
  is missing, J·U comes from the VJP of the VJP (backward differentiated in its grad_output).
- **JVP stage**: every (J·U)[output element, direction] against its finite difference, entrywise,
  at atol + rtol * |numerical|.
- **One batched backward** (fused.batched_backward) over V, per output the batched-gradient check's
  random cotangent and an all-zero row, with two plain backward passes along that random cotangent
  (reentrancy, batched against plain).
- **VJP stage**: (Jᵀv)·u against vᵀ(Ju) for every pair, at the rounding bound (auto.vjp_jvp_pairs).
- **Undefined tangent / grad_output**: the zero-tangent JVPs of the undefined-tangent check are extra
  rows of the vmapped call; the undefined-grad_output check reuses the outputs already computed.

As fused.py's pass, this one only decides a pass: a disagreement, an exception, or a case it does
not cover (complex or sparse inputs, neither forward AD nor a differentiable backward, more rows
than fit the memory budget, ...) raises fused.Fallback, and the caller goes on with the full
check (within the Jacobian budget, where it is the verdict) or the step-by-step projection check
(beyond it), which say what is wrong. A function that cannot be vmapped (Fallback.loops) goes to
the step-by-step projections first even within the budget, since their loops run a handful of
calls where the full check's run two per column; a failure there is again the full check's to
decide.
"""

from __future__ import annotations

import warnings

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine import aux_checks
from opcheck.engine._util import as_tuple, diff_input_indices, exception_line, is_float_or_complex, requires_grad
from opcheck.engine.auto import _SEED, COTANGENTS, DIRECTIONS, _rademacher, vjp_jvp_pairs
from opcheck.engine.aux_checks import _legacy_vmap
from opcheck.engine.batching import _close, combination_close
from opcheck.engine.core import CheckContext, allclose_promoted, make_vectors
from opcheck.engine.fused import (Fallback, _applies, _as_real, _of_diff_inputs, _outputs_once, _plain_jvp,
                                  _real_outputs, batched_backward, only_a_pass)

__all__ = ["projected_check"]


def projected_check(ctx: CheckContext, func, func_out, inputs: tuple, outputs: tuple, *, check_backward_ad: bool,
                    check_forward_ad: bool, check_undefined_grad: bool, check_batched_grad: bool,
                    check_batched_forward_grad: bool, masked) -> None:
    """Every check of one gradcheck call, projected and fused; returns when all pass, raises Fallback."""
    func_out = as_tuple(func_out)
    has_complex = any(isinstance(o, torch.Tensor) and o.is_complex() for o in func_out)
    real_func, real_out = (_real_outputs(func), _as_real(func_out)) if has_complex else (func, func_out)
    real_outputs = tuple(o for o in real_out if o.requires_grad)
    _applies(ctx, real_out, inputs, real_outputs, check_backward_ad, projected=True)
    ev = ctx.evaluator
    diff = diff_input_indices(inputs)
    g = torch.Generator().manual_seed(_SEED)
    directions = [_rademacher((DIRECTIONS, *inputs[j].shape), inputs[j], g) for j in diff]
    cotangents = [_rademacher((COTANGENTS, *o.shape), o, g) for o in real_outputs]
    zero_tangent_rows = check_forward_ad and check_undefined_grad and len(diff) > 1 and not has_complex
    with only_a_pass():
        fd, ju, zero_tangent = _forward(ctx, real_func, inputs, real_out, directions, zero_tangent_rows,
                                        check_forward_ad, legacy=check_forward_ad and check_batched_forward_grad)
        source = "forward AD"
        if ju is None:
            ju, source = _vjp_of_vjp(ctx, real_outputs, inputs, directions, cotangents), "the VJP of the VJP"
        for jj, per_output in enumerate(fd):
            for i, n in enumerate(per_output):
                if not allclose_promoted(ju[jj][i], n, ctx.rtol, ctx.atol):
                    raise Fallback(f"J·U: output {i}, input {diff[jj]} disagrees with finite differences")
        if check_backward_ad:
            grads = batched_backward(ctx, real_func, real_out, inputs, real_outputs, cotangents, check_batched_grad,
                                     masked)
            for jj, rows in enumerate(grads):
                u = directions[jj].reshape(DIRECTIONS, -1)
                for i, v in enumerate(cotangents):
                    g_i = rows[i * COTANGENTS:(i + 1) * COTANGENTS]
                    *_, bad = vjp_jvp_pairs(v.reshape(COTANGENTS, -1), ju[jj][i], g_i, u, ctx.nondet_tol)
                    if bool(bad.any()):
                        raise Fallback(f"VJP stage: output {i}, input {diff[jj]}: JᵀV disagrees with J·U")
            ev.stats.auto_paths.append(f"projected (J·U from {source}, fused)")
        if check_forward_ad:
            ev.stats.auto_paths.append("projected (J·U from forward AD, fused)")
            if check_undefined_grad and len(diff) > 1:
                aux_checks.test_undefined_forward_mode(ctx, func, outputs, inputs, zero_tangent)
        if check_backward_ad and check_undefined_grad:
            aux_checks.test_undefined_backward_mode(ctx, _outputs_once(func, func_out), outputs, inputs)
    ev.stats.fused = True


def _forward(ctx: CheckContext, func, inputs: tuple, func_out: tuple, directions, zero_tangent_rows: bool,
             tie: bool, legacy: bool):
    """Central differences and J·U along the directions: ([input][output] (k, m) each, zero_tangent).

    zero_tangent: the undefined-tangent check's JVPs (test_undefined_forward_mode's hook), from
    extra rows, or None. tie: forward AD is what is checked, so the batched JVP rows must agree
    with a plain JVP along a dense combination of them.
    """
    ev = ctx.evaluator
    diff = diff_input_indices(inputs)
    base = [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
    sizes = [inputs[j].numel() for j in diff]
    k, n_inputs = DIRECTIONS, len(diff)
    # Tangent rows (flat over every differentiable input): k per input along its directions, then
    # per input the undefined-tangent check's direction with that input's part zeroed.
    dense = [d.reshape(k, -1) for d in directions]
    tangents = [base[j].new_zeros((k * n_inputs, size)) for j, size in zip(diff, sizes)]
    for jj in range(n_inputs):
        tangents[jj][jj * k:(jj + 1) * k] = dense[jj]
    if zero_tangent_rows:
        _, all_u = make_vectors([inputs[j] for j in diff], None, use_forward_ad=True)
        extra = [base[j].new_zeros((n_inputs, size)) for j, size in zip(diff, sizes)]
        for row in range(n_inputs):
            for jj in range(n_inputs):
                if jj != row:
                    extra[jj][row] = all_u[jj].reshape(-1)
        tangents = [torch.cat([t, e]) for t, e in zip(tangents, extra)]
    t_rows = tangents[0].shape[0]
    # Perturbed rows: per input, x - eps u for its k directions, then x + eps u.
    deltas = [base[j].new_zeros((2 * k * n_inputs, size)) for j, size in zip(diff, sizes)]
    for jj in range(n_inputs):
        deltas[jj][jj * k:(jj + 1) * k] = dense[jj] * -ctx.eps
        deltas[jj][(n_inputs + jj) * k:(n_inputs + jj + 1) * k] = dense[jj] * ctx.eps
    p_rows = deltas[0].shape[0]
    floats = [o for o in func_out if is_float_or_complex(o)]
    of_x = _of_diff_inputs(getattr(func, "vmap_form", func), base, diff)
    shaped = [lambda t, j=j: t.view(t.shape[0], *base[j].shape) for j in diff]
    touts = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not legacy:
            def one_row(*dt):
                return torch.func.jvp(of_x, tuple(base[j] + d for j, d in zip(diff, dt[:n_inputs])),
                                      dt[n_inputs:])

            # Rows: the perturbed points with zero tangents, then x with the tangents.
            points = [s(torch.cat([d, d.new_zeros((t_rows, d.shape[1]))])) for s, d in zip(shaped, deltas)]
            along = [s(torch.cat([t.new_zeros((p_rows, t.shape[1])), t])) for s, t in zip(shaped, tangents)]
            try:
                ev.stats.batched_jvp_calls += 1
                outs, touts = ev._vmap(one_row, *points, *along)
            except Exception as e:
                if tie:  # forward AD is what is checked: its columns would run one at a time
                    raise Fallback(f"forward AD under vmap: {exception_line(e)}", loops=True) from e
                # Forward AD is only a tool here (no jvp, or none under vmap): the caller takes
                # J·U from backward, and the finite differences come from a call of their own.
            else:
                centers = [o[p_rows] for o in outs]
                primals = [o[:p_rows] for o in outs]
                touts = [t[p_rows:] for t in as_tuple(touts)]
        if touts is None:
            ev.stats.batched_calls += 1
            center = [torch.zeros_like(d[:1]) for d in deltas]
            try:
                outs = ev._vmap(lambda *d: of_x(*(base[j] + x for j, x in zip(diff, d))),
                                *[s(torch.cat([c, d])) for s, c, d in zip(shaped, center, deltas)])
                centers = [o[0] for o in outs]
                primals = [o[1:] for o in outs]
                if legacy:
                    ev.stats.batched_jvp_calls += 1
                    touts = _legacy_vmap(_legacy_jvp(func, inputs, diff))(*[s(t) for s, t in zip(shaped, tangents)])
            except Exception as e:  # the function (or its jvp) one call at a time
                raise Fallback(f"under vmap: {exception_line(e)}", loops=True) from e
    if len(primals) != len(floats) or (touts is not None and len(as_tuple(touts)) != len(floats)):
        raise Fallback("number of outputs changed under vmap")
    for o, c, ref in zip(primals, centers, floats):
        if o.shape[1:] != ref.shape or o.dtype != ref.dtype:
            raise Fallback("output shape or dtype changed under vmap")
        if not _close(c, ref.detach()):
            raise Fallback("vmapped evaluation at the unperturbed point differs from the plain call", ("forward",))
    fd = [[] for _ in diff]
    for o in primals:
        o = o.reshape(p_rows, -1)
        for jj in range(n_inputs):
            lo, hi = jj * k, (jj + 1) * k
            fd[jj].append(torch.sub(o[(n_inputs + jj) * k:(n_inputs + jj + 1) * k], o[lo:hi]).div_(2 * ctx.eps))
    if touts is None:
        return fd, None, None
    for t, ref in zip(as_tuple(touts), floats):
        if t.shape[1:] != ref.shape or t.dtype != ref.dtype:
            raise Fallback("tangent shape or dtype differs from its output's under vmap")
    flat_t = [t.reshape(t_rows, -1) for t in as_tuple(touts)]
    if tie:
        w = torch.randn(t_rows, generator=torch.Generator().manual_seed(_SEED + 1), dtype=torch.float64)
        u = torch.cat([(w.to(t.dtype) @ t) for t in tangents])
        for rows, po in zip(flat_t, _plain_jvp(ev, func, inputs, diff, sizes, u)):
            if not combination_close(w, rows, po):
                raise Fallback("batched JVP differs from the plain JVP", ("jvp_func", "jvp"))
    ju = [[t[jj * k:(jj + 1) * k] for t in flat_t] for jj in range(n_inputs)]
    zero_tangent = None
    if zero_tangent_rows:
        def zero_tangent(row, _all_u):
            return [t[k * n_inputs + row] for t in flat_t]
    return fd, ju, zero_tangent


def _vjp_of_vjp(ctx: CheckContext, outputs: tuple, inputs: tuple, directions, cotangents):
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
        grads = torch.autograd.grad(outputs, diff_inputs, vs, create_graph=True, allow_unused=True)
        ev.stats.vjp_calls += 1
        result = []
        for g, u in zip(grads, directions):
            if g is None:
                result.append([o.new_zeros((DIRECTIONS, o.numel())) for o in outputs])
                continue
            if not g.requires_grad:
                raise Fallback("backward is not differentiable (its result does not require grad)")
            rows = torch.autograd.grad([g], vs, [u], retain_graph=True, allow_unused=True, is_grads_batched=True)
            ev.stats.batched_vjp_calls += 1
            result.append([r.reshape(DIRECTIONS, -1) if r is not None else o.new_zeros((DIRECTIONS, o.numel()))
                           for r, o in zip(rows, outputs)])
    return result


def _legacy_jvp(func, inputs: tuple, diff):
    """Tangents of func's float outputs for per-input tangents: make_dual under the legacy vmap."""
    def jvp(*ts):
        with fwAD.dual_level():
            args = list(inputs)
            for j, t in zip(diff, ts):
                args[j] = fwAD.make_dual(inputs[j].detach(), t)
            res = []
            for o in as_tuple(func(*args)):
                if not is_float_or_complex(o):
                    continue
                primal, tangent = fwAD.unpack_dual(o)
                res.append(tangent if tangent is not None else
                           torch.zeros([], dtype=primal.dtype, device=primal.device).expand(primal.shape))
            return tuple(res)
    return jvp
