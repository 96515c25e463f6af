"""The numerical Jacobian's columns: central differences of many elements in one vmapped call.

A chunk of b columns is one vmapped call on 2b rows (x - δ e_k, then x + δ e_k), plus in the first
chunk a probe row: one plain call at the same point must match it, and is timed against the
batch (see Evaluator's adaptive rule). Where anything fails or disagrees, the plain loop of
finite_differences.py computes every column instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from opcheck._records import record
from opcheck.engine._util import as_tuple, detached, of_inputs, vmap_form
from opcheck.engine.batching import settings
from opcheck.engine.batching.agreement import Disagreement, close, ulps_apart
from opcheck.engine.batching.evaluator import untimed
from opcheck.engine.batching.finite_differences import Differences, difference_quotient
from opcheck.engine.batching.schedule import Schedule

Segment = tuple[int, complex]
"""(input index, perturbation direction): 1 for a real input and for the real part of a complex
one, 1j for the imaginary part."""


def numerical_columns(
    diffs: Differences,
    segments: list[Segment],
    ref_outputs: tuple[torch.Tensor, ...],
    positions: dict[int, list[int]] | None = None,
) -> list[list[torch.Tensor]]:
    """Central differences of every output of fn with respect to each element of some inputs.

    Returns, per segment, a list over all outputs of (numel_in, numel_out) tensors. Up to
    FUSE_MAX_COLUMNS columns, all segments share one vmapped call per chunk. `positions`, per input
    index, limits the loop to those elements (flat); the others' columns are zero (a sparse
    input's unspecified positions, which nothing perturbs).
    """
    ev = diffs.ev
    if ref_outputs and all(isinstance(o, torch.Tensor) and o.numel() == 0 for o in ref_outputs):
        # No output element: every column is empty, and no evaluation can change that.
        return [
            [o.new_zeros((diffs.inputs[idx].numel(), 0), dtype=_difference_dtype(o)) for o in ref_outputs]
            for idx, _ in segments
        ]
    total = sum(diffs.inputs[idx].numel() for idx, _ in segments)
    ev.numerical_batched, ev.numerical_ulps = False, 0.0
    # Without a plain probe call (center_probe) one vmapped call beats the loop from fewer columns.
    # Below that many the loop is the cheaper choice, not a fallback: Evaluator.loop_columns does
    # not bound it.
    few = total < (settings.FUSED_MIN_COLUMNS if ev.center_probe else settings.MIN_BATCH_COLUMNS)
    if ev.batch_forward and not few:
        try:
            if total <= settings.FUSE_MAX_COLUMNS:
                result = _BatchedDifferences(diffs, segments, ref_outputs).run()
            else:
                result = []
                for idx in dict.fromkeys(i for i, _ in segments):
                    own = [sg for sg in segments if sg[0] == idx]
                    result += _BatchedDifferences(diffs, own, ref_outputs).run()
            ev.numerical_batched = True
            return result
        except Exception as e:  # anything: the loop decides what the user sees
            ev.give_up("forward", e)
    if ev.loop_columns is not None and total > ev.loop_columns and not (few and ev.batch_forward):
        raise LoopOverBudget(f"{total} columns, one call pair each, where the caller allows {ev.loop_columns}")
    return [diffs.columns(idx, p, (positions or {}).get(idx)) for idx, p in segments]


class LoopOverBudget(Exception):
    """The columns cannot be batched, and looping over them costs more calls than the caller allows
    (Evaluator.loop_columns)."""


def _delta(eps: float, p: complex) -> complex:
    return eps * p if p != 1 else eps


def _first_directions(segments: Sequence[Segment]) -> list[Segment]:
    """(input index, direction) of the first segment of each input: the probe row moves these."""
    seen: dict[int, complex] = {}
    for idx, p in segments:
        seen.setdefault(idx, p)
    return list(seen.items())


@record
class _ColumnLayout:
    """The columns of all segments, numbered globally: segment s holds columns offsets[s] onwards."""

    segments: list[Segment]
    flats: dict[int, torch.Tensor]  # per input index, its values, flat
    offsets: list[int]
    total: int

    @classmethod
    def of(cls, base: Sequence[torch.Tensor], segments: list[Segment]) -> _ColumnLayout:
        flats = {idx: base[idx].reshape(-1) for idx in sorted({i for i, _ in segments})}
        offsets, total = [], 0
        for idx, _ in segments:
            offsets.append(total)
            total += flats[idx].numel()
        return cls(segments, flats, offsets, total)

    def points(self, start: int, stop: int, rows: int, eps: float, probe_row: bool) -> dict[int, torch.Tensor]:
        """Per input, its (rows, numel) points for columns start..stop: x - δ e_k in rows 0..b, x + δ e_k
        in rows b..2b, and with `probe_row` row 2b with the first element of every input moved at once."""
        b = stop - start
        points: dict[int, torch.Tensor] = {}

        def own(idx: int) -> torch.Tensor:
            if idx not in points:
                points[idx] = self.flats[idx].expand(rows, -1).clone()
            return points[idx]

        for s, (idx, p) in enumerate(self.segments):
            lo, hi = max(start, self.offsets[s]), min(stop, self.offsets[s] + self.flats[idx].numel())
            if lo >= hi:
                continue
            t, delta = own(idx), _delta(eps, p)
            r, c, n = lo - start, lo - self.offsets[s], hi - lo  # rows r.., columns c..: a diagonal each
            t[r : r + n, c : c + n].diagonal().sub_(delta)
            t[b + r : b + r + n, c : c + n].diagonal().add_(delta)
        if probe_row:
            for idx, p in _first_directions(self.segments):
                own(idx)[2 * b, 0] = self.flats[idx][0] + _delta(eps, p)
        for idx in self.flats:  # inputs with no column in this chunk: the same point on every row
            if idx not in points:
                points[idx] = self.flats[idx].expand(rows, -1)
        return points


class _BatchedDifferences:
    """One vmapped computation of the columns of some segments, chunk by chunk."""

    def __init__(self, diffs: Differences, segments: list[Segment], ref_outputs: tuple[torch.Tensor, ...]):
        self.diffs, self.ev, self.eps = diffs, diffs.ev, diffs.eps
        self.refs = list(as_tuple(ref_outputs))
        if not all(isinstance(o, torch.Tensor) for o in self.refs):
            raise Disagreement("non-tensor output")
        self.base = detached(diffs.inputs)
        self.segments = segments
        self.layout = _ColumnLayout.of(self.base, segments)
        self.single = of_inputs(vmap_form(diffs.fn), self.base, list(self.layout.flats))
        self.plain_per_column: float | None = None

    def run(self) -> list[list[torch.Tensor]]:
        layout, refs = self.layout, self.refs
        in_elems = sum(f.numel() for f in layout.flats.values())
        out_elems = sum(o.numel() for o in refs)
        itemsize = max(f.element_size() for f in layout.flats.values())
        chunk = self.ev.chunk(layout.total, 2 * (in_elems + out_elems), itemsize)
        results = [o.new_empty((layout.total, o.numel()), dtype=_difference_dtype(o)) for o in refs]
        # A fused pass's columns (center probe) fit one call up to FUSE_MAX_COLUMNS: a small function,
        # where a pilot batch would only add calls, as nothing is timed against the loop there.
        pilot = not (self.ev.center_probe and layout.total <= settings.FUSE_MAX_COLUMNS)
        schedule = Schedule(layout.total, chunk, pilot=pilot)
        for start, stop, growing in schedule:
            self._chunk(schedule, results, start, stop, growing)
        return [
            [res[layout.offsets[s] : layout.offsets[s] + layout.flats[idx].numel()] for res in results]
            for s, (idx, _) in enumerate(self.segments)
        ]

    def _chunk(self, schedule: Schedule, results: list[torch.Tensor], start: int, stop: int, growing: bool) -> None:
        ev, b, probe = self.ev, stop - start, start == 0
        rows = 2 * b + (1 if probe else 0)
        points = self.layout.points(start, stop, rows, self.eps, probe and not ev.center_probe)
        args = [points[i].view(rows, *self.base[i].shape) for i in self.layout.flats]
        # The clock is read only for what is compared: with a plain probe, batches against the loop;
        # with the center probe (no plain call timed), a growing batch against the one before.
        against_plain = probe and not ev.center_probe
        more = stop < self.layout.total
        compared = against_plain or (growing and (self.plain_per_column is not None or (ev.center_probe and more)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs, t_batched = (ev.timed if compared else untimed)(ev.vmap, self.single, *args)
        ev.stats.batched_calls += 1
        if len(outs) != len(self.refs):
            raise Disagreement("number of outputs changed under vmap")
        for o, ref, res in zip(outs, self.refs, results):
            if o.shape[1:] != ref.shape or o.dtype != ref.dtype:
                raise Disagreement("output shape or dtype changed under perturbation")
            res[start:stop].copy_(difference_quotient(o[:b].detach(), o[b : 2 * b].detach(), self.eps).reshape(b, -1))
        if probe and ev.center_probe:
            if not all(close(o[2 * b], ref.detach()) for o, ref in zip(outs, self.refs)):
                raise Disagreement("vmapped evaluation at the unperturbed point differs from the plain call")
            self._observed([o[2 * b] for o in outs], self.refs)
            if compared:
                schedule.measured_alone(t_batched / b)
        elif probe:
            _, t_plain = ev.timed(self._probe, [o[2 * b] for o in outs])
            # A column is two rows (x - delta e_k and x + delta e_k); the probe evaluated one.
            self.plain_per_column = 2 * t_plain
            ev.judge_batch("forward", schedule, t_batched / b, self.plain_per_column, stop < self.layout.total)
        elif growing and self.plain_per_column is not None:
            ev.judge_batch("forward", schedule, t_batched / b, self.plain_per_column, stop < self.layout.total)
        elif compared and ev.center_probe:
            schedule.measured_alone(t_batched / b)

    def _probe(self, batched_row: list[torch.Tensor]) -> None:
        """One plain call at the probe row's point; the batched row must match it."""
        inputs = self.diffs.inputs
        entries = []
        for idx, p in _first_directions(self.segments):
            data = inputs[idx].data
            entry = data.view(-1)[0] if data.is_contiguous() else data[(0,) * data.dim()]
            entries.append((entry, entry.clone()))
            entry.copy_(entries[-1][1] + _delta(self.eps, p))
        try:
            ref = self.ev.call_cloned(self.diffs.fn, inputs)
        finally:
            for entry, orig in entries:
                entry.copy_(orig)
        for o, r in zip(batched_row, ref):
            if not close(o, r):
                raise Disagreement("vmapped evaluation differs from the plain call")
        self._observed(batched_row, ref)

    def _observed(self, batched_row: Sequence[torch.Tensor], plain: Sequence[torch.Tensor]) -> None:
        ulps = max((ulps_apart(o, r) for o, r in zip(batched_row, plain)), default=0.0)
        self.ev.numerical_ulps = max(self.ev.numerical_ulps, ulps)


def _difference_dtype(output: torch.Tensor) -> torch.dtype:
    """The dtype of an output's central differences: its own, or the default float for an int output."""
    if output.is_floating_point() or output.is_complex():
        return output.dtype
    return torch.promote_types(output.dtype, torch.get_default_dtype())
