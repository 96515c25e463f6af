"""fast_mode="auto": every Jacobian entry checked, at about torch's fast-mode cost.

The door is `check`: the fused passes first (fused.py: the full check folded into few calls, for
small Jacobians; fused_projected.py: the entrywise projections folded likewise, beyond), and where
none passes the call, the same comparisons step by step (stepwise.py), which also localize a
failure. sources.py and projections.py are the projections' parts, passes.py what the fused passes
share (the batched rows they trust, and the Fallback that hands a call on).

fast_mode=False goes through the same door (`full_mode`): the full check's fused pass first
(route.full_mode_fused), and where it does not pass the call, the full check step by step, whose
verdicts and messages are torch's slow mode's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from opcheck.engine import route
from opcheck.engine._util import diff_input_indices, jacobian_sides
from opcheck.engine.auto.fused import fused_check
from opcheck.engine.auto.passes import Fallback, real_inputs_call
from opcheck.engine.comparison.parts import compare_parts
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.route import Pass

__all__ = ["check", "jacobian_sides"]


def check(
    ctx: CheckContext, call: Call, *, forward_ad: bool, fused: bool, full_mode: bool = False
) -> tuple[bool, CheckContext, Call]:
    """fast_mode="auto"'s (with `full_mode`, fast_mode=False's) Jacobian comparisons of one call:
    whether a fused pass settled the call whole (its side checks included), and the context and
    call the rest of the check runs on.

    `fused` False (sparse and MKLDNN stand-ins, which cannot be vmapped) goes step by step at once.
    """
    if fused:
        passed, ctx, call = _fused_passes(ctx, call, full_mode)
        if passed:
            return True, ctx, call
    # The step-by-step check's modules load with its first use: a call the fused pass settles
    # (most of them) never needs them.
    from opcheck.engine.auto.stepwise import auto_check
    from opcheck.engine.modes.full import full_check

    compare_parts(ctx, full_check if full_mode else auto_check, call, forward_ad=forward_ad)
    return False, ctx, call


def _fused_passes(ctx: CheckContext, call: Call, full_mode: bool) -> tuple[bool, CheckContext, Call]:
    """The fused passes, tried in route.fused_order (with `full_mode`, the full check's alone, where
    route.full_mode_fused): (whether one passed the call, the context and the call for the
    step-by-step check after them).

    Complex inputs are seen through torch.view_as_real (passes.real_inputs_call). A pass that does
    not pass the call leaves the next pass, or the step-by-step check (route.after_fallback), a fresh
    start: the function called again, the batching it distrusts off.
    """
    viewed = real_inputs_call(call)
    diff = diff_input_indices(call.inputs)
    complex_inputs = any(call.inputs[j].is_complex() for j in diff)
    n, m = jacobian_sides((viewed or call).inputs, (viewed or call).func_out)
    sizes = ctx.sizes(n, m, len(diff))
    order = ((Pass.FULL,) if route.full_mode_fused(sizes) else ()) if full_mode else route.fused_order(sizes)
    for attempt in order:
        try:
            _pass(attempt)(ctx, viewed or call)
            return True, ctx, call
        except Fallback as e:  # the next pass, or the step-by-step check, decides from a fresh start
            stats = ctx.evaluator.stats
            stats.fallbacks.append(f"{'projected' if attempt is Pass.PROJECTED else 'fused'}: {e}")
            stats.disagreements += e.disagreed
            ctx.evaluator.stop(*e.distrust)
            stats.auto_paths.clear()
            stats.failed_path = None
            fresh = Call.of(call.func, call.inputs)
            ctx.numerical_cache.carry(call.func_out, fresh.func_out)  # what plain calls computed stays
            call = fresh
            viewed = viewed and real_inputs_call(call)
            start = route.after_fallback(
                attempt, loops=e.loops, projections=e.projections, complex_inputs=complex_inputs
            )
            if start is not None:
                return False, replace(ctx, stepwise=start), call
    return False, ctx, call


def _pass(attempt: Pass) -> Callable[[CheckContext, Call], None]:
    """The fused pass `attempt` runs (the projected one's module loads with its first use)."""
    if attempt is Pass.FULL:
        return fused_check
    from opcheck.engine.auto.fused_projected import projected_check

    return projected_check
