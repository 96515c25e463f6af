"""The analytical Jacobian's columns from forward-mode AD: J e_k for every input element k.

Batched, a chunk of columns is one vmapped JVP: torch.func.jvp under torch.func.vmap ("jvp_func",
wider batching rules) or make_dual under the legacy vmap ("jvp", what torch's batched forward-AD
check uses). The first chunk carries one extra row, a dense random direction over every input,
that one plain JVP must match (a one-hot probe would see one column only). Otherwise, torch's
loop: one JVP per column.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.autograd.forward_ad as fwAD

from opcheck._records import record
from opcheck.engine._util import (
    Func,
    as_tuple,
    detached,
    float_outputs,
    floats,
    legacy_vmap,
    make_dual,
    make_duals,
    of_inputs,
    unpack_dual,
    unravel,
    vmap_form,
    zeros_like_shape,
)
from opcheck.engine.batching import settings
from opcheck.engine.batching.agreement import Disagreement, close
from opcheck.engine.batching.evaluator import Evaluator, untimed, warm_functorch
from opcheck.engine.batching.schedule import Schedule, one_hot_rows

DtypeCheck = Callable[[torch.Tensor, torch.Tensor], None]
"""check(primal, tangent): raises when a tangent's dtype does not fit its primal's."""


@record
class ForwardCalls:
    """Forward-mode evaluations of fn at inputs through ev; check_dtype sees every tangent."""

    ev: Evaluator
    fn: Func
    inputs: Sequence[Any]
    check_dtype: DtypeCheck
    # torch's columns share one tangent buffer, so a forward-AD rule that writes into its tangent
    # spoils the columns after it; fast_mode=True/False keep that verdict: such a rule, seen by the
    # probe, sends the columns to torch's loop. fast_mode="auto" gives every column its own tangent.
    torch_tangents: bool = False

    def tangents(self, duals: Sequence[Any]) -> list[torch.Tensor]:
        """One plain JVP, counted: the flat tangent of every float/complex output (zeros where none)."""
        self.ev.stats.jvp_calls += 1
        outs = []
        for o in float_outputs(as_tuple(self.fn(*duals))):
            primal, tangent = unpack_dual(o)
            if tangent is not None:
                self.check_dtype(primal, tangent)
            outs.append(
                tangent.detach().reshape(-1).clone()
                if tangent is not None
                else torch.zeros(primal.numel(), dtype=primal.dtype, device=primal.device)
            )
        return outs

    def loop(self, idx: int) -> list[torch.Tensor]:
        """torch's columns of input idx: one JVP per element. Per float output, (numel_in, numel_out)."""
        cols: list[list[torch.Tensor]] = []
        with fwAD.dual_level():
            duals, tangents = make_duals(self.inputs)
            tangent = tangents[idx]
            for pos in [unravel(k, tangent.shape) for k in range(tangent.numel())]:
                tangent[pos] = 1.0
                cols.append(self.tangents(duals))
                tangent[pos] = 0.0
        return [torch.stack(c) for c in zip(*cols)] if cols else []

    def along(self, layout: _TangentLayout, direction: torch.Tensor) -> list[torch.Tensor]:
        """One plain JVP along a direction dense over every input of the layout (flat, concatenated)."""
        with fwAD.dual_level():
            duals, tangents = make_duals(self.inputs)
            for i, off, n in zip(layout.idxs, layout.offsets, layout.sizes):
                if n:
                    tangents[i].copy_(direction[off : off + n].view(self.inputs[i].shape))
            out = self.tangents(duals)
            if self.torch_tangents and any(
                n and not torch.equal(tangents[i].reshape(-1), direction[off : off + n].to(tangents[i].dtype))
                for i, off, n in zip(layout.idxs, layout.offsets, layout.sizes)
            ):
                raise Disagreement("the JVP wrote into its tangent, which torch's loop reuses for the next column")
            return out


def jvp_columns(calls: ForwardCalls, idxs: list[int], ref_outputs: tuple[Any, ...]) -> list[list[torch.Tensor]]:
    """Columns J e_k of every float/complex output for each element k of the inputs in idxs.

    Returns, per input in idxs, a list over float/complex outputs of (numel_in, numel_out)
    tensors (zeros where an output has no tangent). Up to FUSE_MAX_COLUMNS columns, all inputs
    share one vmapped call per chunk.
    """
    ev = calls.ev
    total = sum(calls.inputs[i].numel() for i in idxs)
    kinds: tuple[Literal["jvp_func", "jvp"], ...] = ("jvp", "jvp_func") if ev.legacy_jvp_first else ("jvp_func", "jvp")
    if total >= (2 if ev.legacy_jvp_first else settings.MIN_BATCH_COLUMNS):
        for kind in kinds:
            if ev.batches(kind):
                try:
                    if total <= settings.FUSE_MAX_COLUMNS:
                        result = _BatchedColumns(calls, idxs, ref_outputs, kind).run()
                    else:
                        result = [_BatchedColumns(calls, [i], ref_outputs, kind).run()[0] for i in idxs]
                    ev.jvp_kind_used = kind
                    return result
                except Exception as e:
                    ev.give_up(kind, e)
    ev.jvp_kind_used = "loop"
    return [calls.loop(idx) for idx in idxs]


@record
class _TangentLayout:
    """The columns of some inputs numbered globally: input idxs[k] holds columns offsets[k] onwards."""

    idxs: list[int]
    shapes: list[torch.Size]
    sizes: list[int]
    offsets: list[int]
    total: int
    dtype: torch.dtype  # the tangent rows', promoted over the inputs

    @classmethod
    def of(cls, inputs: Sequence[Any], idxs: list[int]) -> _TangentLayout:
        sizes = [inputs[i].numel() for i in idxs]
        offsets = [sum(sizes[:k]) for k in range(len(idxs))]
        dtype = functools.reduce(torch.promote_types, [inputs[i].dtype for i in idxs])
        return cls(idxs, [inputs[i].shape for i in idxs], sizes, offsets, sum(sizes), dtype)

    def split(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Per input, its (batch, *shape) tangent: a view of the rows' columns."""
        return [
            t[:, off : off + n].view(t.shape[0], *shape) if n else t.new_zeros((t.shape[0], *shape))
            for shape, off, n in zip(self.shapes, self.offsets, self.sizes)
        ]


def legacy_tangents(
    calls: ForwardCalls, idxs: Sequence[int], flat: bool = True
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """Tangents of the float outputs (flat, or in their shapes) for tangents of the inputs in idxs
    (the other differentiable inputs' are zero): make_dual, to run under the legacy vmap as torch's
    own forward-AD batching does."""
    inputs = calls.inputs
    diff = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad]

    def columns(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        by_idx = dict(zip(idxs, ts))
        with fwAD.dual_level():
            args = []
            for j, a in enumerate(inputs):
                if j in diff:
                    a = make_dual(a.detach(), by_idx[j].to(a.dtype) if j in by_idx else torch.zeros_like(a))
                args.append(a)
            res = []
            for o in float_outputs(as_tuple(calls.fn(*args))):
                primal, tangent = unpack_dual(o)
                if tangent is None:
                    tangent = zeros_like_shape(primal)
                elif primal.is_complex() != tangent.is_complex():
                    calls.check_dtype(primal, tangent)
                res.append(tangent.reshape(-1) if flat else tangent)
            return tuple(res)

    return columns


def _functorch_columns(calls: ForwardCalls, idxs: list[int]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The same tangents through torch.func.jvp, to run under torch.func.vmap."""
    base = detached(calls.inputs)
    of_x = of_inputs(vmap_form(calls.fn), base, idxs, floats)

    def columns(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        primals_tangents = torch.func.jvp(
            of_x, tuple(base[i] for i in idxs), tuple(t.to(base[i].dtype) for i, t in zip(idxs, ts))
        )
        primals, tangents = primals_tangents[0], primals_tangents[1]
        for p, tg in zip(primals, tangents):
            if p.is_complex() != tg.is_complex():
                calls.check_dtype(p, tg)
        return tuple(tg.reshape(-1) for tg in tangents)

    return columns


class _BatchedColumns:
    """The columns of some inputs by one kind of vmapped JVP, chunk by chunk."""

    def __init__(
        self, calls: ForwardCalls, idxs: list[int], ref_outputs: tuple[Any, ...], kind: Literal["jvp_func", "jvp"]
    ):
        self.calls, self.ev, self.kind = calls, calls.ev, kind
        # The pilot chunk is timed against the loop: torch's forward-AD machinery loads on its first
        # use in the process, before that. Warmed here and not sooner, so that a check without forward
        # AD never pays for it.
        warm_functorch("jvp")
        self.refs = float_outputs(as_tuple(ref_outputs))
        self.layout = _TangentLayout.of(calls.inputs, idxs)
        self.x0: torch.Tensor = calls.inputs[idxs[0]]
        if kind == "jvp_func":
            columns = _functorch_columns(calls, idxs)
            self.vmapped: Callable[..., Any] = functools.partial(self.ev.vmap, columns)
        elif legacy_vmap is not None:
            self.vmapped = legacy_vmap(legacy_tangents(calls, idxs))
        else:  # pragma: no cover - depends on the torch release
            raise RuntimeError("no legacy vmap in this torch release")
        self.plain_per_column: float | None = None
        total = self.layout.total
        direction = torch.rand(total, generator=torch.Generator().manual_seed(total), dtype=torch.float64)
        self.direction = direction.to(dtype=self.layout.dtype, device=self.x0.device)

    def run(self) -> list[list[torch.Tensor]]:
        layout = self.layout
        out_elems = sum(o.numel() for o in self.refs)
        chunk = self.ev.chunk(layout.total, layout.total + out_elems, self.x0.element_size())
        results = [o.new_empty((layout.total, o.numel())) for o in self.refs]
        schedule = Schedule(layout.total, chunk)
        for start, stop, growing in schedule:
            self._chunk(schedule, results, start, stop, growing)
        return [[out[off : off + n] for out in results] for off, n in zip(layout.offsets, layout.sizes)]

    def _chunk(self, schedule: Schedule, results: list[torch.Tensor], start: int, stop: int, growing: bool) -> None:
        ev, layout = self.ev, self.layout
        b, probe = stop - start, start == 0
        t = one_hot_rows(b + probe, layout.total, start, self.x0, dtype=layout.dtype)
        if probe:  # one extra row: a dense random direction over every input (see ForwardCalls.along)
            t[b] = self.direction
        timed = probe or (growing and self.plain_per_column is not None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res, seconds = (ev.timed if timed else untimed)(self.vmapped, *layout.split(t))
        ev.stats.batched_jvp_calls += 1
        res = as_tuple(res)
        if len(res) != len(self.refs):
            raise Disagreement("number of outputs changed under vmap")
        for r, out in zip(res, results):
            out[start:stop].copy_(r[:b].detach().reshape(b, -1))
        if probe:
            ref, self.plain_per_column = ev.timed(self.calls.along, layout, self.direction)
            for got, want in zip([r[b] for r in res], ref):
                if not close(got, want):
                    raise Disagreement("batched JVP differs from the plain JVP")
            ev.judge_batch(self.kind, schedule, seconds / (b + 1), self.plain_per_column, stop < layout.total)
        elif growing and self.plain_per_column is not None:
            ev.judge_batch(self.kind, schedule, seconds / b, self.plain_per_column, stop < layout.total)
