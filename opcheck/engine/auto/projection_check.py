"""fast_mode="auto"'s step-by-step projection check: its JVP and VJP stages, the sources of J·U they
try in order, and a failure's report (the entries bisection pins, or the failing block in full).

What it checks and guarantees is stepwise.py's docstring; stepwise.auto_check runs it beyond the
full check's size, and where a function that cannot be vmapped makes the projections cheaper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NoReturn

import torch

from opcheck._records import record
from opcheck.engine._util import (
    allclose_promoted,
    diff_input_indices,
    float_outputs,
    identical,
    is_float_or_complex,
    unravel,
)
from opcheck.engine.auto.pinpoint import Bisection, elements_out_of_tolerance, vjp_mismatch_element
from opcheck.engine.auto.projections import (
    JVP_STAGE,
    VJP_STAGE,
    PinnedEntry,
    ProjectionEntry,
    ProjectionMismatch,
    vjp_jvp_pairs,
    worst_positions,
)
from opcheck.engine.auto.sources import (
    PerInputOutput,
    Projection,
    Unavailable,
    backward_rows,
    double_backward,
    jvp_all,
    jvp_along,
    numerical_along,
    reduce_rows,
    rows_along,
)
from opcheck.engine.batching import vjp_batch
from opcheck.engine.comparison.compare import Part, block_mismatch
from opcheck.engine.comparison.complex_views import RealViews, real_views
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.errors import fast_fail_slow_ok_note
from opcheck.engine.evaluation.analytical import analytical_jvp_jacobian, analytical_vjp_jacobian, fail_reentrancy
from opcheck.engine.evaluation.numerical import numerical_jacobian
from opcheck.engine.reporting import torch_words
from opcheck.engine.reporting.pattern_hints import swapped_in_projections, swapped_message
from opcheck.failure_facts import hint_lines

__all__ = ["projection_check"]


def projection_check(ctx: CheckContext, call: Call, part: Part, full_decides: bool = False) -> bool:
    """The projection check of one call (step by step); `full_decides`: the caller runs the full
    check where it fails, so a failing block is not recomputed in full here."""
    inputs, func_out = call.inputs, call.func_out
    diff = diff_input_indices(inputs)
    views = None
    if any(inputs[j].is_complex() for j in diff) or any(o.is_complex() for o in float_outputs(func_out)):
        func, real_inputs, views = real_views(call.func, func_out, inputs, diff)
        call = Call.of(func, real_inputs)
    return _ProjectionCheck(Projection.of(ctx, call), part, views, full_decides).run()


@record
class _Found:
    """A projection comparison of block (output i, input diff[jj]) out of tolerance, and what it says."""

    i: int
    jj: int
    comparison: str  # JVP_STAGE or VJP_STAGE
    source: str  # where J·U came from
    analytical: torch.Tensor
    numerical: torch.Tensor
    bad: torch.Tensor
    worst: tuple[ProjectionEntry, ...]
    hints: tuple[str, ...]


_Sources = tuple[tuple[str, Callable[[Projection], PerInputOutput]], ...]
_BACKWARD_SOURCES: _Sources = (
    ("forward AD", jvp_all),
    ("the VJP of the VJP", double_backward),
    ("VJP rows", rows_along),
)
"""The sources of J·U for the backward check, in the order they are tried."""

FULL_BLOCK_ELEMENTS = 512
"""A failing block that fits the budget (of a call beyond it) is recomputed in full, for the full
check's report, only while the op's calls batch or its rows and columns together are at most this
many: unbatched, its rows take a backward each and its columns two calls each, which would make a
failure cost many times a pass; a larger block's report is the projections' (the entries found)."""

CONFIRMING_ROWS = 8
"""Where the VJP of the VJP disagrees with finite differences, backward's own rows at up to this many
of those output elements (per output) are taken first: one batch of rows, where every row of J takes
m; a disagreement there fails the check with what it found, and only agreement (a backward that is
right, a double backward that is not) takes every row, these few rows more."""


class _ProjectionCheck:
    """One projection check: its stages in order, and its report."""

    def __init__(self, p: Projection, what: Part, views: RealViews | None, full_decides: bool):
        self.p, self.ctx, self.what, self.views = p, p.ctx, what, views
        self.full_decides = full_decides  # the caller runs the full check on a failure: no block recomputed
        self._rows: dict[tuple[int, tuple[int, ...]], list[torch.Tensor | None]] = {}
        # What a failure's bisection (pinpoint.py) starts from: the finite differences along U, and
        # the J·U the VJP stage compared backward with.
        self._numerical: PerInputOutput = []
        self._ju: PerInputOutput = []

    def run(self) -> bool:
        p, stats = self.p, self.p.ev.stats
        numerical = [numerical_along(p, jj) for jj in range(len(p.diff))]  # [input][output] (k, m)
        self._numerical = numerical
        if not p.call.outputs:
            return self._no_differentiable_outputs(numerical)
        if self.what.forward:
            stats.auto_paths.append(f"projected (J·U from forward AD{self._path_note})")
            analytical = [jvp_along(p, jj, strict=True) for jj in range(len(p.diff))]
            self._jvp_stage(analytical, numerical, "forward AD")
            return True
        for name, make in _BACKWARD_SOURCES:
            try:
                analytical = make(p)
            except Unavailable as e:
                stats.fallbacks.append(f"auto J·U from {name}: {e}")
                continue
            if name == "VJP rows":  # built from backward itself: a disagreement is backward's
                stats.auto_paths.append(f"projected (J·U from {name}{self._path_note})")
                self._jvp_stage(analytical, numerical, name)
                break
            if self._first_mismatch(analytical, numerical, name) is None:
                stats.auto_paths.append(f"projected (J·U from {name}{self._path_note})")
                break
            stats.fallbacks.append(f"auto J·U from {name}: disagrees with finite differences")
            if name == "the VJP of the VJP":
                self._confirm_with_rows(analytical, numerical)  # raises where backward's rows disagree too
        self._vjp_stage(analytical, name)
        return True

    @property
    def _path_note(self) -> str:
        return "; complex as view_as_real" if self.views else ""

    # -------------------------------------------------------------- JVP stage
    def _first_mismatch(
        self, analytical: PerInputOutput, numerical: PerInputOutput, source: str
    ) -> tuple[int, int, torch.Tensor, torch.Tensor] | None:
        """The first block whose J·U differs entrywise from finite differences: (i, jj, a, n), or None."""
        flags = self.ctx.flags
        for i in range(len(self.p.call.outputs)):
            for jj in range(len(self.p.diff)):
                a, n = analytical[jj][i], numerical[jj][i].to(analytical[jj][i].device)
                if a.shape != n.shape:
                    raise AssertionError(f"J·U from {source} has shape {tuple(a.shape)}, expected {tuple(n.shape)}")
                where = self.what.block(i, jj).named(self.ctx, f"J·U from {source}")
                if not allclose_promoted(a, n, flags.rtol, flags.atol, where=where):
                    return i, jj, a, n
        return None

    def _confirm_with_rows(self, analytical: PerInputOutput, numerical: PerInputOutput) -> None:
        """Backward's own rows at the output elements (up to CONFIRMING_ROWS per output) where
        `analytical` disagrees with finite differences: where they disagree too, the JVP stage fails
        on them (the failing part and pair, and the entries found, the other elements taken as
        agreeing), without every row of J; where they agree, the caller takes every row."""
        flags, outputs = self.ctx.flags, self.p.call.outputs
        if not self.p.diff:
            return
        elements = []
        for i in range(len(outputs)):
            bad = torch.zeros(numerical[0][i].shape[1], dtype=torch.bool)
            for jj in range(len(self.p.diff)):
                a, n = analytical[jj][i], numerical[jj][i].to(analytical[jj][i].device)
                bad |= (~((a - n).abs() <= flags.atol + flags.rtol * n.abs())).any(dim=0).cpu()
            elements.append(bad.nonzero().reshape(-1)[:CONFIRMING_ROWS].tolist())
        if not any(elements):
            return
        try:
            raw = [self._backward_rows(i, wanted) for i, wanted in enumerate(elements)]
        except Exception:  # noqa: BLE001 - the rows' own source (every row) says what is wrong
            return
        rows = [
            [reduce_rows(self.p, jj, raw[i][jj], len(elements[i])) for i in range(len(outputs))]
            for jj in range(len(self.p.diff))
        ]
        found_rows = []
        for jj in range(len(self.p.diff)):
            blocks = []
            for i in range(len(outputs)):
                block = numerical[jj][i].to(rows[jj][i].device).clone()
                block[:, elements[i]] = rows[jj][i].to(block.dtype)
                blocks.append(block)
            found_rows.append(blocks)
        if self._first_mismatch(found_rows, numerical, "VJP rows") is None:
            return
        checked = sum(len(e) for e in elements)
        # Where the VJP of the VJP is backward's own J·U at every element checked, it stands for every
        # row (the report then has every entry, and a swap of gradients shows); else the rows checked.
        same = all(
            allclose_promoted(rows[jj][i], analytical[jj][i][:, elements[i]], flags.rtol, flags.atol)
            for jj in range(len(self.p.diff))
            for i in range(len(outputs))
        )
        source = (
            "the VJP of the VJP, which backward's rows match where they were taken"
            if same
            else f"VJP rows at the {checked} output element(s) first out of tolerance"
        )
        self.p.ev.stats.auto_paths.append(f"projected (J·U from {source}{self._path_note})")  # as the rows' own
        self._jvp_stage(analytical if same else found_rows, numerical, source)

    def _backward_rows(self, i: int, wanted: list[int]) -> list[torch.Tensor | None]:
        """backward_rows, once per output and elements: the rows that confirm a failure pin it too."""
        key = (i, tuple(wanted))
        if key not in self._rows:
            self._rows[key] = backward_rows(self.p, i, wanted)
        return self._rows[key]

    def _jvp_stage(self, analytical: PerInputOutput, numerical: PerInputOutput, source: str) -> None:
        """Every J·U entry against its finite difference; raises at the first block out of tolerance."""
        found = self._first_mismatch(analytical, numerical, source)
        if found is None:
            return
        i, jj, a, n = found
        allowed = self.ctx.flags.atol + self.ctx.flags.rtol * n.abs()
        err = (a - n).abs()
        bad = ~(err <= allowed)
        shape = tuple(self.p.call.outputs[i].shape)
        worst = tuple(
            ProjectionEntry(
                unravel(col, shape),
                None,
                r,
                a[r, col].item(),
                n[r, col].item(),
                err[r, col].item(),
                allowed[r, col].item(),
            )
            for r, col in worst_positions(err, allowed, bad)
        )
        bad_out = bad.any(dim=0).nonzero().reshape(-1).tolist()
        hints = [
            f"{len(bad_out)} output element(s) have a wrong J·U; the first: "
            + ", ".join(str(list(unravel(c, shape))) for c in bad_out[:8])
        ]
        if int(bad.all(dim=0).sum()) == len(bad_out):
            hints.append("each of them is wrong in every direction: the error sits in those output rows of J")
        self._fail(_Found(i, jj, JVP_STAGE, source, a, n, bad, worst, tuple(hints)))

    # -------------------------------------------------------------- VJP stage
    def _vjp_stage(self, analytical: PerInputOutput, source: str) -> None:
        """(Jᵀv)·u against vᵀ(Ju) for every pair, per block; the VJP computed twice (reentrancy)."""
        p, ev = self.p, self.p.ev
        self._ju = analytical
        diff_inputs = [p.call.inputs[j] for j in p.diff]
        for i, (o, V) in enumerate(zip(p.call.outputs, p.V)):
            first = vjp_batch(ev, [o], diff_inputs, [V])
            # A second pass on the same path: batched and looped VJPs may differ in the last bit.
            second = vjp_batch(ev, [o], diff_inputs, [V], batched=ev.batch_vjp)
            self._check_vjp_values(first, second, diff_inputs)
            kv = V.shape[0]
            v = V.reshape(kv, -1)
            for jj, g in enumerate(first):
                x, U = diff_inputs[jj], p.U[jj].reshape(p.U[jj].shape[0], -1)
                g = x.new_zeros((kv, x.numel())) if g is None else g.reshape(kv, -1)
                lhs, rhs, err, allowed, bad = vjp_jvp_pairs(v, analytical[jj][i], g, U, self.ctx.flags.nondet_tol)
                if bad.any():
                    worst = tuple(
                        ProjectionEntry(
                            None, c, r, rhs[c, r].item(), lhs[c, r].item(), err[c, r].item(), allowed[c, r].item()
                        )
                        for c, r in worst_positions(err, allowed, bad)
                    )
                    hint = (
                        f"J·U from {source} matches finite differences entrywise, and backward's JᵀV "
                        "disagrees with it beyond rounding: backward is wrong somewhere in this block "
                        "(or the JVP is, by less than atol + rtol * |numerical|)"
                    )
                    self._fail(_Found(i, jj, VJP_STAGE, source, rhs, lhs, bad, worst, (hint,)))

    def _check_vjp_values(
        self, first: list[torch.Tensor | None], second: list[torch.Tensor | None], diff_inputs: list[torch.Tensor]
    ) -> None:
        ctx = self.ctx
        for g, x in zip(first, diff_inputs):
            if g is not None and g.dtype != x.dtype:
                ctx.fail_gradient_dtype()
        nondet_tol = ctx.flags.nondet_tol
        for k, (a, b) in enumerate(zip(first, second)):
            if a is not None and b is not None and a.numel() and not identical(a, b):
                if (a - b).abs().max() > nondet_tol:
                    fail_reentrancy(ctx, nondet_tol, a, b, k, block=False)

    # ------------------------------------------------------------- reporting
    def _fail(self, found: _Found) -> NoReturn:
        """Raise: the block in full when it fits the budget, else the projection entries."""
        p, ctx = self.p, self.ctx
        x, o = p.call.inputs[p.diff[found.jj]], p.call.outputs[found.i]
        n_float_out = sum(t.numel() for t in float_outputs(p.call.func_out))
        swapped = None if self.full_decides else self._swapped_with(found)
        fits = x.numel() * max(n_float_out, o.numel()) <= ctx.flags.jacobian_budget
        batched = self.p.ev.batch_forward and self.p.ev.batch_vjp  # rows and columns in a few calls
        small = x.numel() + o.numel() <= FULL_BLOCK_ELEMENTS or batched
        if not self.full_decides and fits and small:
            self._fail_in_full(found, swapped)
        pinned = self._pin(found) if self.full_decides else ()
        hints = found.hints if swapped is None else (swapped_message(found.jj, swapped),)
        why = "within the budget" if self.full_decides else "beyond the budget"
        if not self.full_decides and fits and not small:
            why = (
                "within the budget, but the op cannot be batched, where recomputing it takes a backward per "
                "output element and two calls per input element (fast_mode=False gives the full report)"
            )
        block = self.what.block(found.i, found.jj)
        label = block.label(ctx, self._part(found.i))
        named = label.named_inputs if swapped is None else (*label.named_inputs, swapped)
        mismatch = ProjectionMismatch(
            **{**label.label_fields(), "named_inputs": named},
            input_shape=tuple(x.shape),
            output_shape=tuple(o.shape),
            atol=ctx.flags.atol,
            rtol=ctx.flags.rtol,
            mismatched=int(found.bad.sum()),
            total=found.bad.numel(),
            hints=hints + tuple(self._view_hints(found)),
            analytical=found.analytical,
            numerical=found.numerical,
            comparison=found.comparison,
            source=found.source,
            worst=found.worst,
            not_recomputed=why,
            pinned=pinned,
        )
        ctx.fail(f"{block.first_line()}\n{mismatch.describe()}", check=label.check, path=label.path, mismatch=mismatch)

    def _pin(self, found: _Found) -> tuple[PinnedEntry, ...]:
        """Entries of a block out of tolerance in the JVP stage that the full check fails too, by
        bisection (pinpoint.py); () where none is found, and then the full check decides.

        The stage's J·U there is backward's own rows (the VJP of the VJP only where backward's rows
        match it) or, in the forward-AD check, forward AD: the analytical entries the full check
        compares. Not for complex functions, seen through real views here and compared by modulus
        there, nor for sparse and MKLDNN inputs, whose full check moves only their specified values
        and takes its rows from the call as given (layouts.py): there the full check decides.
        """
        if self.views is not None or (self.ctx.layouts is not None and self.ctx.layouts.stand_ins):
            return ()
        i, jj, flags = found.i, found.jj, self.ctx.flags
        rows: torch.Tensor | None
        try:
            if found.comparison == VJP_STAGE:  # first the output element whose backward row is off
                worst = found.worst[0]
                assert worst.cotangent is not None
                pair = (worst.cotangent, worst.direction)
                ju = self._ju[jj][i]
                error = float(found.analytical[pair] - found.numerical[pair])
                elements = [vjp_mismatch_element(self.p, i, jj, pair, ju[pair[1]], error)]
                analytical, numerical = ju.clone(), self._numerical[jj][i]
                rows = self._rows_of(i, jj, elements)
                analytical[:, elements] = reduce_rows(self.p, jj, rows, 1).to(analytical)
            else:
                analytical, numerical = found.analytical, found.numerical
                elements = elements_out_of_tolerance(analytical, numerical, flags.atol, flags.rtol)
                rows = None if self.what.forward else self._rows_of(i, jj, elements)
            return Bisection(self.p, i, jj, elements, rows).pin(analytical, numerical)
        except Exception:  # noqa: BLE001 - the full check decides, and says what raised in its own words
            return ()

    def _rows_of(self, i: int, jj: int, elements: list[int]) -> torch.Tensor:
        """Backward's rows at `elements` of output i for input diff[jj]; zero where it gets no gradient."""
        x = self.p.call.inputs[self.p.diff[jj]]
        rows = self._backward_rows(i, elements)[jj]
        return x.new_zeros((len(elements), x.numel())) if rows is None else rows

    def _part(self, i: int) -> str | None:
        # The output's index decides, in the forward check too (where it names an input's part).
        if self.what.complex_indices and i in self.what.complex_indices:
            return "imaginary" if self.what.test_imag else "real"
        return None

    def _view_hints(self, found: _Found) -> list[str]:
        return self.views.hints(self.p.diff[found.jj], self.p.positions[found.i]) if self.views else []

    def _fail_in_full(self, found: _Found, swapped: int | None) -> None:
        """Raise the full check's report of the block, when it can be computed (else return).

        swapped: the input whose gradient the projections say this one got; its block, of the same
        size, is recomputed too, so that the full report names the swap as the full check does.
        """
        block = self._full_block(found.i, found.jj)
        if block is None:
            return
        p, ctx, flags = self.p, self.ctx, self.ctx.flags
        fa, fn_ = block
        others: list[torch.Tensor | None] = [None] * len(p.diff)
        if swapped is not None:
            try:
                others[swapped] = self._numerical_block(found.i, swapped)
            except Exception:  # the report stands without the hint
                pass
        mismatch = block_mismatch(ctx, self.what.block(found.i, found.jj), fa, fn_, p.call, others)
        extra = ""
        if allclose_promoted(fa, fn_.to(fa.device), flags.rtol, flags.atol):
            extra = "\n" + fast_fail_slow_ok_note("auto")
            if found.comparison == VJP_STAGE:
                extra += " The VJP disagrees with the JVP beyond rounding: one of them is slightly off."
        view_hints = tuple(self._view_hints(found))
        views = "".join(f"\n{line}" for line in hint_lines(view_hints))
        head = f"auto: {found.comparison} (J·U from {found.source}) found a mismatch"
        self.p.ev.stats.failed_path = f"projected (J·U from {found.source})"
        ctx.fail(
            f"{self.what.block(found.i, found.jj).first_line()}\n{head}; the block fits the budget, recomputed in "
            f"full:\n{mismatch.describe()}{views}{extra}",
            check=mismatch.check,
            path=mismatch.path,
            mismatch=mismatch,
            facts=mismatch.facts().adding(hints=view_hints),
        )

    def _full_block(self, i: int, jj: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(analytical, numerical) of one block, by the full check's code; None if that fails."""
        ctx, call, j, forward = self.ctx, self.p.call, self.p.diff[jj], self.what.forward
        only = self.p.only(j)
        fi = self._float_index(i)
        try:
            numerical = self._numerical_block(i, jj)
            if forward:
                analytical = analytical_jvp_jacobian(ctx, call.func, only, call.func_out)[0][fi]
            else:
                analytical = analytical_vjp_jacobian(ctx, (call.inputs[j],), call.outputs[i], nondet_tol=float("inf"))[
                    0
                ]
        except Exception:  # the projection report below still stands
            return None
        return analytical, numerical

    def _float_index(self, i: int) -> int:
        """Output i's index among the call's float outputs (the numerical Jacobian's numbering)."""
        return [q for q, t in enumerate(self.p.call.func_out) if is_float_or_complex(t)].index(self.p.positions[i])

    def _numerical_block(self, i: int, jj: int) -> torch.Tensor:
        """The numerical Jacobian block of output i and input diff[jj], by the full check's code."""
        call, forward = self.p.call, self.what.forward
        only = self.p.only(self.p.diff[jj])
        return numerical_jacobian(self.ctx, call.func, only, call.func_out, is_forward_ad=forward)[0][
            self._float_index(i)
        ]

    def _swapped_with(self, found: _Found) -> int | None:
        """The input (its position in p.diff) whose gradient input diff[found.jj] got, as projections show.

        Run on a failure only, and only for inputs of input diff[found.jj]'s shape, dtype and device:
        each costs the finite differences of its block along input diff[found.jj]'s directions (2k
        evaluations), compared as the failed stage compares: entrywise for J·U, through the cotangents
        for the VJP stage, every difference allowed atol + rtol * |numerical|.
        """
        p, flags = self.p, self.ctx.flags
        x = p.call.inputs[p.diff[found.jj]]
        others: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for kk, k in enumerate(p.diff):
            y = p.call.inputs[k]
            if kk == found.jj or y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
                others.append(None)
                continue
            along = replace(p, U=[p.U[found.jj] if q == kk else u for q, u in enumerate(p.U)])
            try:
                n = numerical_along(along, kk)[found.i]
            except Exception:  # the report stands without the hint
                others.append(None)
                continue
            allowed = flags.atol + flags.rtol * n.abs()
            if found.comparison == VJP_STAGE:
                v = p.V[found.i].reshape(p.V[found.i].shape[0], -1)
                n, allowed = v @ n.t(), v.abs() @ allowed.t()
            others.append((n, allowed))
        return swapped_in_projections(found.analytical, found.jj, found.numerical, others)

    def _no_differentiable_outputs(self, numerical: PerInputOutput) -> bool:
        for per_input in numerical:
            for t in per_input:
                if t.numel() and bool(torch.ne(t, 0).any()):
                    self.ctx.fail(
                        f"{torch_words.no_differentiable_outputs()}\ncheck: no differentiable "
                        "outputs; the outputs do not require grad, yet they change along random "
                        "input directions",
                        check="no differentiable outputs",
                        path=self.ctx.backward_path,
                    )
        return True
