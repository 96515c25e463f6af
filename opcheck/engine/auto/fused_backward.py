"""The fused passes' backward: every row they need, and the backward's side checks, in one batched call.

Its cotangents are the pass's leading rows (the Jacobian's one-hot rows, or the projections'
cotangents), then, per output, the step-by-step batched-gradient check's first random cotangent,
then an all-zero row. From FUNCTORCH_ROWS rows on they go through torch.func's vmapped pullback,
else (or where its rows disagree with a plain backward) through the legacy batched backward.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from opcheck.engine import aux_checks, route
from opcheck.engine._util import (
    Func,
    Inputs,
    allclose_promoted,
    at_positions,
    autograd_grad,
    batched_grad,
    detached,
    diff_input_indices,
    identical,
    of_inputs,
    requires_grad,
    vmap_form,
)
from opcheck.engine.auto.passes import Fallback
from opcheck.engine.batching import Evaluator, close
from opcheck.engine.context import Call, CheckContext

FUNCTORCH_ROWS = 64
"""From this many Jacobian rows the fused backward takes them from torch.func (a vmapped pullback),
whose batching rules cover backward kernels that the legacy vmap runs one row at a time (conv's:
15x faster at 128 rows); below, the legacy batched backward's lower overhead wins."""

ALLCLOSE_RTOL, ALLCLOSE_ATOL = 1e-5, 1e-8
"""torch.allclose's defaults: how torch's batched-gradient check compares batched with plain."""


def batched_backward(
    ctx: CheckContext, call: Call, leading: Sequence[torch.Tensor | None], timed: bool = False
) -> list[torch.Tensor]:
    """One batched backward for `leading` cotangents, with the side checks of the backward riding along.

    `leading` holds per output its (r_i, *shape) cotangents, or None for its one-hot rows (the
    Jacobian's). Appended to them: per output, the step-by-step batched-gradient check's first
    random cotangent (tied to two plain backward passes: reentrancy and batched against plain),
    and one all-zero row (the zero-grad_output check). Returns per differentiable input its
    (Σ r_i, numel) gradients along the leading rows, output by output; raises Fallback when a
    side check does not pass. `timed`: the legacy batched backward's seconds per row go to
    Evaluator.backward_row_seconds.

    Where route.plain_backward_rows (a row or two of one output), the same checks run by plain
    backward passes instead (_plain_rows).
    """
    rows = sum(o.numel() if lead is None else lead.shape[0] for o, lead in zip(call.outputs, leading))
    if not timed and route.plain_backward_rows(rows, len(call.outputs), ctx.flags.check_batched_grad):
        return _plain_rows(ctx, call, leading[0])
    return _Backward(ctx, call, leading, timed).rows()


def _plain_rows(ctx: CheckContext, call: Call, lead: torch.Tensor | None) -> list[torch.Tensor]:
    """batched_backward's rows and side checks for few rows of one output, by plain backward passes:
    each row, the first twice (reentrancy: identical up to nondet_tol), then an all-zero
    grad_output, whose gradients must be zero (exactly, or allclose when masked)."""
    output, ev, flags = call.outputs[0], ctx.evaluator, ctx.flags
    diff_inputs = [a for a in call.inputs if requires_grad(a)]
    if lead is None:
        m = output.numel()
        cotangents = output.new_zeros((m, m)).fill_diagonal_(1).view(m, *output.shape)
    else:
        cotangents = lead
    rows: list[list[torch.Tensor]] = [[] for _ in diff_inputs]
    for r, v in enumerate(cotangents):
        grads = _plain_gradients(ctx, output, 0, diff_inputs, v) if r == 0 else _plain_once(ev, output, diff_inputs, v)
        for j, g in enumerate(grads):
            rows[j].append(g)
    zero = _plain_once(ev, output, diff_inputs, torch.zeros_like(output))
    for j, z in enumerate(zero):
        if bool(z.any()) and not (flags.masked and torch.allclose(z, torch.zeros_like(z))):
            raise Fallback(f"gradient of input {j} is nonzero for a zero grad_output")
    return [torch.stack(r) if r else x.new_zeros((0, x.numel())) for r, x in zip(rows, diff_inputs)]


def _plain_once(
    ev: Evaluator, output: torch.Tensor, diff_inputs: list[torch.Tensor], v: torch.Tensor
) -> list[torch.Tensor]:
    """One plain backward along v: per input, its flat gradient (zeros where unused)."""
    grads = _plain_vjp(ev, output, diff_inputs, v)
    return [_gradient(x, g, 0, j).reshape(-1) for j, (x, g) in enumerate(zip(diff_inputs, grads))]


def _gradient(x: torch.Tensor, g: torch.Tensor | None, i: int, j: int) -> torch.Tensor:
    """Output i's plain gradient g of input x (input j), detached, zeros where undefined; raises
    Fallback where its dtype, shape or layout is not x's."""
    a = g.detach() if g is not None else torch.zeros_like(x)
    if a.dtype != x.dtype or a.shape != x.shape or a.layout != torch.strided:
        raise Fallback(f"output {i}: the plain gradient of input {j} has an unexpected dtype or shape")
    return a


class _Backward:
    """The cotangents of one fused backward, and the plain gradients its random rows are tied to."""

    def __init__(self, ctx: CheckContext, call: Call, leading: Sequence[torch.Tensor | None], timed: bool):
        self.ctx, self.call, self.outputs, self.timed = ctx, call, call.outputs, timed
        inputs, outputs = call.inputs, call.outputs
        self.diff_inputs = [a for a in inputs if requires_grad(a)]
        sizes = [o.numel() if lead is None else lead.shape[0] for o, lead in zip(outputs, leading)]
        self.m = m = sum(sizes)
        self.count = rows = m + len(outputs) + 1  # the leading rows, one random cotangent per output, one zero row
        randoms = []  # per output, the first random cotangent of the step-by-step batched-gradient check
        self.cotangents = []
        offset = 0
        for i, (o, lead) in enumerate(zip(outputs, leading)):
            randoms.append(aux_checks.first_cotangent(o, i))
            c = o.new_zeros((rows, o.numel()))
            if lead is None:
                c[offset : offset + sizes[i]].fill_diagonal_(1)
            else:
                c[offset : offset + sizes[i]] = lead.reshape(sizes[i], -1)
            c[m + i] = randoms[i].reshape(-1)
            self.cotangents.append(c.view(rows, *o.shape))
            offset += sizes[i]
        self.plain = [_plain_gradients(ctx, o, i, self.diff_inputs, randoms[i]) for i, o in enumerate(outputs)]

    def rows(self) -> list[torch.Tensor]:
        ev, flags = self.ctx.evaluator, self.ctx.flags
        flat = None
        legacy_checked = False
        if self.m >= FUNCTORCH_ROWS:
            rows = functorch_rows(self.call.func, self.call.func_out, self.call.inputs, self.cotangents)
            flat = _flat_rows(rows, self.diff_inputs, self.count)
            if flat is not None and not self._tied(flat, flags.check_batched_grad):
                # torch.func's batching rule disagrees: try the legacy one
                ev.stats.fallbacks.append("fused: torch.func's batched backward differs from the plain one")
                ev.stats.disagreements += 1
                flat = None
        if flat is None:
            flat = self._legacy(ev)
            legacy_checked = True
        else:
            ev.stats.batched_vjp_calls += 1
        if flags.check_batched_grad and not legacy_checked:
            self._check_legacy(ev)
        for j, f in enumerate(flat):
            zero = f[self.count - 1]
            if bool(zero.any()) and not (flags.masked and torch.allclose(zero, torch.zeros_like(zero))):
                raise Fallback(f"gradient of input {j} is nonzero for a zero grad_output")
        return [f[: self.m] for f in flat]

    def _tied(self, flat: list[torch.Tensor], check_batched_grad: bool) -> bool:
        """Each random cotangent's batched row against the plain gradient: torch.allclose's defaults,
        as the batched-gradient check compares; with that check off, agreement up to reassociation."""
        m, nondet_tol = self.m, self.ctx.flags.nondet_tol
        for i in range(len(self.outputs)):
            for j, p in enumerate(self.plain[i]):
                row = flat[j][m + i]
                same = (
                    allclose_promoted(row, p, ALLCLOSE_RTOL, ALLCLOSE_ATOL)
                    if check_batched_grad
                    else close(row, p, extra_atol=nondet_tol)
                )
                if not same:
                    return False
        return True

    def _legacy(self, ev: Evaluator) -> list[torch.Tensor]:
        """Every row from the legacy batched backward, tied to the plain gradients."""
        ev.stats.batched_vjp_calls += 1
        flat = _flat_rows(
            legacy_rows(ev, self.outputs, self.diff_inputs, self.cotangents, self.timed),
            self.diff_inputs,
            self.count,
        )
        if flat is None:
            raise Fallback("the batched gradient has an unexpected shape, dtype or layout")
        if not self._tied(flat, self.ctx.flags.check_batched_grad):
            raise Fallback("batched and plain gradients differ", ("vjp",))
        return flat

    def _check_legacy(self, ev: Evaluator) -> None:
        """The batched-gradient check is about the legacy vmap (is_grads_batched): its row of each
        random cotangent against the plain gradient."""
        ev.stats.batched_vjp_calls += 1
        n_out = len(self.outputs)
        randoms = [c[self.m : self.m + n_out] for c in self.cotangents]
        rows = legacy_rows(ev, self.outputs, self.diff_inputs, randoms)
        legacy = _flat_rows(rows, self.diff_inputs, n_out)
        if legacy is None or not all(
            allclose_promoted(legacy[j][i], p, ALLCLOSE_RTOL, ALLCLOSE_ATOL)
            for i in range(n_out)
            for j, p in enumerate(self.plain[i])
        ):
            raise Fallback("the legacy batched gradient differs from the plain one", disagreed=True)


def _plain_gradients(
    ctx: CheckContext, output: torch.Tensor, i: int, diff_inputs: list[torch.Tensor], v: torch.Tensor
) -> list[torch.Tensor]:
    """The plain backward along v, run twice (reentrancy): per input, its flat gradient."""
    first = _plain_vjp(ctx.evaluator, output, diff_inputs, v)
    again = _plain_vjp(ctx.evaluator, output, diff_inputs, v)
    result = []
    for j, x in enumerate(diff_inputs):
        if (first[j] is None) != (again[j] is None):
            raise Fallback(f"output {i}: two plain backward passes disagree on whether input {j} is used")
        a, g = _gradient(x, first[j], i, j), again[j]
        b = g.detach() if g is not None else a
        if not identical(a, b) and (a.numel() == 0 or float((a - b).abs().max()) > ctx.flags.nondet_tol):
            raise Fallback(f"two plain backward passes of output {i} differ (reentrancy)")
        result.append(a.reshape(-1))
    return result


def _flat_rows(
    batched: Sequence[torch.Tensor | None] | None, diff_inputs: list[torch.Tensor], rows: int
) -> list[torch.Tensor] | None:
    """Per input, its (rows, numel) batched gradients (zeros where undefined); None if any is malformed."""
    if batched is None:
        return None
    flat = []
    for gr, x in zip(batched, diff_inputs):
        if gr is None:
            gr = x.new_zeros((rows, *x.shape))
        elif tuple(gr.shape) != (rows, *x.shape) or gr.dtype != x.dtype or gr.layout != torch.strided:
            return None
        flat.append(gr.detach().reshape(rows, x.numel()))
    return flat


def legacy_rows(
    ev: Evaluator,
    outputs: Sequence[torch.Tensor],
    diff_inputs: Sequence[torch.Tensor],
    cotangents: Sequence[torch.Tensor],
    timed: bool = False,
) -> tuple[torch.Tensor | None, ...]:
    """The rows from the legacy batched backward (is_grads_batched); `timed`: its seconds per row
    go to ev.backward_row_seconds. Backward gets its own copy of the cotangents (a kernel may write
    into its grad_output; the caller reuses them)."""

    def rows() -> tuple[torch.Tensor | None, ...]:
        fresh = [c.clone() for c in cotangents]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return batched_grad(outputs, diff_inputs, fresh)

    if not timed:
        return rows()
    result, seconds = ev.timed(rows)
    ev.backward_row_seconds = seconds / max(1, cotangents[0].shape[0])
    return result


def functorch_rows(
    func: Func, func_out: tuple[Any, ...], inputs: Inputs, cotangents: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...] | None:
    """The rows from torch.func.vjp's pullback under torch.func.vmap, or None where it does not work.

    Its forward pass is torch.func's own; the plain backward of the user's graph is tied to these
    rows by the caller (its random cotangent's row).
    """
    diff = diff_input_indices(inputs)
    positions = [p for p, o in enumerate(func_out) if isinstance(o, torch.Tensor) and o.requires_grad]
    base = detached(inputs)
    of_x = of_inputs(vmap_form(func), base, diff, at_positions(positions))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pullback = torch.func.vjp(of_x, *[base[j] for j in diff])[1]
            return tuple(torch.func.vmap(pullback)(tuple(c.clone() for c in cotangents)))
    except Exception:  # no torch.func support (an old-style Function, .item(), ...): the legacy rows
        return None


def _plain_vjp(
    ev: Evaluator, output: torch.Tensor, diff_inputs: list[torch.Tensor], v: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    ev.stats.vjp_calls += 1
    fresh = v.clone()  # its own copy: a backward may write into its grad_output, and v is reused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autograd_grad((output,), diff_inputs, (fresh,), retain_graph=True)
