"""Public entry points: gradcheck / gradgradcheck (torch's signatures) and their report forms."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torch.autograd.gradcheck import GradcheckError as _TorchGradcheckError

from opcheck._records import record
from opcheck.engine import auto, aux_checks
from opcheck.engine._util import (
    Func,
    Inputs,
    as_tuple,
    check_inputs,
    check_outputs,
    is_layout_input,
    load_forward_ad_decompositions,
    requires_grad,
)
from opcheck.engine.batching import (
    DEFAULT_MEMORY_BUDGET,
    EvalStats,
    Evaluator,
    adaptive_clock,
    batching_enabled,
)
from opcheck.engine.comparison.parts import compare_parts
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.errors import GradcheckError
from opcheck.engine.flags import DEFAULT_ATOL, DEFAULT_EPS, DEFAULT_RTOL, CheckFlags, FastMode
from opcheck.engine.reporting import torch_words
from opcheck.engine.route import Stepwise

if TYPE_CHECKING:  # the report's classes load with the first report
    from opcheck.engine.reporting.diagnostics import BlockMismatch

__all__ = ["FastMode", "GradcheckReport", "gradcheck", "gradcheck_report", "gradgradcheck", "gradgradcheck_report"]


@record
class GradcheckReport:
    """The outcome of one gradcheck/gradgradcheck call as a value."""

    passed: bool
    error: GradcheckError | None
    check: str | None  # which check failed
    path: str | None  # derivative path of the failed check
    mismatch: BlockMismatch | None
    stats: EvalStats
    seconds: float

    @property
    def message(self) -> str:
        return str(self.error) if self.error is not None else ""


def gradcheck(
    func: Callable[..., Any],
    inputs: Any,
    *,
    eps: float = DEFAULT_EPS, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
    check_batched_grad: bool = False, check_batched_forward_grad: bool = False,
    check_forward_ad: bool = False, check_backward_ad: bool = True,
    fast_mode: FastMode = False, masked: bool | None = None, jacobian_budget: int | None = None,
) -> bool:  # fmt: skip
    """Check analytical gradients of `func` at `inputs` against finite differences.

    Same arguments, defaults and verdicts as torch.autograd.gradcheck. With fast_mode=False the
    full Jacobian and every check beside it are first folded into a few batched calls (one vmapped
    forward, one batched backward); a call that pass does not pass is checked step by step, the
    full Jacobian in vmapped batches (one column at a time for functions that cannot be vmapped),
    and a failure names the entries that disagree.

    fast_mode="auto" (opcheck only) runs the full check while the differentiable inputs and the
    outputs have at most 128 elements together, and beyond it entrywise projection checks that
    never hold the Jacobian; up to `jacobian_budget` entries (default 2**20) a call they do not
    pass is decided by the full check. See opcheck.engine.auto.stepwise for what they guarantee.
    `jacobian_budget` is ignored unless fast_mode="auto".
    """
    flags = CheckFlags.from_arguments(locals())
    return _run(lambda ctx: _gradcheck(ctx, func, as_tuple(inputs)), flags, raise_exception)


def gradgradcheck(
    func: Callable[..., Any],
    inputs: Any,
    grad_outputs: Any = None,
    *,
    eps: float = DEFAULT_EPS, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
    gen_non_contig_grad_outputs: bool = False,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True, check_grad_dtypes: bool = False, check_batched_grad: bool = False,
    check_fwd_over_rev: bool = False, check_rev_over_rev: bool = True,
    fast_mode: FastMode = False, masked: bool = False, jacobian_budget: int | None = None,
) -> bool:  # fmt: skip
    """Check second derivatives: gradcheck of the VJP of `func` w.r.t. inputs and grad_outputs.

    Same arguments, defaults and verdicts as torch.autograd.gradgradcheck. Failures name the path:
    "VJP of VJP" (check_rev_over_rev) or "JVP of VJP" (check_fwd_over_rev). fast_mode="auto"
    applies gradcheck's auto mode to that function (its Jacobian has (Σ numel_in + Σ numel_out) *
    Σ numel_in entries).
    """
    if not (check_fwd_over_rev or check_rev_over_rev):
        raise AssertionError(torch_words.flag_error("gradgradcheck", "forward or backward"))
    if check_undefined_grad and not check_rev_over_rev:
        raise AssertionError(torch_words.flag_error("gradgradcheck", "undefined grad"))
    if check_batched_grad and not check_rev_over_rev:
        raise AssertionError(torch_words.flag_error("gradgradcheck", "batched grad"))
    flags = CheckFlags.from_arguments(
        dict(locals(), check_forward_ad=check_fwd_over_rev, check_backward_ad=check_rev_over_rev)
    )

    def body(ctx: CheckContext) -> bool:
        from opcheck.engine.second_order import first_derivative  # (loaded by the first second-order check)

        first = first_derivative(func, inputs, grad_outputs, gen_non_contig_grad_outputs)
        ctx = replace(
            ctx,
            backward_path="VJP of VJP",
            forward_path="JVP of VJP",
            output_name=first.output_name,
            input_name=first.input_name,
            named_inputs=first.named_inputs,
        )
        return _gradcheck(ctx, first.func, first.inputs)

    return _run(body, flags, raise_exception)


def gradcheck_report(func: Callable[..., Any], inputs: Any, **kwargs: Any) -> GradcheckReport:
    """Run gradcheck and return what happened as a GradcheckReport (never raises GradcheckError)."""
    return _report(gradcheck, func, inputs, kwargs)


def gradgradcheck_report(
    func: Callable[..., Any], inputs: Any, grad_outputs: Any = None, **kwargs: Any
) -> GradcheckReport:
    """Run gradgradcheck and return what happened as a GradcheckReport."""
    return _report(gradgradcheck, func, inputs, dict(kwargs, grad_outputs=grad_outputs))


# ------------------------------------------------------------------------------------ internals
_STATS_SINK: ContextVar[list[EvalStats] | None] = ContextVar("opcheck_stats_sink", default=None)
"""Where the checks started in this context put their EvalStats: the innermost report's list, if any."""


def _report(check: Callable[..., bool], func: Func, inputs: Any, kwargs: dict[str, Any]) -> GradcheckReport:
    kwargs = dict(kwargs)
    kwargs.pop("raise_exception", None)
    sink: list[EvalStats] = []
    token = _STATS_SINK.set(sink)
    start = time.perf_counter()
    try:
        check(func, inputs, raise_exception=True, **kwargs)
        error = None
    except GradcheckError as e:
        error = e
    finally:
        _STATS_SINK.reset(token)
    seconds = time.perf_counter() - start
    return GradcheckReport(
        passed=error is None,
        error=error,
        check=getattr(error, "check", None),
        path=getattr(error, "path", None),
        mismatch=getattr(error, "mismatch", None),
        stats=sink[0] if sink else EvalStats(),
        seconds=seconds,
    )


def _run(body: Callable[[CheckContext], bool], flags: CheckFlags, raise_exception: bool) -> bool:
    # Fast mode evaluates two points per input; the evaluator there only serves to localize failures.
    evaluator = Evaluator(batch=batching_enabled(), memory_budget=DEFAULT_MEMORY_BUDGET, clock=adaptive_clock())
    ctx = CheckContext(flags, evaluator)
    sink = _STATS_SINK.get()
    if sink is not None:
        sink.append(evaluator.stats)
    try:
        return body(ctx)
    except _TorchGradcheckError as e:
        if raise_exception:
            if not isinstance(e, GradcheckError):
                raise GradcheckError(str(e)) from e
            raise
        return False
    finally:
        ctx.numerical_cache.clear()


def _gradcheck(ctx: CheckContext, func: Func, inputs: Inputs) -> bool:
    """One gradcheck call: the Jacobian comparisons (fused where fast_mode="auto" allows), then the
    checks beside them, in torch's order."""
    flags = ctx.flags
    if flags.check_forward_ad or flags.check_batched_forward_grad:
        load_forward_ad_decompositions()  # as torch's gradcheck loads them (see _util.make_dual)
    check_inputs(inputs)
    call = Call.of(func, inputs)
    check_outputs(call.outputs)
    # The Jacobian comparisons' call: sparse and MKLDNN inputs through dense stand-ins
    # (layouts.py, loaded for them); the checks after them run on the call as given, as torch's do.
    layouts = None
    if any(requires_grad(a) and is_layout_input(a) for a in inputs):
        from opcheck.engine.layouts import LayoutInputs

        layouts = LayoutInputs(inputs, bool(flags.masked))
    if layouts:
        ctx = replace(
            ctx, layouts=layouts, stepwise=Stepwise(projections_first=True)
        )  # the rebuilt layouts cannot be vmapped
        ctx.evaluator.stop("forward", "vjp", "jvp_func", "jvp")  # loops throughout
        jacobian_call = Call.of(layouts.wrap(func), layouts.inputs)
        layouts.given = call
    else:
        jacobian_call = call
    forward_ad = flags.check_forward_ad and not layouts
    if flags.auto or not flags.fast_mode:  # fast_mode=False: the full check's fused pass first
        settled, ctx, jacobian_call = auto.check(
            ctx, jacobian_call, forward_ad=forward_ad, fused=not layouts, full_mode=not flags.auto
        )
        if settled:
            return True
        if not layouts:  # a fused pass that fell back leaves a fresh call, for the side checks too
            call = jacobian_call
    else:
        from opcheck.engine.modes.fast import fast_check  # torch's fast mode: loaded on first use

        compare_parts(ctx, fast_check, jacobian_call, forward_ad=forward_ad)
    if flags.check_forward_ad and layouts is not None:
        layouts.refuse_forward_ad(call.inputs)
    _side_checks(ctx, call)
    return True


def _side_checks(ctx: CheckContext, call: Call) -> None:
    """The checks after the Jacobian comparisons: batched gradients, zero and undefined grad_outputs."""
    flags, func, inputs, outputs = ctx.flags, call.func, call.inputs, call.outputs
    if flags.check_batched_forward_grad:
        aux_checks.check_batched_grad_forward_ad(ctx, func, inputs)
    if not flags.check_backward_ad:
        return
    for i, o in enumerate(outputs):
        if flags.check_batched_grad:
            aux_checks.check_batched_grad(ctx, inputs, o, i)
    aux_checks.check_backward_mul_by_grad_output(ctx, outputs, inputs, flags.masked)
    if flags.check_undefined_grad:
        aux_checks.check_undefined_backward_mode(ctx, func, outputs, inputs)
