"""fast_mode="auto"'s route through one call: which comparison runs first, what a fused pass that
falls back hands on, and where the full check's unbatched columns give way to the projections.

Every decision of the route is a function of the call's sizes (and of what a fused pass found), and
is made here only: the engine follows it (auto/__init__.py, auto/fused.py, auto/stepwise.py),
and the cost estimate runs the engine itself on a stand-in of the function
(opcheck.runtime.cost.standin).
"""

from __future__ import annotations

from enum import Enum

from opcheck._records import record
from opcheck.engine.flags import DEFAULT_JACOBIAN_BUDGET

DIRECTIONS = 8
"""k: random input directions per input of the projections (J·U has m*k entries per block)."""
COTANGENTS = 8
"""k': random output cotangents per output of the projections' VJP stage."""
FULL_CHECK_ELEMENTS = 128
"""fast_mode="auto" runs the full check first while the differentiable input elements n and the
float output elements m number at most this many together (so n·m <= 4096). Its cost grows with
(n + m)²: 2n + 1 evaluations and m backward rows, each of n + m elements. The projections' grows
with n + m only, and below this size the two cost about the same (auto/fused.py, auto/fused_projected.py)."""
FORWARD_FULL_COLUMNS = 32
"""A call that checks forward AD alone runs the full check first only up to this many input elements
n as well: its fused pass evaluates 3n rows (x ∓ eps e_k and the tangents e_k), the projections'
3·DIRECTIONS per input, and from about 32 columns on the projections cost less (bench_auto_sets)."""
LOOP_COLUMNS_PER_INPUT = 2 * DIRECTIONS
"""Columns per differentiable input the full check's finite differences loop over, one plain call
pair each, when they cannot be batched (no vmap support: a Triton kernel in the interpreter, an op
without a batching rule). The step-by-step projections take DIRECTIONS call pairs per input; beyond
twice that many columns they go first (auto/fused.py, auto/stepwise.py)."""
GROUP_WEIGHTINGS = 2
"""Where those columns cannot be batched and fast_mode="auto" checks backward alone, the full check
perturbs groups of columns that share no row of backward's Jacobian (auto/grouped.py): each group
under this many independent random weightings, one call pair each, within the same loop columns."""


@record
class Sizes:
    """What the route depends on: a Jacobian of m rows (float output elements) and n columns
    (differentiable input elements) over `inputs` differentiable inputs, the Jacobian budget, and
    whether the call checks backward AD."""

    n: int
    m: int
    inputs: int
    budget: int
    backward: bool

    @property
    def within_budget(self) -> bool:
        return self.n * self.m <= self.budget

    @property
    def full_first(self) -> bool:
        """Whether the full check runs first (see FULL_CHECK_ELEMENTS and FORWARD_FULL_COLUMNS;
        never beyond the budget)."""
        return (
            self.n + self.m <= FULL_CHECK_ELEMENTS
            and self.within_budget
            and (self.backward or self.n <= FORWARD_FULL_COLUMNS)
        )

    @property
    def loop_columns(self) -> int:
        return loop_columns(self.inputs)

    @classmethod
    def of(cls, n: int, m: int, inputs: int, *, jacobian_budget: int, auto: bool, backward: bool) -> Sizes:
        """A call's sizes under its mode: jacobian_budget is fast_mode="auto"'s; the other modes
        take the default (the most a fused pass of fast_mode=False holds)."""
        return cls(n, m, inputs, jacobian_budget if auto else DEFAULT_JACOBIAN_BUDGET, backward)


def grouped_differences(groups: int, columns: int, inputs: int) -> bool | None:
    """How the full check of backward alone takes `columns` finite differences that cannot be
    batched, over `inputs` inputs, whose columns fall in `groups` groups (auto/grouped.py): True by
    groups (GROUP_WEIGHTINGS call pairs per group), where that takes fewer call pairs than the
    loop's one per column and no more than loop_columns; False by the loop, within loop_columns;
    None neither (the projections go first)."""
    pairs, allowed = GROUP_WEIGHTINGS * groups, loop_columns(inputs)
    if pairs < columns and pairs <= allowed:
        return True
    return False if columns <= allowed else None


def loop_columns(inputs: int, auto: bool = True) -> int:
    """The most unbatched columns the full check's fused pass loops over, for `inputs` differentiable
    inputs: fast_mode="auto"'s before the projections go first; none for fast_mode=False, whose
    step-by-step full check loops over them instead (the fused pass would then have computed them
    for nothing). Columns too few to be worth a vmapped call (batching.FUSED_MIN_COLUMNS) loop by
    choice, not for want of vmap support, and are not bounded by it."""
    return LOOP_COLUMNS_PER_INPUT * inputs if auto else 0


def full_mode_fused(sizes: Sizes) -> bool:
    """fast_mode=False: whether the full check's fused pass goes first (the step-by-step full check
    decides what it does not pass). Within the Jacobian budget (its default bounds what one pass
    holds; the step-by-step check computes larger Jacobians a chunk at a time)."""
    return sizes.within_budget


PLAIN_ROWS = 2
"""Up to this many Jacobian rows, of one output, a fused pass takes its backward's rows by plain
backward passes (each row, the first twice for reentrancy, and a zero grad_output) where it otherwise
makes two plain passes and a batched one: on a small graph the batched pass costs about two plain
ones (torch.sin on 2 elements: 4 plain passes beat 2 plain and a batched one; on 3 they cost the
same; auto/fused_backward.py)."""


def plain_backward_rows(rows: int, outputs: int, batched_grad: bool) -> bool:
    """Whether a fused pass's backward takes its `rows` cotangents over `outputs` outputs by plain
    backward passes (PLAIN_ROWS). Not with the batched-gradient check on: that check is about the
    batched backward."""
    return outputs == 1 and rows <= PLAIN_ROWS and not batched_grad


class Pass(Enum):
    """A fused pass: a whole comparison folded into a few batched calls."""

    FULL = "full"  # auto/fused.py: the full Jacobian
    PROJECTED = "projected"  # auto/fused_projected.py: the entrywise projections


def unbatched_jvps_as_source(vjp_batches: bool) -> bool:
    """Whether the step-by-step projections take J·U for the backward check from forward AD one JVP
    at a time, where its JVPs do not batch (an op with forward AD but no batching rule): only where
    backward does not batch either. Otherwise the next sources cost fewer calls: the VJP of the VJP
    takes an input's DIRECTIONS rows in one batched call, backward's rows a chunk of rows in one,
    where the loop takes DIRECTIONS calls of the op per input (auto/stepwise.py, auto/sources.py)."""
    return not vjp_batches


def fused_order(sizes: Sizes) -> tuple[Pass, ...]:
    """The fused passes, in the order they are tried.

    Where the full check is cheap (Sizes.full_first), its fused pass alone. Beyond, the projections'
    pass; within the Jacobian budget a call it does not pass goes on to the full check, so that there
    its failures are the full check's.
    """
    if sizes.full_first:
        return (Pass.FULL,)
    return (Pass.PROJECTED, Pass.FULL) if sizes.within_budget else (Pass.PROJECTED,)


@record
class Stepwise:
    """How the step-by-step check starts once the fused passes handed the call on.

    `projections_first`: the step-by-step projections go before the full check (they cost fewer
    calls). `unbatched_columns`: the full check's finite differences were found not to batch, so its
    columns would loop, one call pair each.
    """

    projections_first: bool = False
    unbatched_columns: bool = False


def after_fallback(attempt: Pass, *, loops: bool, projections: bool, complex_inputs: bool) -> Stepwise | None:
    """Where a fused pass that fell back hands the call: None for the next fused pass, else the
    step-by-step check's start.

    The pass's Fallback says `loops` (the function cannot be evaluated in batches as the pass needs)
    and `projections` (the step-by-step projections cost fewer calls than the pass would). Without vmap
    support the full check would loop over every column and row, and on complex inputs it takes two
    calls per column: after the projections' pass, the step-by-step projections go first too.
    """
    if projections or (attempt is Pass.PROJECTED and (loops or complex_inputs)):
        return Stepwise(projections_first=True, unbatched_columns=projections)
    return None


def stepwise_full_first(sizes: Sizes, start: Stepwise) -> bool:
    """Whether the step-by-step check runs the full check (else the projections, and within the
    budget the full check decides what they do not pass).

    Within the budget the full check, unless the projections go first (`start`) and the full check
    costs more: beyond its size, or where its columns cannot be batched and would loop over more
    than Sizes.loop_columns.
    """
    if not sizes.within_budget:
        return False
    loops = start.unbatched_columns and sizes.n > sizes.loop_columns
    return not (start.projections_first and (loops or not sizes.full_first))


def fused_elements(sizes: Sizes, outputs: int, projected: bool) -> int:
    """The most elements a fused pass holds at once, in rows of n + m: its batched backward's rows and
    its vmapped forward's (checked against the memory budget before the pass runs)."""
    n, m = sizes.n, sizes.m
    if projected:
        rows = (COTANGENTS + 1) * outputs + 1 if sizes.backward else 0
        forward = (3 * DIRECTIONS + 1) * sizes.inputs
    else:
        rows = m + outputs + 1 if sizes.backward else 0
        forward = 2 * n + 1
    return max(rows, forward) * (n + m)
