"""One evaluation of an op or its reference: its outputs, its VJP for given cotangents and its JVP
for given tangents, each backward and forward-AD call on its own copies of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD

from opcheck._records import record
from opcheck.engine._util import load_forward_ad_decompositions, make_dual, unpack_dual
from opcheck.engine.lowprec.criterion import JVP, OUTPUT, VJP
from opcheck.engine.lowprec.numbers import _differentiable, _is_float, _outputs


@record(frozen=False)
class Evaluated:
    outputs: list[Any]
    values: dict[tuple[str, int], torch.Tensor | None]

    def get(self, key: tuple[str, int]) -> torch.Tensor | None:
        return self.values.get(key)


def evaluate(
    fn: Callable[..., Any],
    inputs: tuple[Any, ...],
    diff: list[int],
    cots: Callable[[list[Any]], list[torch.Tensor]],
    want_vjp: bool,
    tans: list[torch.Tensor] | Callable[[], list[torch.Tensor] | None] | None,
    guard: Callable[[str], None] | None = None,
    written: list[str] | None = None,
) -> Evaluated:
    """The outputs of fn(*inputs), its VJP for cots(outputs) when want_vjp, its JVP for the
    tangents when given; `guard` runs after each call of fn.

    Backward and forward AD get their own copies of the cotangents and tangents, which the caller
    reuses for the next run: a kernel may write into the gradient autograd hands it. `written`
    collects what this call's backward or forward-AD rule wrote into ("the grad_output of output 0")."""
    __tracebackhide__ = True
    xs = list(inputs)
    for i in diff:
        xs[i] = inputs[i].detach().requires_grad_(True)
    outs = _outputs(fn(*xs))
    if guard is not None:
        guard("call")
    cot = cots(outs)
    values: dict[tuple[str, int], torch.Tensor | None] = {}
    for i, o in enumerate(outs):
        if isinstance(o, torch.Tensor) and _is_float(o):
            values[(OUTPUT, i)] = o.detach()
    positions = [i for i, o in enumerate(outs) if _differentiable(o)]
    if want_vjp and positions:
        given = [c.clone() for c in cot[: len(positions)]]
        grads = torch.autograd.grad([outs[i] for i in positions], [xs[i] for i in diff], given, allow_unused=True)
        for k, g in enumerate(grads):
            values[(VJP, k)] = None if g is None else g.detach()
        if guard is not None:
            guard("backward (VJP)")
        if written is not None:
            written.extend(_changed(given, cot, [f"the grad_output of output {i}" for i in positions]))
    tangents = tans() if callable(tans) else tans
    if tangents is not None:
        values.update(jvp(fn, inputs, diff, tangents, written).values)
        if guard is not None:
            guard("forward-mode call (JVP)")
    return Evaluated(outs, values)


def _changed(given: list[torch.Tensor], pristine: list[torch.Tensor], names: list[str]) -> list[str]:
    """`name (k of n entries changed)` for each copy handed to autograd that no longer equals its original."""
    found = []
    for now, before, name in zip(given, pristine, names):
        a, b = now.detach(), before.detach()
        if a.layout != torch.strided:
            a, b = a.to_dense(), b.to_dense()
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if not bool(same.all()):
            found.append(f"{name} ({int((~same).sum())} of {a.numel()} entries changed)")
    return found


def jvp(
    fn: Callable[..., Any],
    inputs: tuple[Any, ...],
    diff: list[int],
    tans: list[torch.Tensor],
    written: list[str] | None = None,
) -> Evaluated:
    __tracebackhide__ = True
    load_forward_ad_decompositions()  # this checks the op's forward AD (see _util.make_dual)
    given = [t.clone() for t in tans]
    with fwAD.dual_level():
        xs = list(inputs)
        for i, t in zip(diff, given):
            xs[i] = make_dual(inputs[i].detach(), t)
        outs = _outputs(fn(*xs))
        if written is not None:
            written.extend(_changed(given, tans, [f"the tangent of input {i}" for i in diff]))
        values: dict[tuple[str, int], torch.Tensor | None] = {}
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and _is_float(o):
                tangent = unpack_dual(o)[1]
                values[(JVP, i)] = None if tangent is None else tangent.detach()
    return Evaluated(outs, values)
