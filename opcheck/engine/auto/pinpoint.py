"""A failed J·U comparison narrowed down to Jacobian entries that the full check compares.

Within the Jacobian budget `auto` fails exactly where the full check fails. When the projections
find a block whose J·U is out of tolerance, one entry of that block that is out of tolerance as
the full check compares it (the analytical entry against the central difference along that one
input element, at atol + rtol * |numerical|) proves the full check fails too, without the rest of
its n·m entries. This module looks for such an entry by bisection over the input's elements:

- the output elements: up to `ROWS` of those whose J·U is out of tolerance, and their rows of the
  analytical Jacobian (backward's rows eᵣᵀJ, which the caller supplies; in the forward-AD check the
  JVP along each half, one call each);
- the direction: the one the worst projection entry was found along, u;
- each step splits the input elements still in play in two halves, takes the central difference
  along u restricted to the first (two calls; the second half's is the difference from the whole,
  by linearity), and keeps the half where analytical and numerical disagree most, relative to
  the tolerance;
- at the last element c, the full check's own central difference along element c gives the
  numerical column, compared entrywise with the analytical entries at those rows.

A block that fails the VJP stage (backward's JᵀV against a J·U that matched finite differences)
first gets its output element: the cotangent v of the worst pair restricted to half the output
elements still in play, one VJP each, keeping the half that holds more of the pair's error
(Jᵀv)·u - vᵀ(Ju); backward's row at the last one is then bisected over the input as above.

That is 2·ceil(log2 n) + 2 calls of the op for an input of n elements (and ceil(log2 m) + 1
backward calls more for the VJP stage's output element of m), where the full block
takes a backward per output element or two calls per input element. An error spread thinly over
many entries, each within tolerance on its own, leaves no entry to pin: the caller then runs the
full check, which decides.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from opcheck._records import record
from opcheck.engine._util import unravel
from opcheck.engine.auto.projections import PinnedEntry
from opcheck.engine.auto.sources import Projection, jvp_along
from opcheck.engine.batching import Differences

ROWS = 8
"""Output elements (those out of tolerance first) whose analytical rows the bisection follows."""


def elements_out_of_tolerance(analytical: torch.Tensor, numerical: torch.Tensor, atol: float, rtol: float) -> list[int]:
    """The first ROWS output elements (flat) whose J·U (k, m) is out of tolerance in some direction."""
    n = numerical.to(analytical.device)
    bad = ~((analytical - n).abs() <= atol + rtol * n.abs())
    return bad.any(dim=0).nonzero().reshape(-1)[:ROWS].cpu().tolist()


@record(frozen=False)
class Bisection:
    """One block's bisection: output i of the projection, input p.diff[jj].

    rows: backward's rows at `elements` ((len(elements), n)), or None in the forward-AD check,
    where the analytical side along each half is a JVP.
    """

    p: Projection
    i: int
    jj: int
    elements: list[int]
    rows: torch.Tensor | None

    def pin(self, analytical: torch.Tensor, numerical: torch.Tensor) -> tuple[PinnedEntry, ...]:
        """Entries of the block out of tolerance as the full check compares them; () if none is found.

        analytical / numerical: the block's J·U (k, m) and its finite differences.
        """
        if not self.elements:
            return ()
        direction = self._direction(analytical, numerical)
        u = self.p.U[self.jj][direction].reshape(-1)
        alive = torch.arange(u.numel())
        a = analytical[direction].to(numerical.dtype)
        n = numerical[direction].to(a.device)
        while alive.numel() > 1:
            half = alive[: alive.numel() // 2]
            a1, n1 = self._along(u, half)
            if self._excess(a - a1, n - n1) > self._excess(a1, n1):
                alive = alive[alive.numel() // 2 :]
                a, n = a - a1, n - n1
            else:
                alive, a, n = half, a1, n1
        return self._compare_column(int(alive[0]))

    def _direction(self, analytical: torch.Tensor, numerical: torch.Tensor) -> int:
        """The direction of the worst projection entry at the elements followed."""
        cols = torch.tensor(self.elements, device=analytical.device)
        a, n = analytical[:, cols], numerical.to(analytical.device)[:, cols].to(analytical.dtype)
        flags = self.p.ctx.flags
        ratio = torch.nan_to_num((a - n).abs() / (flags.atol + flags.rtol * n.abs()), nan=math.inf)
        return int(ratio.amax(dim=1).argmax())

    def _excess(self, a: torch.Tensor, n: torch.Tensor) -> float:
        """How far out of tolerance the followed elements are along a part of u: max |a - n| / allowed."""
        cols = torch.tensor(self.elements, device=a.device)
        a, n = a[cols], n[cols]
        flags = self.p.ctx.flags
        ratio = torch.nan_to_num((a - n).abs() / (flags.atol + flags.rtol * n.abs()), nan=math.inf)
        return float(ratio.max())

    def _along(self, u: torch.Tensor, part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(analytical, numerical) derivative of output i along u restricted to the elements `part`."""
        p, j = self.p, self.p.diff[self.jj]
        x = p.call.inputs[j]
        restricted = torch.zeros_like(u)
        restricted[part] = u[part]
        restricted = restricted.view(x.shape)
        diffs = Differences(p.ev, p.call.func, p.call.inputs, p.ctx.flags.eps)
        n = diffs.along(x.data, p.ctx.flags.eps * restricted, positions=[p.positions[self.i]])[0]
        if self.rows is None:
            along = _one_direction(p, self.jj, restricted)
            a = jvp_along(along, self.jj, strict=True)[self.i][0]
        else:
            a = torch.zeros_like(n, dtype=self.rows.dtype)
            a[torch.tensor(self.elements, device=a.device)] = self.rows[:, part] @ u[part].to(self.rows)
        return a.to(n.dtype), n

    def _compare_column(self, c: int) -> tuple[PinnedEntry, ...]:
        """The full check's comparison of column c (input element c) at the rows known."""
        p, j = self.p, self.p.diff[self.jj]
        x, o = p.call.inputs[j], p.call.outputs[self.i]
        diffs = Differences(p.ev, p.call.func, p.call.inputs, p.ctx.flags.eps)
        numerical = diffs.column(j, c, positions=[p.positions[self.i]])[0]
        if self.rows is None:
            e = torch.zeros(x.numel(), dtype=x.dtype, device=x.device)
            e[c] = 1
            analytical = jvp_along(_one_direction(p, self.jj, e.view(x.shape)), self.jj, strict=True)[self.i][0]
            at = list(range(o.numel()))
        else:
            analytical, at = self.rows[:, c], self.elements
            numerical = numerical[torch.tensor(at, device=numerical.device)]
        dtype = torch.promote_types(analytical.dtype, numerical.dtype)
        a, n = analytical.to(dtype).cpu(), numerical.to(dtype).cpu()
        flags = p.ctx.flags
        err, allowed = (a - n).abs(), flags.atol + flags.rtol * n.abs()
        out = torch.nonzero(~(err <= allowed)).reshape(-1).tolist()
        return tuple(
            PinnedEntry(
                unravel(at[q], tuple(o.shape)),
                unravel(c, tuple(x.shape)),
                a[q].item(),
                n[q].item(),
                err[q].item(),
                allowed[q].item(),
            )
            for q in out
        )


def _one_direction(p: Projection, jj: int, u: torch.Tensor) -> Projection:
    """The projection with input diff[jj]'s directions replaced by the single direction u."""
    return replace(p, U=[u[None] if q == jj else d for q, d in enumerate(p.U)])


def vjp_mismatch_element(p: Projection, i: int, jj: int, pair: tuple[int, int], ju: torch.Tensor, error: float) -> int:
    """The output element (flat) of output i that holds the most of the VJP stage's error at the pair
    (cotangent, direction): error = (Jᵀv)·u - vᵀ(Ju) for input diff[jj], ju being J·u (m) from the
    J·U source. One VJP per halving."""
    o = p.call.outputs[i]
    v = p.V[i][pair[0]].reshape(-1)
    u = p.U[jj][pair[1]].reshape(-1)
    ju = ju.to(v)
    diff_inputs = [p.call.inputs[j] for j in p.diff]
    alive = torch.arange(v.numel())
    while alive.numel() > 1:
        half = alive[: alive.numel() // 2]
        restricted = torch.zeros_like(v)
        restricted[half] = v[half]
        g = p.ev.vjp(o, diff_inputs, restricted.view(o.shape))[jj]
        first = (0.0 if g is None else float(g.reshape(-1).to(u) @ u)) - float(restricted @ ju)
        if abs(error - first) > abs(first) or math.isnan(error - first):
            alive, error = alive[alive.numel() // 2 :], error - first
        else:
            alive, error = half, first
    return int(alive[0])
