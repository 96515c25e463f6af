"""What fast_mode="auto"'s two fused passes (fused.py, fused_projected.py) have in common.

A pass only decides a pass: what it cannot vouch for raises Fallback, and the step-by-step check
(or the next pass) decides what the user sees.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine._util import (
    Func,
    Inputs,
    as_tuple,
    diff_input_indices,
    exception_line,
    float_outputs,
    floats,
    legacy_vmap,
    make_dual,
    mapped,
    of_inputs,
    unpack_dual,
    vmap_form,
)
from opcheck.engine.batching import BatchingKind, Evaluator, combination_close
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.errors import GradcheckError
from opcheck.engine.route import fused_elements

if TYPE_CHECKING:  # forward AD's classes load with its first check
    from opcheck.engine.batching import ForwardCalls


class Fallback(Exception):
    """The fused pass cannot vouch for this call: the step-by-step check decides.

    `distrust` names the kind of batching (an Evaluator kind: "vjp", "forward", "jvp_func") whose
    batched result disagreed with a plain call: the step-by-step check then runs without it.
    `loops`: the function cannot be evaluated in batches as the pass needs (no vmap support, or
    batching is off), so a check of its every column and row would run them one call at a time.
    `projections`: the step-by-step projections cost fewer calls than the pass would: they go first.
    `disagreed`: a batched result disagreed with a plain call (what the values decide, not the sizes;
    set wherever `distrust` is).
    """

    def __init__(
        self,
        message: str,
        distrust: tuple[BatchingKind, ...] = (),
        loops: bool = False,
        projections: bool = False,
        disagreed: bool = False,
    ):
        super().__init__(message)
        self.distrust = distrust
        self.loops = loops
        self.projections = projections
        self.disagreed = disagreed or bool(distrust)


@contextlib.contextmanager
def only_a_pass() -> Iterator[None]:
    """A fused pass vouches only for a call it passes: whatever else happens inside is a Fallback,
    and the step-by-step check (or the next pass) decides what the user sees."""
    try:
        yield
    except GradcheckError as e:
        raise Fallback(f"{getattr(e, 'check', None) or 'check'} failed") from e
    except Fallback:
        raise
    except Exception as e:
        raise Fallback(exception_line(e)) from e


def real_call(call: Call) -> tuple[Call, bool]:
    """The call with its complex outputs seen through torch.view_as_real, and whether it had any."""
    if not any(isinstance(o, torch.Tensor) and o.is_complex() for o in call.func_out):
        return call, False
    from opcheck.engine.comparison.complex_views import as_real, real_outputs  # complex outputs': on first use

    real_out = as_real(call.func_out)
    return Call(real_outputs(call.func), call.inputs, real_out, tuple(o for o in real_out if o.requires_grad)), True


def real_inputs_call(call: Call) -> Call | None:
    """The call with its complex differentiable inputs seen through torch.view_as_real: a function
    of real (..., 2) inputs that hands `func` the complex tensors back (torch.view_as_complex of the
    same memory, so with the given strides). Its Jacobian is the complex input's real and imaginary
    columns side by side, which torch's gradcheck compares one part at a time. None where no input
    is complex, one is a conjugate or negative view (which view_as_real does not take), or the
    function raises on the views (the step-by-step check then calls it as given)."""
    inputs = list(call.inputs)
    complex_ = [j for j in diff_input_indices(inputs) if inputs[j].is_complex() and inputs[j].layout == torch.strided]
    if not complex_ or any(inputs[j].is_conj() or inputs[j].is_neg() for j in complex_):
        return None
    for j in complex_:
        inputs[j] = torch.view_as_real(inputs[j].detach()).requires_grad_()
    viewed = frozenset(complex_)

    def as_complex(xs: Sequence[Any]) -> list[Any]:
        return [torch.view_as_complex(x) if j in viewed else x for j, x in enumerate(xs)]

    try:  # mapped: gradgradcheck's first derivative keeps its vmap form
        return Call.of(mapped(call.func, args=as_complex), tuple(inputs))
    except Exception:  # noqa: BLE001 - e.g. an in-place write to an input, which a view refuses
        return None


def applies(ctx: CheckContext, call: Call, projected: bool = False) -> None:
    """Raise Fallback unless a fused pass covers the call: real strided inputs and outputs, batching
    on, within the memory budget (and, for the full check's pass, within the Jacobian budget)."""
    ev, inputs, outputs = ctx.evaluator, call.inputs, call.outputs
    if not (ev.batch_forward and ev.batch_vjp):
        raise Fallback("batching is off", loops=True)
    diff = diff_input_indices(inputs)
    for j in diff:
        x = inputs[j]
        if x.layout != torch.strided or not x.is_floating_point():
            raise Fallback(f"input {j} is not a real strided tensor")
    # The full check's pass of backward alone compares the outputs that require grad and leaves the
    # others' differences aside, as torch's slow mode drops their numerical Jacobian.
    why = output_refusal(call.func_out, all_require_grad=projected or ctx.flags.check_forward_ad)
    if why is not None:
        raise Fallback(why)
    if not outputs:
        raise Fallback("no differentiable outputs")
    sizes = ctx.sizes(sum(inputs[j].numel() for j in diff), sum(o.numel() for o in outputs), len(diff))
    if not projected and not sizes.within_budget:
        raise Fallback("beyond the Jacobian budget")
    itemsize = max(inputs[j].element_size() for j in diff)
    if fused_elements(sizes, len(outputs), projected) * itemsize > ev.memory_budget:
        raise Fallback("more rows than fit the memory budget")


def output_refusal(outs: Sequence[Any], all_require_grad: bool = True) -> str | None:
    """Why a fused pass does not take these outputs (None: it does): every output a tensor; the
    float ones real and strided, and, with `all_require_grad`, requiring grad (without it, a float
    output that does not require grad is taken, and only its differences are computed). The cost
    estimate's dry run asks the same, through the engine.

    After an integer or bool output, torch's slow mode fills the k-th float output's differences
    with output k's (linalg.lstsq: rank, then singular values), and keeps them where output k
    requires grad: a pass agrees with it only where no output after the first integer one requires
    grad, and each float output there has as many elements as output k, or output k one, which
    torch's slow mode broadcasts (elsewhere it raises, and so does the step-by-step check)."""
    seen_other = False
    floats = 0
    for p, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            return f"output {p} is not a tensor"
        if not o.is_floating_point():
            if o.is_complex():
                return f"output {p} is complex"
            seen_other = True
            continue
        if o.layout != torch.strided or (all_require_grad and not o.requires_grad):
            return f"output {p} is not a real strided output that requires grad"
        if seen_other and (o.requires_grad or outs[floats].numel() not in (o.numel(), 1)):
            return f"output {p} after an output that is not a float tensor: torch's slow mode pairs it otherwise"
        floats += 1
    return None


def outputs_once(func: Func, func_out: Any) -> Func:
    """func, except that its first call returns the outputs already computed (graph and all)."""
    pending = [func_out]

    def call(*args: Any) -> Any:
        return pending.pop() if pending else func(*args)

    return call


TIE_FLOOR = 1e-6
"""tied_to_plain allows TIE_FLOOR * atol on top of the rounding of a reassociated sum."""


def tied_to_plain(ctx: CheckContext, weights: torch.Tensor, rows: torch.Tensor, plain: torch.Tensor) -> bool:
    """Whether one plain JVP along Σ_r w_r (direction r) agrees with Σ_r w_r rows[r] of the batched
    JVP rows (batching.combination_close), up to TIE_FLOOR * atol more: a Jacobian that is zero up
    to rounding (normalize along a dimension of size 1) gives rows and a plain JVP of rounding noise
    alone, which a relative allowance cannot cover, and a difference a millionth of atol cannot
    decide a comparison at atol."""
    return combination_close(weights, rows, plain, extra_atol=TIE_FLOOR * ctx.flags.atol)


def plain_jvp(
    ev: Evaluator, func: Func, inputs: Inputs, diff: Sequence[int], sizes: Sequence[int], u: torch.Tensor
) -> list[torch.Tensor]:
    """Tangents of func's float outputs (flattened) for the input direction u, with dual tensors."""
    ev.stats.jvp_calls += 1
    with fwAD.dual_level():
        args = list(inputs)
        offset = 0
        for j, size in zip(diff, sizes):
            x = inputs[j]
            args[j] = make_dual(x.detach(), u[offset : offset + size].reshape(x.shape).to(x.dtype))
            offset += size
        result = []
        for o in float_outputs(as_tuple(func(*args))):
            primal, tangent = unpack_dual(o)
            result.append(tangent.reshape(-1).clone() if tangent is not None else primal.new_zeros(primal.numel()))
        return result


def jvps_at_points(
    ev: Evaluator, fn: Func, base: Sequence[Any], diff: Sequence[int], points: Sequence[Any], tangents: Sequence[Any]
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """fn's float outputs at every row of `points` and their tangents along the same row of
    `tangents` (a (rows, *shape) tensor per input in diff, the other inputs at `base`), from one
    vmapped call (counted). The points are the caller's own tensors: fn may write into them.

    The rows enter torch.func.vmap as dual tensors of torch's forward AD, so the forward-AD formulas
    run once on the batched tensors: about half the Python of a torch.func.jvp per row under vmap,
    which is where that fails (a batched kernel without a forward-AD formula) or the function is
    gradgradcheck's first derivative (its vmap form composes with torch.func only).
    """
    ev.stats.batched_jvp_calls += 1
    form = vmap_form(fn)
    of_x = of_inputs(form, base, diff, floats)
    if form is fn:
        try:
            with fwAD.dual_level():
                duals = [make_dual(p, t) for p, t in zip(points, tangents)]
                primals, touts = [], []
                for o in as_tuple(ev.vmap(of_x, *duals)):
                    primal, tangent = unpack_dual(o)
                    primals.append(primal)
                    touts.append(tangent if tangent is not None else torch.zeros_like(primal))
                return tuple(primals), tuple(touts)
        except GradcheckError:
            raise
        except Exception:
            # torch.func's jvp below has batching rules of its own, but no forward AD the function
            # lacks: where one plain JVP raises too, so would it.
            _plain_jvp_of_first_row(of_x, points, tangents)
    k = len(diff)

    def one_row(*pt: torch.Tensor) -> Any:
        return torch.func.jvp(of_x, pt[:k], pt[k:])

    outs, touts_ = ev.vmap(one_row, *points, *tangents)
    return as_tuple(outs), as_tuple(touts_)


def _plain_jvp_of_first_row(of_x: Func, points: Sequence[Any], tangents: Sequence[Any]) -> None:
    """One plain JVP at the first row (a copy: the function may write into it); raises where it does."""
    with fwAD.dual_level():
        of_x(*(make_dual(p[0].clone(), t[0]) for p, t in zip(points, tangents)))


def outputs_at_points(ev: Evaluator, fn: Func, base: Sequence[Any], diff: Sequence[int], *deltas: torch.Tensor) -> Any:
    """fn's float outputs at base + δ for every row of `deltas` (a (rows, *shape) δ per input in
    diff), from one torch.func.vmap call (counted)."""
    of_x = of_inputs(vmap_form(fn), base, diff, floats)
    ev.stats.batched_calls += 1
    return ev.vmap(lambda *d: of_x(*(base[j] + x for j, x in zip(diff, d))), *deltas)


def legacy_jvps(ev: Evaluator, calls: ForwardCalls, diff: Sequence[int], *tangents: torch.Tensor) -> tuple[Any, ...]:
    """The float outputs' tangents (in their shapes) for every row of `tangents` (a (rows, *shape)
    tangent per input in diff), from make_dual under the legacy vmap, as torch's batched forward-AD
    check computes them (one call, counted; calls.check_dtype sees the tangents)."""
    if legacy_vmap is None:  # pragma: no cover - depends on the torch release
        raise RuntimeError("no legacy vmap in this torch release")
    from opcheck.engine.batching.jvp_columns import legacy_tangents  # forward AD's: on first use

    ev.stats.batched_jvp_calls += 1
    return as_tuple(legacy_vmap(legacy_tangents(calls, list(diff), flat=False))(*tangents))
