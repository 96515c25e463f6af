"""Public entry points: gradcheck / gradgradcheck (torch's signatures) and their report forms."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal, Union

import torch

from opcheck.engine import aux_checks
from opcheck.engine._util import as_tuple, check_inputs, check_outputs, differentiable_outputs, requires_grad
from opcheck.engine.batching import DEFAULT_MEMORY_BUDGET, EvalStats, Evaluator, adaptive_clock, batching_enabled
from opcheck.engine.auto import auto_check, jacobian_sides
from opcheck.engine.fused import Fallback, fused_check
from opcheck.engine.fused_projected import projected_check
from opcheck.engine.layouts import LayoutInputs
from opcheck.engine.core import DEFAULT_JACOBIAN_BUDGET, CheckContext, fast_check, full_check
from opcheck.engine.diagnostics import JacobianMismatch
from opcheck.engine.errors import GradcheckError


FastMode = Union[bool, Literal["auto"]]


@dataclass(frozen=True)
class GradcheckReport:
    """The outcome of one gradcheck/gradgradcheck call as a value."""

    passed: bool
    error: GradcheckError | None
    check: str | None  # which check failed
    path: str | None  # derivative path of the failed check
    mismatch: JacobianMismatch | None
    stats: EvalStats
    seconds: float

    @property
    def message(self) -> str:
        return str(self.error) if self.error is not None else ""


def gradcheck(
    func: Callable,
    inputs,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    check_grad_dtypes: bool = False,
    check_batched_grad: bool = False,
    check_batched_forward_grad: bool = False,
    check_forward_ad: bool = False,
    check_backward_ad: bool = True,
    fast_mode: FastMode = False,
    masked: bool | None = None,
    jacobian_budget: int | None = None,
) -> bool:
    """Check analytical gradients of `func` at `inputs` against finite differences.

    Same arguments, defaults and verdicts as torch.autograd.gradcheck. With fast_mode=False the
    full Jacobian is computed in vmapped batches (falling back to one column at a time for
    functions that cannot be vmapped); a failure names the entries that disagree.

    fast_mode="auto" (opcheck only) runs the full check while the differentiable inputs and the
    outputs have at most 128 elements together, and beyond it entrywise projection checks that
    never hold the Jacobian; up to `jacobian_budget` entries (default 2**20) a call they do not
    pass is decided by the full check. See opcheck.engine.auto for what they guarantee.
    `jacobian_budget` is ignored unless fast_mode="auto".
    """
    flags = dict(eps=eps, atol=atol, rtol=rtol, nondet_tol=nondet_tol, check_undefined_grad=check_undefined_grad,
                 check_grad_dtypes=check_grad_dtypes, check_batched_grad=check_batched_grad,
                 check_batched_forward_grad=check_batched_forward_grad, check_forward_ad=check_forward_ad,
                 check_backward_ad=check_backward_ad, fast_mode=fast_mode, masked=masked)
    _validate_gradcheck_flags(flags)
    budget = _validate_auto(fast_mode, jacobian_budget)
    return _run(lambda ctx: _gradcheck(ctx, func, inputs, **flags), flags, raise_exception, budget)


def gradgradcheck(
    func: Callable,
    inputs,
    grad_outputs=None,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    gen_non_contig_grad_outputs: bool = False,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    check_grad_dtypes: bool = False,
    check_batched_grad: bool = False,
    check_fwd_over_rev: bool = False,
    check_rev_over_rev: bool = True,
    fast_mode: FastMode = False,
    masked: bool = False,
    jacobian_budget: int | None = None,
) -> bool:
    """Check second derivatives: gradcheck of the VJP of `func` w.r.t. inputs and grad_outputs.

    Same arguments, defaults and verdicts as torch.autograd.gradgradcheck. Failures name the path:
    "VJP of VJP" (check_rev_over_rev) or "JVP of VJP" (check_fwd_over_rev). fast_mode="auto"
    applies gradcheck's auto mode to that function (its Jacobian has (Σ numel_in + Σ numel_out) *
    Σ numel_in entries).
    """
    if not (check_fwd_over_rev or check_rev_over_rev):
        raise AssertionError("Expected at least one of check_fwd_over_rev or check_rev_over_rev to be True")
    if check_undefined_grad and not check_rev_over_rev:
        raise AssertionError("Setting check_undefined_grad=True requires check_rev_over_rev to be True")
    if check_batched_grad and not check_rev_over_rev:
        raise AssertionError("Setting check_batched_grad=True requires check_rev_over_rev to be True")
    flags = dict(eps=eps, atol=atol, rtol=rtol, nondet_tol=nondet_tol, check_undefined_grad=check_undefined_grad,
                 check_grad_dtypes=check_grad_dtypes, check_batched_grad=check_batched_grad,
                 check_batched_forward_grad=False, check_forward_ad=check_fwd_over_rev,
                 check_backward_ad=check_rev_over_rev, fast_mode=fast_mode, masked=masked)

    def body(ctx):
        new_func, all_inputs, names = _second_order(func, inputs, grad_outputs, gen_non_contig_grad_outputs)
        ctx.backward_path, ctx.forward_path = "VJP of VJP", "JVP of VJP"
        ctx.output_name, ctx.input_name = names
        return _gradcheck(ctx, new_func, all_inputs, **flags)

    budget = _validate_auto(fast_mode, jacobian_budget)
    return _run(body, flags, raise_exception, budget)


def gradcheck_report(func: Callable, inputs, **kwargs) -> GradcheckReport:
    """Run gradcheck and return what happened as a GradcheckReport (never raises GradcheckError)."""
    return _report(gradcheck, func, inputs, kwargs)


def gradgradcheck_report(func: Callable, inputs, grad_outputs=None, **kwargs) -> GradcheckReport:
    """Run gradgradcheck and return what happened as a GradcheckReport."""
    return _report(gradgradcheck, func, inputs, dict(kwargs, grad_outputs=grad_outputs))


# ------------------------------------------------------------------------------------ internals
_STATS_SINK: list[EvalStats] = []


def _report(check, func, inputs, kwargs) -> GradcheckReport:
    kwargs = dict(kwargs)
    kwargs.pop("raise_exception", None)
    sink: list[EvalStats] = []
    _STATS_SINK.append(sink)  # type: ignore[arg-type]
    start = time.perf_counter()
    try:
        check(func, inputs, raise_exception=True, **kwargs)
        error = None
    except GradcheckError as e:
        error = e
    finally:
        _STATS_SINK.pop()
    seconds = time.perf_counter() - start
    stats = sink[0] if sink else EvalStats()
    return GradcheckReport(passed=error is None, error=error, check=getattr(error, "check", None),
                           path=getattr(error, "path", None), mismatch=getattr(error, "mismatch", None),
                           stats=stats, seconds=seconds)


def _validate_auto(fast_mode, jacobian_budget) -> int:
    if isinstance(fast_mode, str) and fast_mode != "auto":
        raise ValueError(f"fast_mode must be True, False or 'auto', got {fast_mode!r}")
    if jacobian_budget is None:
        return DEFAULT_JACOBIAN_BUDGET
    if isinstance(jacobian_budget, bool) or not isinstance(jacobian_budget, int) or jacobian_budget < 0:
        raise ValueError(f"jacobian_budget must be a non-negative int (Jacobian entries), got {jacobian_budget!r}")
    return jacobian_budget


def _run(body, flags, raise_exception, jacobian_budget=DEFAULT_JACOBIAN_BUDGET):
    # Fast mode evaluates two points per input; the evaluator there only serves to localize failures.
    evaluator = Evaluator(batch=batching_enabled(), memory_budget=DEFAULT_MEMORY_BUDGET,
                          clock=adaptive_clock())
    ctx = CheckContext(eps=flags["eps"], atol=flags["atol"], rtol=flags["rtol"], nondet_tol=flags["nondet_tol"],
                       check_grad_dtypes=flags["check_grad_dtypes"], evaluator=evaluator,
                       jacobian_budget=jacobian_budget)
    if _STATS_SINK:
        _STATS_SINK[-1].append(evaluator.stats)  # type: ignore[arg-type]
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


from torch.autograd.gradcheck import GradcheckError as _TorchGradcheckError  # noqa: E402


def _validate_gradcheck_flags(flags):
    if not (flags["check_forward_ad"] or flags["check_backward_ad"]):
        raise AssertionError("Expected at least one of check_forward_ad or check_backward_ad to be True")
    if flags["check_batched_grad"] and not flags["check_backward_ad"]:
        raise AssertionError("Setting check_batched_grad=True requires check_backward_ad to be True")
    if flags["check_batched_forward_grad"] and not flags["check_forward_ad"]:
        raise AssertionError("Setting check_batched_forward_grad=True requires check_forward_ad to be True")


def _gradcheck(ctx: CheckContext, func, inputs, *, eps, atol, rtol, nondet_tol, check_undefined_grad,
               check_grad_dtypes, check_batched_grad, check_batched_forward_grad, check_forward_ad,
               check_backward_ad, fast_mode, masked) -> bool:
    tupled_inputs = as_tuple(inputs)
    check_inputs(tupled_inputs)
    func_out = func(*tupled_inputs)
    outputs = differentiable_outputs(func_out)
    check_outputs(outputs)
    # The Jacobian comparisons' function and inputs: sparse and MKLDNN inputs through dense
    # stand-ins (layouts.py); the checks after them run on the call as given, as torch's do.
    layouts = LayoutInputs(tupled_inputs, masked)
    jac_func, jac_inputs, jac_out, jac_outputs = func, tupled_inputs, func_out, outputs
    if layouts:
        jac_func, jac_inputs = layouts.wrap(func), layouts.inputs
        jac_out = jac_func(*jac_inputs)
        jac_outputs = differentiable_outputs(jac_out)
        ctx.layouts = layouts
        ctx.projections_first = True  # the rebuilt layouts cannot be vmapped: loops throughout
        for kind in ("forward", "vjp", "jvp_func", "jvp"):
            setattr(ctx.evaluator, f"batch_{kind}", False)
    if isinstance(fast_mode, str) and not layouts:
        for attempt in _fused_passes(ctx, tupled_inputs, func_out):
            try:
                attempt(ctx, func, func_out, tupled_inputs, outputs, check_backward_ad=check_backward_ad,
                        check_forward_ad=check_forward_ad, check_undefined_grad=check_undefined_grad,
                        check_batched_grad=check_batched_grad, check_batched_forward_grad=check_batched_forward_grad,
                        masked=masked)
                return True
            except Fallback as e:  # the next pass, or the step-by-step check, decides from a fresh start
                ctx.evaluator.stats.fallbacks.append(f"{'fused' if attempt is fused_check else 'projected'}: {e}")
                for kind in e.distrust:
                    setattr(ctx.evaluator, f"batch_{kind}", False)
                ctx.evaluator.stats.auto_paths.clear()
                ctx.numerical_cache.clear()
                func_out = func(*tupled_inputs)
                outputs = jac_outputs = differentiable_outputs(func_out)
                jac_out = func_out
                if attempt is projected_check and e.loops:
                    # Without vmap support the full check would loop over every column and row:
                    # the step-by-step projections loop over a handful.
                    ctx.projections_first = True
                    break
    compare = auto_check if isinstance(fast_mode, str) else fast_check if fast_mode else full_check
    _real_imag(ctx, compare, jac_func, jac_out, jac_inputs, jac_outputs,
               check_forward_ad=check_forward_ad and not layouts, check_backward_ad=check_backward_ad,
               check_undefined_grad=check_undefined_grad)
    if check_forward_ad and layouts:
        layouts.refuse_forward_ad()
    if check_batched_forward_grad:
        aux_checks.test_batched_grad_forward_ad(ctx, func, tupled_inputs)
    if not check_backward_ad:
        return True
    for i, o in enumerate(outputs):
        if check_batched_grad:
            aux_checks.test_batched_grad(ctx, tupled_inputs, o, i)
    aux_checks.test_backward_mul_by_grad_output(ctx, outputs, tupled_inputs, masked)
    if check_undefined_grad and check_backward_ad:
        aux_checks.test_undefined_backward_mode(ctx, func, outputs, tupled_inputs)
    return True


def _fused_passes(ctx: CheckContext, inputs: tuple, func_out) -> list[Callable]:
    """fast_mode="auto"'s fused passes, in the order they are tried.

    Up to core.FULL_CHECK_ELEMENTS input and output elements the full check is cheap: its fused
    pass. Beyond, the projections' fused pass; within the Jacobian budget a call it does not pass
    goes on to the full check, so there its failures are the full check's. A function the
    projections' pass cannot vmap goes to the step-by-step projections (ctx.projections_first), and
    within the budget a failure there to the full check too.
    """
    n, m = jacobian_sides(inputs, as_tuple(func_out))
    if ctx.full_first(n, m):
        return [fused_check]
    return [projected_check, fused_check] if n * m <= ctx.jacobian_budget else [projected_check]


def _apply_to_complex_outputs(fn, part):
    def wrapped(*inputs):
        return tuple(part(o) if o.is_complex() else o for o in as_tuple(fn(*inputs)))
    return wrapped


def _apply_to_complex_inputs(fn, complex_indices, tupled_inputs, make):
    def wrapped(*inputs):
        new = list(inputs)
        for i in complex_indices:
            new[i] = make(new[i], tupled_inputs[i])
        return as_tuple(fn(*new))
    return wrapped


def _real_imag(ctx, compare, func, func_out, tupled_inputs, outputs, *, check_forward_ad, check_backward_ad,
               check_undefined_grad):
    """Complex outputs are checked as real and imaginary parts (backward), complex inputs likewise (forward)."""
    complex_out = [i for i, o in enumerate(outputs) if o.is_complex()]
    if check_backward_ad:
        if any(o.is_complex() for o in as_tuple(func_out)):
            for part, test_imag in ((torch.imag, True), (torch.real, False)):
                fn = _apply_to_complex_outputs(func, part)
                out = fn(*tupled_inputs)
                compare(ctx, fn, out, tupled_inputs, differentiable_outputs(out), complex_indices=complex_out,
                        test_imag=test_imag)
        else:
            compare(ctx, func, func_out, tupled_inputs, outputs)
    if check_forward_ad:
        complex_inp = [i for i, a in enumerate(tupled_inputs) if isinstance(a, torch.Tensor) and a.is_complex()]
        if complex_inp:
            parts = (
                (lambda inp, orig: orig.real + inp * 1j, lambda a: a.imag, True),
                (lambda inp, orig: inp + orig.imag * 1j, lambda a: a.real, False),
            )
            checked = []
            for make, take, test_imag in parts:
                fn = _apply_to_complex_inputs(func, complex_inp, tupled_inputs, make)
                part_inputs = [take(a) if isinstance(a, torch.Tensor) and a.is_complex() else a for a in tupled_inputs]
                out = fn(*part_inputs)
                compare(ctx, fn, out, part_inputs, differentiable_outputs(out), use_forward_ad=True,
                        complex_indices=complex_inp, test_imag=test_imag)
                checked.append((fn, out, part_inputs))
            if check_undefined_grad:
                for fn, out, part_inputs in checked:
                    aux_checks.test_undefined_forward_mode(ctx, fn, out, part_inputs)
        else:
            compare(ctx, func, func_out, tupled_inputs, outputs, use_forward_ad=True)
            if check_undefined_grad:
                aux_checks.test_undefined_forward_mode(ctx, func, outputs, tupled_inputs)


# ---------------------------------------------------------------------------- second order
def _random_grad_outputs(outputs, noncontiguous: bool):
    """gradgradcheck's grad_outputs, drawn as torch draws them (from the global generator, uniform in
    [-1, 1)): a seeded caller checks the same function with either tool, so verdicts agree."""
    return tuple(
        torch.testing.make_tensor(x.shape, dtype=x.dtype if (x.is_floating_point() or x.is_complex()) else torch.double,
                                  device=x.device, low=-1, high=1, requires_grad=True, noncontiguous=noncontiguous)
        for x in outputs)


def _second_order(func, inputs, grad_outputs, gen_non_contig_grad_outputs):
    """The function gradgradcheck checks: inputs + grad_outputs -> grads of inputs (graph kept)."""
    tupled_inputs = as_tuple(inputs)
    if grad_outputs is None:
        outs = differentiable_outputs(func(*tupled_inputs))
        tupled_grad_outputs = _random_grad_outputs(outs, gen_non_contig_grad_outputs)
    else:
        tupled_grad_outputs = as_tuple(grad_outputs)
    num_outputs = len(tupled_grad_outputs)
    diff_input_indices = {i for i, x in enumerate(tupled_inputs) if requires_grad(x)}
    diff_go_indices = {i for i, x in enumerate(tupled_grad_outputs) if x.requires_grad}

    def new_func(*args):
        input_args = tuple(x.requires_grad_() if i in diff_input_indices else x
                           for i, x in enumerate(args[:-num_outputs]))
        outputs = differentiable_outputs(func(*input_args))
        gos = tuple(x.requires_grad_() if i in diff_go_indices else x for i, x in enumerate(args[-num_outputs:]))
        diff_args = tuple(x for i, x in enumerate(input_args) if i in diff_input_indices)
        grads = torch.autograd.grad(outputs, diff_args, gos, create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    def vmap_form(*args):
        # The same function through torch.func, which (unlike autograd.grad) composes with vmap.
        input_args = list(args[:-num_outputs])
        gos = tuple(args[-num_outputs:])
        order = sorted(diff_input_indices)

        def f(*diff):
            full = list(input_args)
            for i, d in zip(order, diff):
                full[i] = d
            return differentiable_outputs(func(*full))

        _, pullback = torch.func.vjp(f, *[input_args[i] for i in order])
        return tuple(pullback(gos))

    new_func.vmap_form = vmap_form  # type: ignore[attr-defined]

    n_in = len(diff_input_indices)
    sorted_diff = sorted(diff_input_indices)
    sorted_go = sorted(diff_go_indices)

    def input_name(j: int) -> str:
        if j < n_in:
            return f"input {sorted_diff[j]}"
        return f"grad_output {sorted_go[j - n_in]}"

    def output_name(i: int) -> str:
        return f"grad of input {sorted_diff[i]}" if i < n_in else f"output {i}"

    return new_func, tupled_inputs + tupled_grad_outputs, (output_name, input_name)
