"""The evaluations one engine call makes, planned from a probe of the function (probe.py).

An estimate plans here only a function without a stand-in (complex sparse inputs, a second-order
check of sparse inputs, outputs that are not tensors); every other check's plan is the engine's
own check of the function's stand-in, counted (standin.dry_run).

`plan_check(flags, probe)` follows the engine's decisions (opcheck.engine.api._gradcheck and the
passes it runs) as far as a probe can tell them. fast_mode="auto"'s route (which pass first, where a
fallback hands the call, when unbatched columns give way to the projections) is opcheck.engine.route's,
walked here with the probe's answers: its fused passes (the full Jacobian while route.Sizes.full_first,
projections beyond; fast_mode=False's full check fused likewise, route.full_mode_fused), and where the
pass does not apply (complex or sparse inputs) or cannot batch what it needs (no vmap rule, no
forward AD, no batched backward), the step-by-step check, whose loops make one call per Jacobian
column (two forwards) or row (one backward). The batches' sizes follow the engine's schedule
(memory-bounded chunks, a pilot batch, growth by the measured ratio) and its adaptive rule (a
batch that costs more per column than the loop hands over to the loop).

`plan_check(flags, probe, fails=True)` plans a check whose gradient is wrong (a test the spec
expects to fail): each fused pass runs up to its comparisons and falls back, and the step-by-step
check runs the comparison that names the entries: the full Jacobian, or where the projections go
first, the projections, whose bisection pins entries the full check fails (auto/pinpoint.py: a few
calls per halving; an error spread too thinly for any entry to show is then decided by the full
check, which the plan does not count). torch's fast mode recomputes the failing block in full, as
torch's does. It stops there: no side check, no later part.

A function whose plain backward raises (a backward that is not implemented, or returns a gradient of
the wrong shape: the probe's `backward_raises`) crashes the check instead, wrong gradient or not: the
fused passes fall back from it, and the step-by-step check's (or fast mode's) first plain backward
raises through to the caller. The plan stops there too (`Plan.crashed`).

A batched evaluation the engine tries and that raises (no batching rule) is one call of the op, as
the op's entry sees it, priced as one row.

What a plan does not know: a failing check stops at the first block that fails (the plan counts
the whole comparison: the projections' every row where a failing block stops them early); a
failure that looks like a kink re-draws the sample (up to four runs); the batched results that
disagree with a plain call, and the settling of entries near the tolerance, cost a few calls more.
"""

from __future__ import annotations

import torch

from opcheck.engine import route
from opcheck.engine._util import legacy_vmap
from opcheck.engine.auto.fused_backward import FUNCTORCH_ROWS
from opcheck.engine.auto.fused_projected import columns_cost_less
from opcheck.engine.auto.grouped import applies_to
from opcheck.engine.auto.stepwise import CONFIRMING_ROWS
from opcheck.engine.batching import (
    DEFAULT_MEMORY_BUDGET,
    FUSE_MAX_COLUMNS,
    FUSED_MIN_COLUMNS,
    MIN_BATCH_COLUMNS,
    PILOT_COLUMNS,
)
from opcheck.engine.route import COTANGENTS, DIRECTIONS, Pass, Sizes, Stepwise
from opcheck.runtime.cost.plan import Flags, Kind, Plan
from opcheck.runtime.cost.probe import Probe

__all__ = ["TIMED", "Flags", "Kind", "Plan", "plan_check", "unit_seconds"]

TIMED = "timed choice"
"""A plan step where the engine decides by timing its own calls (a batch schedule's later batches,
the fused projections' choice between backward's rows and every column's differences): the plan
decides it from the probe's times, and its counts can differ from the engine's there."""


class _Fallback(Exception):
    """A fused pass that does not pass the call (what it evaluated until then is in the plan)."""

    def __init__(self, loops: bool = False, projections: bool = False):
        super().__init__()
        self.loops = loops
        self.projections = projections  # fused.Fallback.projections: the step-by-step projections go first


class _Stop(Exception):
    """A failing check's comparison failed: the call ends there."""


class _Planner:
    """One engine call on the probed function: the engine's decisions, its evaluations recorded;
    with `fails`, of a function whose gradient is wrong."""

    def __init__(self, flags: Flags, probe: Probe, fails: bool = False):
        self.f, self.p, self.plan, self.fails = flags, probe, Plan(), fails
        self.viewed = False  # the probe is of complex inputs' real views (passes.real_inputs_call)
        self.batch = {"forward": True, "vjp": True, "jvp": True}  # the Evaluator's kinds still on
        self.stepwise = Stepwise()  # CheckContext.stepwise
        self.loop_columns: int | None = None  # Evaluator.loop_columns
        # a fused pass took the numerical columns by plain calls: after its fallback the step-by-step
        # full check reads them (NumericalCache.carry) instead of making them again
        self.plain_columns = False

    # ----------------------------------------------------------------------- costs
    def seconds(self, kind: Kind, rows: int = 1) -> float:
        return unit_seconds(self.p, kind, rows)

    def add(self, kind: Kind, count: int = 1, rows: int = 1, plan: Plan | None = None) -> None:
        """Record `count` evaluations of `rows` rows (in `plan`, default the call's), priced at this
        planner's function."""
        (plan or self.plan).add(kind, count, rows, self.seconds(kind, rows) if count > 0 else 0.0)

    # --------------------------------------------------------------------- the call
    def run(self) -> Plan:
        p, f = self.p, self.f
        self.add(Kind.FORWARD)  # the call itself
        if p.layouts:  # sparse inputs: dense stand-ins, the loops throughout
            self.add(Kind.FORWARD)  # api._gradcheck: the stand-ins' call (layouts.wrap)
            self.stepwise = Stepwise(projections_first=True)
            self.batch = dict.fromkeys(self.batch, False)
            self.plan.note("sparse inputs: loops")
        elif f.mode in ("auto", "full") and self._fused_passes():
            return self.plan
        try:
            for part in self._parts():
                if part == "forward" and p.complex_inputs:
                    # forward AD checks a complex input's imaginary and real parts as functions of real
                    # inputs of their own (opcheck.engine.comparison.parts), which rebuild the complex input
                    sub = _Planner(f, p.forward_part, self.fails)
                    sub.batch, sub.stepwise = self.batch, self.stepwise
                    sub.plan = self.plan
                    sub._compare(part)
                else:
                    self._compare(part)
        except _Stop:
            return self.plan
        self._side_checks()
        return self.plan

    def _compare(self, part: str) -> None:
        {"auto": self._auto, "fast": self._fast, "full": self._full}[self.f.mode](part)

    def _parts(self) -> list[str]:
        """The step-by-step comparisons (parts.compare_parts): complex outputs as imaginary and real
        parts, complex inputs likewise for forward AD; each part calls the function once first."""
        p, f, parts = self.p, self.f, []
        if f.backward:
            if p.complex_outputs:
                self.add(Kind.FORWARD, 2)
                parts += ["backward", "backward"]
            else:
                parts.append("backward")
        if f.forward and not p.layouts:
            halves = 2 if p.complex_inputs else 1
            if p.complex_inputs:
                self.add(Kind.FORWARD, 2)
            parts += ["forward"] * halves
            if f.undefined_grad:  # the undefined-tangent check: two forward-mode calls per input
                self.add(Kind.JVP, 2 * p.n_inputs * halves)
        return parts

    # ------------------------------------------------------------------ fused passes
    def _fused_passes(self) -> bool:
        """auto._fused_passes: complex inputs through their real views (Probe.real_view)."""
        viewed = self.p.real_view
        if viewed is None:
            return self._fused_passes_of(complex_inputs=self.p.complex_inputs)
        self.add(Kind.FORWARD)  # passes.real_inputs_call: the function called on the views
        sub = _Planner(self.f, viewed, self.fails)
        sub.batch, sub.plan, sub.viewed = self.batch, self.plan, True
        done = sub._fused_passes_of(complex_inputs=True)
        self.stepwise = sub.stepwise
        return done

    def _fused_passes_of(self, complex_inputs: bool) -> bool:
        passes = {Pass.FULL: self._fused_full, Pass.PROJECTED: self._fused_projected}
        if self.f.mode == "full":  # fast_mode=False: the full check's fused pass alone
            order: tuple[Pass, ...] = (Pass.FULL,) if route.full_mode_fused(self.sizes) else ()
        else:
            order = route.fused_order(self.sizes)
        for attempt in order:
            self.plan.step("fused pass")
            try:
                passes[attempt]()
                return True
            except _Fallback as e:
                self.add(
                    Kind.FORWARD, 2 if self.viewed else 1
                )  # a fresh start: the function (and its views) called again
                start = route.after_fallback(
                    attempt, loops=e.loops, projections=e.projections, complex_inputs=complex_inputs
                )
                if start is not None:
                    self.stepwise = start
                    return False
        return False

    @property
    def sizes(self) -> Sizes:
        """The route's inputs (opcheck.engine.route.Sizes) of the probed call."""
        return self._sizes(self.p.m)

    def _sizes(self, m: int) -> Sizes:
        f = self.f
        return Sizes.of(
            self.p.n, m, self.p.n_inputs, jacobian_budget=f.budget, auto=f.mode == "auto", backward=f.backward
        )

    def _applies(self, projected: bool) -> None:
        p = self.p
        if not (self.batch["forward"] and self.batch["vjp"]):
            raise _Fallback(loops=True)
        taken = p.real_outputs if projected or self.f.forward else p.real_outputs_backward  # passes.applies
        if p.complex_inputs or p.layouts or not taken:
            raise _Fallback()
        sizes = self._sizes(p.m_real)
        if not projected and not sizes.within_budget:
            raise _Fallback()
        if route.fused_elements(sizes, p.n_outputs, projected) * p.itemsize > DEFAULT_MEMORY_BUDGET:
            raise _Fallback()

    def _fused_full(self) -> None:
        p, f = self.p, self.f
        self._applies(projected=False)
        self.plan.note("auto: full Jacobian, fused" if f.mode == "auto" else "full Jacobian, fused")
        # fused._jacobians: with the batched forward-AD check, the differences by a vmapped call and
        # the columns by the legacy vmap (where this torch has it), else one vmapped call on dual tensors
        legacy = f.batched_forward_grad
        one_call = f.forward and 0 < p.n <= FUSE_MAX_COLUMNS and (not legacy or legacy_vmap is not None)
        if one_call and legacy:
            self._need(p.vmap is not None and p.vmap_tangents is not None)
            self.add(Kind.VMAP, rows=2 * p.n + 1)
            self.add(Kind.VMAP_TANGENTS, rows=p.n)
            if not p.legacy_jvp:  # the columns from dual tensors under torch.func.vmap instead
                self.plan.step("failed batch")
                self._vmap_jvp(p.n)
            self.add(Kind.JVP)
        elif one_call:
            self._need(p.vmap_jvp is not None)
            self._vmap_jvp(3 * p.n)
            self.add(Kind.JVP)
        else:
            # fused._numerical: beyond route's loop columns, the projections; columns that cannot
            # be batched in a check of backward alone go to grouped_check
            grouped = applies_to(f.mode == "auto", f.backward, f.forward, p.func_out, p.outputs)
            self.loop_columns = 0 if grouped else route.loop_columns(p.n_inputs, auto=f.mode == "auto")
            try:
                self._numerical_columns(center_probe=True)
                grouped = False
            except _Fallback:
                if not grouped:
                    raise
            finally:
                self.loop_columns = None
            if grouped:
                return self._grouped()
            if f.forward:
                self._jvp_columns(legacy_first=f.batched_forward_grad)
        if f.forward and not p.jvp_right:
            raise _Fallback()
        if f.backward:
            self._fused_backward(p.m_real)
        if self.fails:  # fused._backward's (or the forward comparison's) disagreement
            raise _Fallback()
        if f.forward and f.undefined_grad and p.n_inputs > 1:
            self.add(Kind.JVP, p.n_inputs)
        if f.forward and f.batched_forward_grad and not (one_call and p.legacy_jvp):
            self.add(Kind.VMAP_TANGENTS, p.n_inputs, rows=2)
        if f.backward and f.undefined_grad:
            self._undefined_backward(fused=True)

    def _grouped(self) -> None:
        """auto/grouped.py: backward's rows, then the finite differences by groups of columns or by
        the loop (route.grouped_differences), then backward's undefined-grad_output check."""
        p, f = self.p, self.f
        columns = sum(p.columns)
        over = columns > route.loop_columns(p.n_inputs)
        try:
            self._fused_backward(p.m_real)
        except _Fallback:  # where the loop costs more, the projections go first
            if not over:
                raise
            raise _Fallback(loops=True, projections=True) from None
        by_groups = route.grouped_differences(p.column_groups, columns, p.n_inputs)
        if by_groups is None:
            raise _Fallback(loops=True, projections=True)
        self.plan.note("auto: full Jacobian, fused" + (", grouped finite differences" if by_groups else ""))
        self.add(Kind.FORWARD, 2 * (route.GROUP_WEIGHTINGS * p.column_groups if by_groups else columns))
        self.plain_columns = not by_groups and not p.complex_outputs
        if self.fails:  # a group's disagreement hands the call to the step-by-step full check
            raise _Fallback(loops=by_groups)
        if f.undefined_grad:
            self._undefined_backward(fused=True)

    def _fused_projected(self) -> None:
        p, f = self.p, self.f
        self._applies(projected=True)
        k, n_in = DIRECTIONS, p.n_inputs
        zero_tangent_rows = n_in if f.forward and f.undefined_grad and n_in > 1 else 0
        ju = True
        # The differences from a vmapped call; J·U from the legacy vmap (the batched forward-AD
        # check's machinery), else from dual tensors under torch.func.vmap (jvps_at_points).
        if p.vmap is None and self.batch["forward"]:
            self.add(Kind.VMAP)  # the attempt (see _failed_batch); the step-by-step check tries again
        self._need(p.vmap is not None, loops=True)
        self.add(Kind.VMAP, rows=1 + 2 * k * n_in)
        if f.batched_forward_grad:
            self.add(Kind.VMAP_TANGENTS, rows=k * n_in + zero_tangent_rows)
        elif p.vmap_jvp is not None:
            self._vmap_jvp(k * n_in + zero_tangent_rows)
        else:
            self.plan.step("failed batch")
            if f.forward:
                raise _Fallback(loops=True)
            if hasattr(p.fn, "vmap_form"):  # gradgradcheck's first derivative: torch.func's attempt alone
                self.add(Kind.VMAP, rows=k * n_in + zero_tangent_rows)
            else:  # the dual rows' attempt, then one plain JVP: where it raises too, no torch.func attempt
                self.add(Kind.VMAP, rows=k * n_in + zero_tangent_rows)
                self.add(Kind.FORWARD if p.jvp is None else Kind.JVP)
                if p.jvp is not None:
                    self.add(Kind.VMAP, rows=k * n_in + zero_tangent_rows)
            ju = False
        if f.forward:
            self.add(Kind.JVP)  # the batched rows tied to a plain JVP
        if not ju:  # J·U from the VJP of the VJP, else from backward's rows
            self.add(Kind.BACKWARD)
            if p.backward_raises:  # the step-by-step check meets it again
                raise _Fallback()
            if p.double_backward in ("ok", "wrong"):  # "wrong": computed, and it disagrees with finite differences
                self.add(Kind.DOUBLE_BACKWARD, n_in, rows=k)
            if p.double_backward == "ok":
                source = "J·U from the VJP of the VJP"
            elif p.vmap is not None and p.batched_backward is not None and self._columns_cost_less():
                self._numerical_columns(center_probe=True)  # fused_projected._column_stage
                source = "JᵀV against finite-difference columns"
            else:
                for m_o in p.output_sizes:  # sources.rows_along
                    chunk = _chunk(m_o, m_o + p.n, p.itemsize)
                    for start in range(0, m_o, chunk):
                        self._vjp_batch(min(chunk, m_o - start), probe=start == 0)
                source = "J·U from VJP rows"
        else:
            if not p.jvp_right:  # forward AD's J·U disagrees with the finite differences
                raise _Fallback()
            source = "J·U from forward AD"
        self.plan.note(f"auto: projections ({source}), fused")
        if f.backward:
            self._fused_backward(COTANGENTS * p.n_outputs)
        if self.fails:  # the VJP stage's (or J·U's) disagreement
            raise _Fallback()
        if f.forward and f.undefined_grad and n_in > 1:
            self.add(Kind.JVP, n_in)
        if f.backward and f.undefined_grad:
            self._undefined_backward(fused=True)

    def _fused_backward(self, leading: int) -> None:
        """fused_backward.batched_backward: two plain VJPs per output (reentrancy), one batched backward;
        where route.plain_backward_rows, a plain VJP per row, one more (reentrancy) and a zero one."""
        p = self.p
        if p.backward_raises:  # the first plain VJP raises: the step-by-step check meets it again
            self.add(Kind.BACKWARD)
            raise _Fallback()
        if route.plain_backward_rows(leading, p.n_outputs, self.f.batched_grad):
            self.add(Kind.BACKWARD, leading + 2 if leading else 1)  # no row: the zero one alone
            return
        self.add(Kind.BACKWARD, 2 * p.n_outputs)
        rows = leading + p.n_outputs + 1
        if p.batched_backward is None:
            self._attempt(Kind.BATCHED_BACKWARD, rows)
            raise _Fallback()
        if leading >= FUNCTORCH_ROWS and p.vmap is not None:  # torch.func's pullback: a forward, then the rows
            self.add(Kind.FORWARD)
            self.add(Kind.BATCHED_BACKWARD, rows=rows)
            if self.f.batched_grad:
                self.add(Kind.BATCHED_BACKWARD, rows=p.n_outputs)
        else:
            self.add(Kind.BATCHED_BACKWARD, rows=rows)

    def _vmap_jvp(self, rows: int) -> None:
        """passes.jvps_at_points: dual tensors under torch.func.vmap; where they raise (the function's
        forward ran batched first), one plain JVP, then torch.func.jvp under vmap."""
        if self.p.dual_jvp_raises:
            self.add(Kind.VMAP, rows=rows)
            self.add(Kind.JVP)
        self.add(Kind.VMAP_JVP, rows=rows)

    def _attempt(self, kind: Kind, rows: int) -> None:
        """A batched backward that raises: the op's backward is entered with the batched cotangents
        (and raises there, at about the cost of one plain backward)."""
        self.plan.add(kind, 1, rows, self.seconds(Kind.BACKWARD))

    def _need(self, works: bool, loops: bool = False) -> None:
        """Fall back unless a batched evaluation the pass needs works (its attempt raises first)."""
        if not works:
            self.plan.step("failed batch")
            raise _Fallback(loops=loops)

    def _undefined_backward(self, fused: bool = False) -> None:
        n_out = self.p.n_outputs
        if not fused:
            self.add(Kind.FORWARD)
        self.add(Kind.BACKWARD)
        if n_out > 1:
            self.add(Kind.FORWARD, n_out)
            self.add(Kind.BACKWARD, n_out)

    # ---------------------------------------------------------------- step by step
    def _auto(self, part: str) -> None:
        if route.stepwise_full_first(self.sizes, self.stepwise):
            self._full(part, note="auto: full Jacobian, step by step")
            return
        self._projected(part)
        self._stop()

    def _full(self, part: str, note: str = "full Jacobian") -> None:
        self.plan.note(note)
        self.plan.step("comparison")
        self._numerical_columns(center_probe=False)
        if part == "forward":
            self._jvp_columns(legacy_first=False)
        else:
            for m_o in self.p.output_sizes:
                self._vjp_rows(m_o)
        self._stop()

    def _crash_at_backward(self) -> None:
        """Where a plain backward raises, the step-by-step check's first one ends the call: the
        engine lets that exception through (a fused pass falls back from it instead)."""
        if self.p.backward_raises:
            self.add(Kind.BACKWARD)
            self.plan.note("crashes: a plain backward raises")
            self.plan.crashed = True
            raise _Stop()

    def _stop(self) -> None:
        """A failing check ends at the comparison just planned."""
        if self.fails:
            raise _Stop()

    def _fast(self, part: str) -> None:
        p = self.p
        self.plan.note("fast mode: one random projection per input and output")
        self.plan.step("comparison")
        self.add(Kind.FORWARD, 2 * p.n_inputs * (2 if p.complex_inputs else 1))
        if part == "forward":
            self.add(Kind.JVP, p.n_inputs)
        else:
            self._crash_at_backward()
            self.add(Kind.BACKWARD, 2 * p.n_outputs)
        if self.fails:  # fast._localize_fast_failure: the block recomputed in full, as torch does
            self._full(part, note="fast mode: the failing block in full")

    def _projected(self, part: str) -> None:
        p, k = self.p, DIRECTIONS
        self.plan.step("comparison")
        if p.complex_inputs or p.complex_outputs:
            self.add(Kind.FORWARD)  # the function seen through view_as_real
        for jj in range(p.n_inputs):  # finite differences along the directions, one input at a time
            if self.batch["forward"] and p.vmaps_alone(jj):
                self.add(Kind.VMAP, rows=2 * k)
                self.add(Kind.FORWARD)
            else:
                self._failed_batch("forward", Kind.VMAP)
                self.add(Kind.FORWARD, 2 * k)
        if part == "forward":
            self.plan.note("auto: projections (J·U from forward AD), step by step")
            self._jvp_along()
            return
        jvps_batch = self.batch["jvp"] and p.vmap_tangents is not None
        if not jvps_batch and not route.unbatched_jvps_as_source(self.batch["vjp"]):
            self._failed_batch("jvp", Kind.VMAP_TANGENTS)  # the batched JVPs' attempt, no loop after it
            source = self._double_backward_source()
        elif p.jvp_right:
            self._jvp_along()
            source = "forward AD"
        else:
            if p.jvp is not None:  # forward AD runs, and disagrees: the next source
                self._jvp_along()
            elif not p.layouts:  # the stand-ins' dual tensors raise before the op runs
                self._failed_batch("jvp", Kind.VMAP_TANGENTS)
                self.add(Kind.FORWARD)  # the forward-mode attempt: the op runs, its tangent raises
            source = self._double_backward_source()
        self.plan.note(f"auto: projections (J·U from {source}), step by step")
        for _ in range(p.n_outputs):  # the VJP stage: JᵀV twice (reentrancy)
            self._vjp_batch(COTANGENTS, probe=True)
            self._vjp_batch(COTANGENTS, probe=True)

    def _jvp_along(self) -> None:
        p = self.p
        for _ in range(p.n_inputs):
            if self.batch["jvp"] and p.vmap_tangents is not None:
                self.add(Kind.VMAP_TANGENTS, rows=DIRECTIONS)
                self.add(Kind.JVP)
            else:
                self._failed_batch("jvp", Kind.VMAP_TANGENTS)
                if p.jvp is None:  # the first forward-mode call raises
                    self.add(Kind.FORWARD)
                    return
                self.add(Kind.JVP, DIRECTIONS)

    def _double_backward_source(self) -> str:
        p = self.p
        self.add(Kind.BACKWARD)  # backward with create_graph
        if p.double_backward in ("ok", "wrong"):
            for _ in range(p.n_inputs):
                if self.batch["vjp"]:
                    self.add(Kind.DOUBLE_BACKWARD, rows=DIRECTIONS)
                    self.add(Kind.DOUBLE_BACKWARD, rows=1)
                else:
                    self.add(Kind.DOUBLE_BACKWARD, DIRECTIONS, rows=1)
            if p.double_backward == "ok":
                return "the VJP of the VJP"
            for m_o in p.output_sizes:  # stepwise._confirm_with_rows: backward's rows where it disagrees
                self._vjp_batch(min(CONFIRMING_ROWS, m_o), probe=True)
        if p.double_backward == "raises":
            if self.batch["vjp"]:
                self.add(Kind.DOUBLE_BACKWARD, rows=DIRECTIONS)
            self.add(Kind.DOUBLE_BACKWARD, rows=1)
            self.batch["vjp"] = False  # vjp_batch gave the kind up before the loop raised
        # VJP rows: every row of J, a chunk at a time, reduced against U on the fly
        n = p.n
        for m_o in p.output_sizes:
            chunk = _chunk(m_o, m_o + n, p.itemsize)
            for start in range(0, m_o, chunk):
                self._vjp_batch(min(chunk, m_o - start), probe=start == 0)
        return "VJP rows"

    def _vjp_batch(self, b: int, probe: bool) -> None:
        """vjp_rows.vjp_batch: one batched backward (and a plain probe), else one backward per row."""
        if self.batch["vjp"] and b >= 2 and self.p.batched_backward is not None:
            self.add(Kind.BATCHED_BACKWARD, rows=b)
            if probe:
                self.add(Kind.BACKWARD)
            return
        if self.batch["vjp"] and b >= 2:
            self._attempt(Kind.BATCHED_BACKWARD, b)
            self._give_up("vjp")
        self.add(Kind.BACKWARD, b)

    def _columns_cost_less(self) -> bool:
        """fused_projected's choice, which the engine makes by timing its two batched calls (TIMED):
        every column's differences against backward's rows."""
        p = self.p
        assert p.vmap is not None and p.batched_backward is not None
        self.plan.step(TIMED)
        return columns_cost_less(p.n, p.m, p.vmap.at(2 * p.n), p.batched_backward.at(p.m), self.f.budget)

    def _give_up(self, kind: str) -> None:
        self.batch[kind] = False

    def _failed_batch(self, kind: str, evaluation: Kind) -> None:
        """Where batching of `kind` is still on, its attempt, and the kind given up: the function is
        called batched (one call of the op, as the op's own entry sees it) and raises or disagrees,
        priced as one row (most raise in the op's first batched kernel, or before it runs)."""
        if self.batch[kind]:
            self.plan.step("failed batch")
            self.add(evaluation)
        self._give_up(kind)

    # ------------------------------------------------------ batched columns and rows
    def _numerical_columns(self, center_probe: bool) -> None:
        """batching.fd_columns.numerical_columns: vmapped chunks of columns, else two calls each;
        none where a fused pass that fell back made them by plain calls (`plain_columns`)."""
        p = self.p
        total = sum(p.columns)
        outs = p.func_out
        if total == 0 or (outs and all(isinstance(o, torch.Tensor) and o.numel() == 0 for o in outs)):
            return  # no column, or only empty ones
        if self.plain_columns:
            return
        batched = False
        few = total < (FUSED_MIN_COLUMNS if center_probe else MIN_BATCH_COLUMNS)  # the loop, by choice
        if self.batch["forward"] and not few:
            if p.vmap is None:
                self._failed_batch("forward", Kind.VMAP)
            else:
                batched = True
                out = p.m
                groups = [total] if total <= FUSE_MAX_COLUMNS else [c for c in p.columns if c]
                trial = Plan()
                done = all(
                    self._batches(
                        trial, cols, _chunk(cols, 2 * (p.n + out), p.itemsize), "forward", center_probe, extra_row=True
                    )
                    for cols in groups
                )
                self.plan.extend(trial)
                if done:
                    return
        if self.loop_columns is not None and total > self.loop_columns and not (few and self.batch["forward"]):
            raise _Fallback(loops=True, projections=True)
        self.add(Kind.FORWARD, 2 * total)
        if center_probe and not batched and not self.viewed and not p.complex_outputs:
            self.plain_columns = True

    def _jvp_columns(self, legacy_first: bool) -> None:
        """batching.jvp_columns: vmapped chunks of J e_k (one probe JVP), else one JVP per column."""
        p = self.p
        total = p.n
        if total == 0:
            return
        if self.batch["jvp"] and total >= (2 if legacy_first else MIN_BATCH_COLUMNS):
            if p.vmap_tangents is None:
                self.plan.step("failed batch")
                self._give_up("jvp")
            else:
                groups = [total] if total <= FUSE_MAX_COLUMNS else [p.inputs[j].numel() for j in p.diff]
                trial = Plan()
                done = all(
                    self._batches(trial, cols, _chunk(cols, cols + p.m, p.itemsize), "jvp", False, extra_row=True)
                    for cols in groups
                    if cols
                )
                self.plan.extend(trial)
                if done:
                    return
        self.add(Kind.JVP, total)

    def _vjp_rows(self, m_o: int) -> None:
        """analytical_vjp_jacobian: the rows of one output twice (reentrancy), batched or one backward each."""
        p = self.p
        if self.batch["vjp"] and m_o >= MIN_BATCH_COLUMNS and p.batched_backward is not None:
            trial = Plan()
            if self._batches(trial, m_o, _chunk(m_o, m_o + p.n, p.itemsize), "vjp", False, extra_row=False):
                self.plan.extend(trial)
                for (kind, rows), count in trial.evals.items():
                    if kind == Kind.BATCHED_BACKWARD:
                        self.add(kind, count, rows)
                return
            self.plan.extend(trial)
        elif self.batch["vjp"] and m_o >= MIN_BATCH_COLUMNS:
            self._attempt(Kind.BATCHED_BACKWARD, min(m_o, PILOT_COLUMNS))
            self._give_up("vjp")
        self._crash_at_backward()
        self.add(Kind.BACKWARD, 2 * m_o)

    def _batches(self, plan: Plan, total: int, chunk: int, kind: str, center_probe: bool, extra_row: bool) -> bool:
        """The schedule of one batched kind over `total` columns (or rows): a pilot batch first when
        there are many, timed against one plain call; then batches growing by the ratio the pilot
        undercut the loop, up to `chunk` (a fused pass's finite differences, with no plain call
        timed, grow eightfold while a column costs no more than in the batch before). False when
        the adaptive rule hands over to the loop (the caller then loops over every column; what was
        batched is in `plan`)."""
        batched, plain, rows_per = {
            "forward": (Kind.VMAP, Kind.FORWARD, 2),
            "jvp": (Kind.VMAP_TANGENTS, Kind.JVP, 1),
            "vjp": (Kind.BATCHED_BACKWARD, Kind.BACKWARD, 1),
        }[kind]
        plain_per_column = rows_per * self.seconds(plain)
        pilot = total > 8 * PILOT_COLUMNS and not (center_probe and kind == "forward" and total <= FUSE_MAX_COLUMNS)
        size = min(chunk, PILOT_COLUMNS) if pilot else chunk
        start, before = 0, None
        while start < total:
            stop = min(total, start + size)
            b = stop - start
            first = start == 0
            rows = rows_per * b + (1 if first and extra_row else 0)
            self.add(batched, rows=rows, plan=plan)
            if first and not center_probe:
                self.add(plain, plan=plan)
            timed = not center_probe and (first or size < chunk)
            if stop < total and (timed or (center_probe and kind == "forward")):
                plan.step(TIMED)  # the engine's clock decides the batches after this one
            if timed:
                per_column = self.seconds(batched, rows) / b
                if per_column > plain_per_column:
                    self._give_up(kind)
                    if stop < total:
                        return False
                    break
                factor = 8.0 if per_column <= 0 else min(8.0, plain_per_column / per_column)
                size = min(chunk, max(size, int(size * factor * (1 + 1e-9))))
            elif center_probe and kind == "forward":
                # Schedule.measured_alone: eightfold while a column costs no more than before.
                per_column = self.seconds(batched, rows) / b
                if before is None or per_column <= 1.25 * before:
                    size = min(chunk, size * 8)
                before = per_column
            start = stop
        return True

    # ------------------------------------------------------------------ side checks
    def _side_checks(self) -> None:
        p, f = self.p, self.f
        self.plan.step("side checks")
        if f.batched_forward_grad:
            self.add(Kind.JVP, 2 * p.n_inputs)
            self.add(Kind.VMAP_TANGENTS, p.n_inputs, rows=2)
        if not f.backward:
            return
        if f.batched_grad:
            self.add(Kind.BACKWARD, 2 * p.n_outputs)
            self.add(Kind.BATCHED_BACKWARD, p.n_outputs, rows=2)
        self.add(Kind.BACKWARD)  # zero grad_outputs
        if f.undefined_grad:
            self._undefined_backward()


def _chunk(total: int, per_column_elems: int, itemsize: int) -> int:
    per_column = max(1, per_column_elems) * max(1, itemsize)
    return int(max(1, min(total, DEFAULT_MEMORY_BUDGET // per_column)))


def plan_check(flags: Flags, probe: Probe, fails: bool = False) -> Plan:
    """The evaluations of one gradcheck (or, on gradgradcheck's first derivative, gradgradcheck) call;
    with `fails`, of one whose gradient is wrong (see the module doc)."""
    return _Planner(flags, probe, fails).run()


# ------------------------------------------------------------------------------- seconds
def unit_seconds(p: Probe, kind: Kind, rows: int = 1, measure: bool = True) -> float:
    """The seconds of one evaluation of this kind, from the probe's times; without `measure`, from
    the batch sizes timed so far (Batched.at)."""
    forward = p.forward
    backward = p.backward if p.backward is not None else forward
    if kind == Kind.FORWARD:
        return forward
    if kind == Kind.BACKWARD:
        return backward
    if kind == Kind.JVP:
        return p.jvp if p.jvp is not None else 2 * forward
    if kind == Kind.VMAP:
        return p.vmap.at(rows, measure) if p.vmap is not None else rows * forward
    if kind in (Kind.VMAP_JVP, Kind.VMAP_TANGENTS):
        batched = p.vmap_jvp if kind == Kind.VMAP_JVP else p.vmap_tangents
        if batched is not None:
            return batched.at(rows, measure)
        return p.vmap.at(rows, measure) * 2 if p.vmap is not None else rows * 2 * forward
    if kind == Kind.BATCHED_BACKWARD:
        return p.batched_backward.at(rows, measure) if p.batched_backward is not None else rows * backward
    # a backward through backward's graph, batched over `rows` cotangents (a batch costs less per row)
    once = p.double_backward_seconds if p.double_backward != "raises" else None
    return (once if once is not None else 2 * backward + forward) * (1 + (rows - 1) / 4)
