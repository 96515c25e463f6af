"""The analytical Jacobian's rows from backward: e_jᵀ J for every output element j.

Batched, a chunk of rows is one backward with is_grads_batched; the first chunk is probed by one
plain backward along a dense random combination of its rows (a one-hot probe would see one row
only) and timed against it. Otherwise, torch's loop: one backward per row.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from opcheck.engine._util import autograd_grad, batched_grad
from opcheck.engine.batching import settings
from opcheck.engine.batching.agreement import Disagreement, close, combination_close
from opcheck.engine.batching.evaluator import Evaluator, untimed
from opcheck.engine.batching.schedule import OneHotRows, Schedule
from opcheck.engine.reporting import torch_words

LoopRows = list[list[torch.Tensor | None]]
"""Per input, the rows as backward returned them (None where it returned none)."""
BatchedRows = list[torch.Tensor | None]
"""Per input, its (numel_out, *input.shape) rows, or None where backward does not reach it."""


def vjp_rows(
    ev: Evaluator,
    output: torch.Tensor,
    diff_inputs: Sequence[torch.Tensor],
    nondet_tol: float,
    batched: bool | None = None,
) -> BatchedRows | LoopRows:
    """Rows e_j^T J for every output element j: per input, a (numel_out, *input.shape) tensor or None.

    With the loop, the per-input entry is a list of row tensors (or None) as torch builds them, so
    the caller's size/dtype checks see exactly what backward returned. `batched` forces the path
    (the reentrancy check compares two passes, which must be computed the same way).
    """
    if batched is False:
        return vjp_loop(ev, output, diff_inputs)
    if (batched or ev.batch_vjp) and output.numel() >= settings.MIN_BATCH_COLUMNS:
        try:
            return _BatchedRows(ev, output, diff_inputs, nondet_tol).run()
        except Exception as e:
            ev.give_up("vjp", e)
    return vjp_loop(ev, output, diff_inputs)


def vjp_loop(ev: Evaluator, output: torch.Tensor, diff_inputs: Sequence[torch.Tensor]) -> LoopRows:
    """torch's rows: one backward per output element, along a one-hot grad_output."""
    base = torch.zeros_like(output, memory_format=torch.legacy_contiguous_format)
    flat = base.view(-1)
    rows: LoopRows = [[] for _ in diff_inputs]
    for j in range(flat.numel()):
        flat.zero_()
        flat[j] = 1.0
        grads = ev.vjp(output, diff_inputs, base)
        for i, g in enumerate(grads):
            rows[i].append(g.clone() if isinstance(g, torch.Tensor) else None)
    return rows


class _BatchedRows:
    """The rows of one output, a chunk of rows per batched backward."""

    def __init__(self, ev: Evaluator, output: torch.Tensor, diff_inputs: Sequence[torch.Tensor], nondet_tol: float):
        self.ev, self.output, self.diff_inputs, self.nondet_tol = ev, output, diff_inputs, nondet_tol
        self.m = output.numel()
        self.out: BatchedRows = [None] * len(diff_inputs)
        self.plain_per_column: float | None = None
        self.rows = OneHotRows(self.m, output)

    def run(self) -> BatchedRows:
        ev, m = self.ev, self.m
        chunk = ev.chunk(m, m + sum(t.numel() for t in self.diff_inputs), self.output.element_size())
        earlier = [bounds for o, bounds in ev.vjp_batches if o is self.output]  # the reentrancy pass
        schedule = Schedule(m, chunk)
        used: list[tuple[int, int]] = []
        for start, stop, growing in [(a, z, False) for a, z in earlier[0]] if earlier else schedule:
            used.append((start, stop))
            b = stop - start
            probe = start == 0 and not earlier
            timed = probe or (growing and self.plain_per_column is not None)
            g, grads, t_batched = self._chunk(start, stop, timed)
            if probe:
                self.plain_per_column = self._probe(g, grads)
                ev.vjp_batches.append((self.output, used))
            if timed and self.plain_per_column is not None:
                ev.judge_batch("vjp", schedule, t_batched / b, self.plain_per_column, stop < m)
        return self.out

    def _chunk(self, start: int, stop: int, timed: bool) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...], float]:
        """One batched backward over rows start..stop, stored into self.out: (its one-hot rows, the
        gradients, the seconds it took when timed)."""
        b, m, out = stop - start, self.m, self.out
        g = self.rows.take(b, start)
        grads, seconds = (self.ev.timed if timed else untimed)(
            self.ev.vjp, self.output, self.diff_inputs, g.view(b, *self.output.shape), batched=True
        )
        for i, gr in enumerate(grads):
            if gr is not None and tuple(gr.shape[1:]) != tuple(self.diff_inputs[i].shape):
                raise Disagreement("batched gradient has an unexpected shape")
            if start == 0:
                out[i] = gr if gr is None or b == m else gr.new_empty((m, *gr.shape[1:]))
            elif (gr is None) != (out[i] is None):
                raise Disagreement("gradient defined for some rows only")
            stored = out[i]
            if gr is not None and b != m and stored is not None:
                stored[start:stop].copy_(gr)
        return g, grads, seconds

    def _probe(self, g: torch.Tensor, grads: tuple[torch.Tensor | None, ...]) -> float:
        """A plain backward along a dense random combination of the chunk's rows g, timed: a plain
        backward that differs from the batched one in any row shows (a one-hot probe sees one row).
        Returns its seconds."""
        b, output = g.shape[0], self.output
        w = torch.rand(b, generator=torch.Generator().manual_seed(b), dtype=torch.float64).to(g.dtype)
        ref, t_plain = self.ev.timed(self.ev.vjp, output, self.diff_inputs, (w @ g).view(output.shape))
        for gr, r in zip(grads, ref):
            if (gr is None) != (r is None) or (
                r is not None
                and gr is not None
                and (gr.dtype != r.dtype or not combination_close(w, gr, r, extra_atol=self.nondet_tol * b))
            ):
                raise Disagreement("batched VJP differs from the plain VJP")
        return t_plain


def vjp_batch(
    ev: Evaluator,
    outputs: Sequence[torch.Tensor],
    wrt: Sequence[torch.Tensor],
    cotangents: Sequence[torch.Tensor],
    *,
    probe: bool = True,
    batched: bool | None = None,
) -> list[torch.Tensor | None]:
    """Per tensor in wrt, the (b, *shape) VJPs for b stacked cotangents (None where unused).

    Batched through is_grads_batched when the evaluator allows (probed against a plain VJP), else
    one VJP per cotangent. `batched` forces the path. Every backward gets its own copy of the
    cotangents (a kernel may write into its grad_output; the probe and callers reuse them).
    """
    b = cotangents[0].shape[0]

    def plain(r: int) -> tuple[torch.Tensor | None, ...]:
        ev.stats.vjp_calls += 1
        fresh = [c[r].clone() for c in cotangents]
        return autograd_grad(outputs, wrt, fresh, retain_graph=True)

    if (ev.batch_vjp if batched is None else batched) and b >= 2:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                grads = batched_grad(outputs, wrt, [c.clone() for c in cotangents])
            ev.stats.batched_vjp_calls += 1
            for gr, w in zip(grads, wrt):
                if gr is not None and tuple(gr.shape[1:]) != tuple(w.shape):
                    raise Disagreement("batched gradient has an unexpected shape")
            if probe:
                for gr, r in zip(grads, plain(0)):
                    if (gr is None) != (r is None) or (
                        r is not None and gr is not None and (gr.dtype != r.dtype or not close(gr[0], r))
                    ):
                        raise Disagreement("batched VJP differs from the plain VJP")
            return list(grads)
        except Exception as e:
            if batched:
                raise
            ev.give_up("vjp", e)
    rows = [plain(r) for r in range(b)]
    return [_stacked(wrt[k], [row[k] for row in rows]) for k in range(len(wrt))]


def _stacked(x: torch.Tensor, col: list[torch.Tensor | None]) -> torch.Tensor | None:
    """One input's plain VJPs stacked (zeros where a VJP left it unused), or None where all did."""
    if all(c is None for c in col):
        return None
    for c in col:
        if c is not None and c.shape != x.shape:
            raise AssertionError(
                f"{torch_words.column_size(c.numel(), x.numel())}\n(backward returned a gradient of shape "
                f"{tuple(c.shape)} for an input of shape {tuple(x.shape)})"
            )
    return torch.stack([c if c is not None else torch.zeros_like(x) for c in col])
