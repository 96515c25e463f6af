"""fast_mode="auto": every Jacobian entry checked, at about torch's fast-mode cost.

The door is `check`: the fused passes first (fused.py: the full check folded into few calls, for
small Jacobians; fused_projected.py: the entrywise projections folded likewise, beyond), and where
none passes the call, the same comparisons step by step (stepwise.py), which also localize a
failure. sources.py and projections.py are the projections' parts, passes.py what the fused passes
share (the batched rows they trust, and the Fallback that hands a call on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from opcheck.engine._util import diff_input_indices
from opcheck.engine.auto.fused import fused_check
from opcheck.engine.auto.fused_projected import projected_check
from opcheck.engine.auto.passes import Fallback, real_inputs_call
from opcheck.engine.auto.stepwise import auto_check, jacobian_sides
from opcheck.engine.comparison.parts import compare_parts
from opcheck.engine.context import Call, CheckContext

__all__ = ["check", "jacobian_sides"]


def check(ctx: CheckContext, call: Call, *, forward_ad: bool, fused: bool) -> tuple[bool, CheckContext, Call]:
    """fast_mode="auto"'s Jacobian comparisons of one call: whether a fused pass settled the call
    whole (its side checks included), and the context and call the rest of the check runs on.

    `fused` False (sparse and MKLDNN stand-ins, which cannot be vmapped) goes step by step at once.
    """
    if fused:
        passed, ctx, call = _fused_passes(ctx, call)
        if passed:
            return True, ctx, call
    compare_parts(ctx, auto_check, call, forward_ad=forward_ad)
    return False, ctx, call


def _fused_passes(ctx: CheckContext, call: Call) -> tuple[bool, CheckContext, Call]:
    """fast_mode="auto"'s fused passes, tried in order: (whether one passed the call, the context and
    the call for the step-by-step check after them).

    Complex inputs are seen through torch.view_as_real (passes.real_inputs_call). A pass that does
    not pass the call leaves the next pass, or the step-by-step check, a fresh start: the function
    called again, the batching it distrusts off.
    """
    viewed = real_inputs_call(call)
    complex_inputs = any(call.inputs[j].is_complex() for j in diff_input_indices(call.inputs))
    for attempt in _fused_order(ctx, viewed or call):
        try:
            attempt(ctx, viewed or call)
            return True, ctx, call
        except Fallback as e:  # the next pass, or the step-by-step check, decides from a fresh start
            stats = ctx.evaluator.stats
            stats.fallbacks.append(f"{'fused' if attempt is fused_check else 'projected'}: {e}")
            ctx.evaluator.stop(*e.distrust)
            stats.auto_paths.clear()
            stats.failed_path = None
            ctx.numerical_cache.clear()
            call = Call.of(call.func, call.inputs)
            viewed = viewed and real_inputs_call(call)
            if e.projections or (attempt is projected_check and (e.loops or complex_inputs)):
                # Without vmap support the full check would loop over every column and row, and on
                # complex inputs it takes two calls per column: the step-by-step projections take a
                # handful (the full check decides what they do not pass).
                return False, replace(ctx, projections_first=True, unbatched_columns=e.projections), call
    return False, ctx, call


def _fused_order(ctx: CheckContext, call: Call) -> Iterator[Callable[[CheckContext, Call], None]]:
    """fast_mode="auto"'s fused passes, in the order they are tried.

    Up to context.FULL_CHECK_ELEMENTS input and output elements (and for a call that checks forward
    AD alone up to context.FORWARD_FULL_COLUMNS input elements: context.full_check_first) the full
    check is cheap: its fused pass. Beyond, the projections' fused pass; within the Jacobian budget a
    call it does not pass goes on to the full check, so there its failures are the full check's. A
    function the projections' pass cannot vmap, or whose inputs are complex, goes to the step-by-step
    projections (ctx.projections_first), and within the budget a failure there to the full check too.
    """
    n, m = jacobian_sides(call.inputs, call.func_out)
    if ctx.full_first(n, m):
        yield fused_check
        return
    yield projected_check
    if n * m <= ctx.flags.jacobian_budget:
        yield fused_check
