"""Central differences by plain calls: the one routine every check's loop uses, and its columns.

(f(x + δ) - f(x - δ)) / 2eps, with x moved in place as torch.autograd.gradcheck moves it: an
element (a column of the Jacobian), or a whole input along a direction (fast mode, and the
projections of fast_mode="auto"). The vmapped form of the same differences is fd_columns.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opcheck._records import record
from opcheck.engine._util import Func, unravel
from opcheck.engine.batching.evaluator import Evaluator
from opcheck.engine.reporting import torch_words

NeighbourhoodCheck = Callable[..., None]
"""check(output1, output2, idx=None): raises when the outputs at x - δ and x + δ differ in shape or dtype."""


def neighbourhood_check(eps: float) -> NeighbourhoodCheck:
    """torch's check that perturbing an input by eps changes neither the outputs' shapes nor dtypes."""

    def check(output1: torch.Tensor, output2: torch.Tensor, idx: tuple[int, ...] | None = None) -> None:
        torch_words.outputs_same_dtype_and_shape(output1, output2, eps, idx)

    return check


def difference_quotient(minus: torch.Tensor, plus: torch.Tensor, eps: float) -> torch.Tensor:
    """(plus - minus) / 2eps: a float or complex one in place, any other (an int output) promoted,
    and a difference of zero tensors (a gradient known to be zero, as sgn's) out of place: zero
    tensors are immutable."""
    if minus.is_floating_point() or minus.is_complex():
        difference = torch.sub(plus, minus)
        return difference.div_(2 * eps) if not torch._is_zerotensor(difference) else difference / (2 * eps)
    return (plus - minus) / (2 * eps)


class InputWritten(Exception):
    """A call of the function changed the input that Differences.along moves."""


@record
class Differences:
    """Central differences of fn at inputs with step eps, by plain calls through ev."""

    ev: Evaluator
    fn: Func
    inputs: Sequence[Any]
    eps: float

    def along(
        self,
        entry: torch.Tensor,
        delta: torch.Tensor | complex,
        *,
        idx: tuple[int, ...] | None = None,
        positions: Sequence[int] | None = None,
    ) -> list[torch.Tensor]:
        """The central difference of fn's outputs (those at `positions`, else all), each flat.

        `entry` is the part of an input that moves (an element, or a whole input's data), by -δ
        and +δ in turn, one plain call each; it is restored even when fn raises. `idx` is the
        element's index in the neighbourhood check's error.
        """
        return self.along_parts([(entry, delta)], idx=idx, positions=positions)

    def along_parts(
        self,
        moves: Sequence[tuple[torch.Tensor, torch.Tensor | complex]],
        *,
        idx: tuple[int, ...] | None = None,
        positions: Sequence[int] | None = None,
        unwritten: bool = False,
    ) -> list[torch.Tensor]:
        """`along`, moving several parts at once, each (entry, δ) by its own -δ, then +δ.
        `unwritten`: raise InputWritten where a call leaves an entry other than it was set (the
        function writes into its input)."""
        check = neighbourhood_check(self.eps)
        origs = [entry.clone() for entry, _ in moves]
        try:
            before = self._at(moves, [o - d for o, (_, d) in zip(origs, moves)], unwritten)
            after = self._at(moves, [o + d for o, (_, d) in zip(origs, moves)], unwritten)
        finally:
            for (entry, _), orig in zip(moves, origs):
                entry.copy_(orig)
        pairs = zip(before, after) if positions is None else ((before[p], after[p]) for p in positions)
        columns = []
        for a, b in pairs:
            check(a, b, idx=idx)
            columns.append(difference_quotient(a.detach(), b.detach(), self.eps).reshape(-1))
        return columns

    def _at(
        self, moves: Sequence[tuple[torch.Tensor, Any]], values: list[torch.Tensor], unwritten: bool
    ) -> tuple[torch.Tensor, ...]:
        for (entry, _), value in zip(moves, values):
            entry.copy_(value)
        outputs = self.ev.call_cloned(self.fn, self.inputs)
        if unwritten and any(not torch.equal(entry, value) for (entry, _), value in zip(moves, values)):
            raise InputWritten("the function wrote into an input it was called on")
        return outputs

    def column(self, idx: int, k: int, p: complex = 1, positions: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Every output's (those at `positions`, else all) central difference along element k of
        input idx (torch's way).

        p is the direction: 1 for a real input and the real part of a complex one, 1j for its
        imaginary part.
        """
        data = self.inputs[idx].data
        entry = data.view(-1)[k] if data.is_contiguous() else data[unravel(k, data.shape)]
        delta = self.eps * p if p != 1 else self.eps
        return self.along(entry, delta, idx=unravel(k, data.shape) if data.dim() else (), positions=positions)

    def columns(self, idx: int, p: complex, positions: list[int] | None = None) -> list[torch.Tensor]:
        """Per output, the (numel_in, numel_out) central differences along every element of input idx.

        `positions` limits the loop to those (flat) elements; the other columns are zero.
        """
        x = self.inputs[idx]
        ks = range(x.numel()) if positions is None else (list(positions) or [0])
        stacked = stack_columns((self.column(idx, k, p) for k in ks), len(ks))
        if positions is None:
            return stacked
        rows = torch.tensor(list(ks), dtype=torch.long)
        full = []
        for col in stacked:
            out = col.new_zeros((x.numel(), *col.shape[1:]))
            if positions:
                out[rows.to(col.device)] = col
            full.append(out)
        return full


def stack_columns(columns: Iterable[list[torch.Tensor]], count: int) -> list[torch.Tensor]:
    """Per output, its `count` columns stacked into (columns, numel_out), each copied into place as
    it is computed: the loop holds one Jacobian, not its columns beside it (on a 74,068-column
    double backward, 3.4 GB of small tensors). Columns that change shape from one to the next are
    stacked as torch.stack stacks them, error included."""
    it = iter(columns)
    first = next(it, None)
    if first is None:
        return []
    out = [c.new_empty((count, *c.shape)) for c in first]
    for o, c in zip(out, first):
        o[0].copy_(c)
    for k, cols in enumerate(it, start=1):
        if len(cols) != len(out) or any(c.shape != o.shape[1:] or c.dtype != o.dtype for c, o in zip(cols, out)):
            done = [[o[j] for o in out] for j in range(k)]
            return [torch.stack(per_output) for per_output in zip(*done, cols, *it)]
        for o, c in zip(out, cols):
            o[k].copy_(c)
    return out
