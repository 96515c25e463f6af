"""Where the step-by-step projection check (stepwise.py) gets its quantities along the directions U.

Numerically, central differences along each direction (vmapped, else two plain calls each).
Analytically, J·U from the first source that works: forward AD, the VJP of the VJP, or VJP rows
reduced against U. Each vmapped evaluation is probed by a plain one, and the loop decides where
they disagree, as in batching/.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD

from opcheck._records import record
from opcheck.engine import route
from opcheck.engine._util import (
    Func,
    Inputs,
    as_tuple,
    at_positions,
    autograd_grad,
    detached,
    diff_input_indices,
    exception_line,
    is_float_or_complex,
    make_duals,
    of_inputs,
    unpack_dual,
    vmap_form,
)
from opcheck.engine.auto.projections import SEED, rademacher
from opcheck.engine.batching import (
    Differences,
    Disagreement,
    Evaluator,
    OneHotRows,
    close,
    difference_quotient,
    vjp_batch,
)
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.route import COTANGENTS, DIRECTIONS

PerInputOutput = list[list[torch.Tensor]]
"""[input][output] (k, m) projections: a row per direction, a column per output element."""


class Unavailable(Exception):
    """This source of J·U does not work for the function."""


@record
class Projection:
    """One projection check's function and point, with its directions U and cotangents V."""

    ctx: CheckContext
    call: Call
    diff: list[int]
    positions: list[int]  # positions in func_out of the outputs checked, in the full check's numbering
    U: list[torch.Tensor]  # per differentiable input, (k, *shape) Rademacher directions
    V: list[torch.Tensor]  # per output checked, (k', *shape) Rademacher cotangents

    @classmethod
    def of(cls, ctx: CheckContext, call: Call) -> Projection:
        inputs, func_out, outputs = call.inputs, call.func_out, call.outputs
        diff = diff_input_indices(inputs)
        positions = [p for p, o in enumerate(func_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outputs:  # then every float output's finite differences must be zero
            positions = [p for p, o in enumerate(func_out) if is_float_or_complex(o)]
        g = torch.Generator().manual_seed(SEED)
        directions = [rademacher((DIRECTIONS, *inputs[j].shape), inputs[j], g) for j in diff]
        cotangents = [rademacher((COTANGENTS, *o.shape), o, g) for o in outputs]
        return cls(ctx, call, diff, positions, directions, cotangents)

    @property
    def ev(self) -> Evaluator:
        return self.ctx.evaluator

    def only(self, j: int) -> Inputs:
        """The inputs with every tensor but input j detached: the point of input j's block alone."""
        return tuple(a if k == j else d for k, (a, d) in enumerate(zip(self.call.inputs, detached(self.call.inputs))))

    def of_input(self, j: int) -> Func:
        """The vmap form of func as a function of input j alone, its outputs those checked."""
        return of_inputs(vmap_form(self.call.func), detached(self.call.inputs), [j], at_positions(self.positions))


# ------------------------------------------------------------------------- numerical J·U
def numerical_along(p: Projection, jj: int) -> list[torch.Tensor]:
    """Per checked output, (k, m) central differences along each direction of input diff[jj]."""
    j = p.diff[jj]
    if p.ev.batch_forward:
        try:
            return _numerical_batched(p, j, p.U[jj])
        except Exception as e:  # the loop decides what the user sees
            p.ev.give_up("forward", e)
    diffs = Differences(p.ev, p.call.func, p.call.inputs, p.ctx.flags.eps)
    rows = [diffs.along(p.call.inputs[j].data, p.ctx.flags.eps * u, positions=p.positions) for u in p.U[jj]]
    return [torch.stack(col) for col in zip(*rows)] if rows else []


def _numerical_batched(p: Projection, j: int, U: torch.Tensor) -> list[torch.Tensor]:
    eps, k = p.ctx.flags.eps, U.shape[0]
    x = p.call.inputs[j].detach()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = p.ev.vmap(p.of_input(j), torch.cat([x - eps * U, x + eps * U]))
    p.ev.stats.batched_calls += 1
    for o, r in zip(outs, [p.call.func_out[q] for q in p.positions]):
        if o.shape[1:] != r.shape or o.dtype != r.dtype:
            raise Disagreement("output shape or dtype changed under perturbation")
    entry = p.call.inputs[j].data
    orig = entry.clone()
    try:  # probe: one plain call at x + eps u_0 must match the batched row
        entry.copy_(orig + eps * U[0])
        plain = p.ev.call_cloned(p.call.func, p.call.inputs)
    finally:
        entry.copy_(orig)
    for o, q in zip(outs, p.positions):
        if not close(o[k], plain[q]):
            raise Disagreement("vmapped evaluation differs from the plain call")
    return [difference_quotient(o[:k].detach(), o[k:].detach(), eps).reshape(k, -1) for o in outs]


# -------------------------------------------------------------------- analytical J·U: JVP
def jvp_all(p: Projection) -> PerInputOutput:
    """J·U from forward AD for every input, as a tool: any failure makes the source unavailable."""
    return [jvp_along(p, jj, strict=False) for jj in range(len(p.diff))]


def jvp_along(p: Projection, jj: int, *, strict: bool) -> list[torch.Tensor]:
    """Per checked output, (k, m) forward-mode J·U for input diff[jj].

    strict: forward AD is what is checked, so the loop's exceptions reach the user; otherwise
    any failure makes this source unavailable.
    """
    j, U = p.diff[jj], p.U[jj]
    if p.ev.batch_jvp_func:
        try:
            return _jvp_batched(p, j, U)
        except Exception as e:
            p.ev.give_up("jvp_func", e)
    if strict:
        return _jvp_loop(p, j, U)
    if not route.unbatched_jvps_as_source(p.ev.batch_vjp):
        raise Unavailable("its JVPs do not batch, and backward's do: the next source takes fewer calls")
    try:
        return _jvp_loop(p, j, U)
    except Exception as e:
        raise Unavailable(exception_line(e)) from e


def _jvp_loop(p: Projection, j: int, U: torch.Tensor) -> list[torch.Tensor]:
    rows = []
    with fwAD.dual_level():
        duals, tangents = make_duals(p.call.inputs)
        t = tangents[j]
        for u in U:
            t.copy_(u)
            p.ev.stats.jvp_calls += 1
            outs = as_tuple(p.call.func(*duals))
            per = []
            for q in p.positions:
                primal, tangent = unpack_dual(outs[q])
                if tangent is not None:
                    p.ctx.check_forward_dtype(primal, tangent)
                per.append(
                    torch.zeros(primal.numel(), dtype=primal.dtype, device=primal.device)
                    if tangent is None
                    else tangent.detach().reshape(-1).clone()
                )
            rows.append(per)
            t.zero_()
    return [torch.stack(col) for col in zip(*rows)]


def _jvp_batched(p: Projection, j: int, U: torch.Tensor) -> list[torch.Tensor]:
    of_x, x = p.of_input(j), p.call.inputs[j].detach()

    def column(u: torch.Tensor) -> Any:
        return torch.func.jvp(of_x, (x,), (u,))[1]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = p.ev.vmap(column, U)
    p.ev.stats.batched_jvp_calls += 1
    res = [r.reshape(U.shape[0], -1) for r in as_tuple(res)]
    for r, plain in zip(res, _jvp_loop(p, j, U[:1])):  # probe
        if not close(r[:1], plain):
            raise Disagreement("batched JVP differs from the plain JVP")
    return res


# ------------------------------------------------------- analytical J·U: VJP of the VJP
def double_backward(p: Projection) -> PerInputOutput:
    """J·U as the VJP of g(v) = Jᵀv (linear in v) with cotangent U, where backward is differentiable."""
    diff_inputs = [p.call.inputs[j] for j in p.diff]
    vs = [v[0].clone().requires_grad_() for v in p.V]  # any value: g(v) = Jᵀv is linear in v
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grads = autograd_grad(p.call.outputs, diff_inputs, vs, create_graph=True)
    except Exception as e:
        raise Unavailable(f"{type(e).__name__}: {e}") from e
    p.ev.stats.vjp_calls += 1
    result = []
    for jj, g in enumerate(grads):
        k = p.U[jj].shape[0]
        if g is None:
            result.append([o.new_zeros((k, o.numel())) for o in p.call.outputs])
            continue
        if not g.requires_grad:
            raise Unavailable("backward is not differentiable (its result does not require grad)")
        try:
            ju = vjp_batch(p.ev, [g], vs, [p.U[jj]])
        except Exception as e:
            raise Unavailable(exception_line(e)) from e
        result.append(
            [(t.reshape(k, -1) if t is not None else o.new_zeros((k, o.numel()))) for t, o in zip(ju, p.call.outputs)]
        )
    return result


# --------------------------------------------------------------- analytical J·U: VJP rows
def rows_along(p: Projection) -> PerInputOutput:
    """(J U)[r] = (eᵣᵀ J) U, a chunk of rows at a time: never more than a chunk of J."""
    diff_inputs = [p.call.inputs[j] for j in p.diff]
    n_total = sum(t.numel() for t in diff_inputs)
    result: list[list[torch.Tensor]] = [[] for _ in p.diff]
    for o in p.call.outputs:
        m = o.numel()
        chunk = p.ev.chunk(m, m + n_total, o.element_size())
        acc = [o.new_zeros((u.shape[0], m)) for u in p.U]
        rows = OneHotRows(m, o)
        for start in range(0, m, chunk):
            b = min(chunk, m - start)
            e = rows.take(b, start).view(b, *o.shape)
            grads = vjp_batch(p.ev, [o], diff_inputs, [e], probe=start == 0)
            for jj, g in enumerate(grads):
                if g is not None:
                    U = p.U[jj].reshape(p.U[jj].shape[0], -1)
                    acc[jj][:, start : start + b] = (g.reshape(b, -1) @ U.t().to(g.dtype)).t()
        for jj in range(len(p.diff)):
            result[jj].append(acc[jj])
    return result


def rows_at(p: Projection, elements: list[list[int]]) -> PerInputOutput:
    """(J U)[r] = (eᵣᵀ J) U at the output elements elements[i] of each output i alone (flat indices):
    per block a (k, len(elements[i])) tensor, from one batch of backward rows per output."""
    result: PerInputOutput = [[] for _ in p.diff]
    for i, wanted in enumerate(elements):
        for jj, rows in enumerate(backward_rows(p, i, wanted)):
            result[jj].append(reduce_rows(p, jj, rows, len(wanted)))
    return result


def backward_rows(p: Projection, i: int, wanted: list[int]) -> list[torch.Tensor | None]:
    """Per differentiable input, backward's rows eᵣᵀJ at the flat elements `wanted` of output i,
    (len(wanted), numel of the input), from one batch of VJPs; None where the input gets no gradient."""
    o = p.call.outputs[i]
    if not wanted:
        return [None for _ in p.diff]
    b = len(wanted)
    e = o.new_zeros((b, o.numel()))
    e[torch.arange(b, device=o.device), torch.tensor(wanted, device=o.device)] = 1
    grads = vjp_batch(p.ev, [o], [p.call.inputs[j] for j in p.diff], [e.view(b, *o.shape)])
    return [None if g is None else g.reshape(b, -1) for g in grads]


def reduce_rows(p: Projection, jj: int, rows: torch.Tensor | None, count: int) -> torch.Tensor:
    """`count` rows of input diff[jj]'s block (None: all zero) against its directions: (k, count) J·U."""
    U = p.U[jj].reshape(p.U[jj].shape[0], -1)
    if rows is None:
        return U.new_zeros((U.shape[0], count))
    return (rows @ U.t().to(rows.dtype)).t()
