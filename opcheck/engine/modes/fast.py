"""The fast check: vᵀ J u, numerical against analytical, for random u and v (torch's fast mode).

As torch does, a mismatch is then localized: the full Jacobian block is recomputed, and what
fails there fails the call as it fails torch's. The numerical recompute covers every input, so the
report can say when the block is another input's (returned gradients swapped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine._util import (
    Inputs,
    allclose_promoted,
    as_tuple,
    autograd_grad,
    diff_input_indices,
    float_outputs,
    is_float_or_complex,
    make_duals,
    requires_grad,
    unpack_dual,
)
from opcheck.engine.batching import Differences
from opcheck.engine.comparison.compare import BACKWARD, Block, Part, block_mismatch
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.errors import fast_fail_slow_ok_note
from opcheck.engine.evaluation.analytical import (
    GRAD_OUTPUT_WRITTEN,
    analytical_jvp_jacobian,
    analytical_vjp_jacobian,
    fail_reentrancy,
    stack_rows,
)
from opcheck.engine.evaluation.numerical import numerical_jacobian
from opcheck.engine.modes.full import fail_no_differentiable_outputs
from opcheck.engine.reporting import torch_words

Direction = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
"""A fast-mode input direction: u, or (u_real, u_imag) for a complex input."""
LayoutVector = Callable[[torch.Tensor, torch.Generator, bool], torch.Tensor | None]


def _vec_from_tensor(x: torch.Tensor, generator: torch.Generator, downcast_complex: bool = False) -> torch.Tensor:
    dtype = x.dtype
    if downcast_complex:
        dtype = {torch.complex128: torch.float64, torch.complex64: torch.float32}.get(dtype, dtype)
    vec = torch.rand(x.numel(), generator=generator, device="cpu").to(dtype=dtype, device=x.device)
    vec /= vec.norm()
    return vec


def make_vectors(
    inp_tensors: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor] | None,
    *,
    use_forward_ad: bool,
    layout_vector: LayoutVector | None = None,
) -> tuple[list[torch.Tensor] | None, list[Direction]]:
    """torch's fast-mode directions: (v per output, or None with forward AD; u per input)."""
    # A fresh default-seeded generator, as torch uses: same projections, same verdicts.
    g = torch.Generator()

    def direction(inp: torch.Tensor) -> torch.Tensor:
        vec = layout_vector(inp, g, True) if layout_vector is not None else None
        return _vec_from_tensor(inp, g, True) if vec is None else vec

    all_u: list[Direction] = []
    for inp in inp_tensors:
        ur = direction(inp)
        all_u.append((ur, direction(inp)) if inp.is_complex() else ur)
    all_v = None if use_forward_ad or outputs is None else [_vec_from_tensor(out, g) for out in outputs]
    return all_v, all_u


def real_direction(u: Direction) -> torch.Tensor:
    """The direction of a real input; forward AD checks complex inputs part by part (parts.py)."""
    if isinstance(u, tuple):
        raise ValueError(torch_words.forward_complex_inputs())
    return u


def _numerical_jvp(
    ctx: CheckContext, fn: Callable[..., Any], inputs: Inputs, idx: int, u: Direction
) -> list[torch.Tensor]:
    """Directional central difference along u (real) or (ur, ui) (complex) for every output."""
    x = inputs[idx]
    eps = ctx.flags.eps
    diffs = Differences(ctx.evaluator, fn, inputs, eps)
    if isinstance(u, tuple):
        ds_dx = diffs.along(x.data, u[0].reshape(x.shape) * eps)
        ds_dy = diffs.along(x.data, u[1].reshape(x.shape) * eps * 1j)
        return [dx + dy * 1j for dx, dy in zip(ds_dx, ds_dy)]
    return diffs.along(x.data, u.reshape(x.shape) * eps)


def _adjusted_atol(atol: float, u: Direction, v: torch.Tensor | None) -> float:
    sum_v = 1.0 if v is None else float(v.sum())
    if isinstance(u, tuple):
        return atol * (float(u[0].sum()) + float(u[1].sum())) * sum_v
    return atol * float(u.sum()) * sum_v


def fast_check(ctx: CheckContext, call: Call, part: Part = BACKWARD) -> bool:
    """v^T J u, numerical against analytical, for random u and v (torch's fast mode)."""
    func, inputs, func_out, outputs = call.func, call.inputs, call.func_out, call.outputs
    inp_idx = diff_input_indices(inputs)
    layout_vector = ctx.layouts.random_vector if ctx.layouts is not None else None
    all_v, all_u = make_vectors(
        [inputs[i] for i in inp_idx], outputs, use_forward_ad=part.forward, layout_vector=layout_vector
    )
    numerical: list[list[torch.Tensor]] = []
    for idx, u in zip(inp_idx, all_u):
        all_ju = _numerical_jvp(ctx, func, inputs, idx, u)
        filtered = [ju for ju, o in zip(all_ju, func_out) if is_float_or_complex(o)]
        numerical.append(filtered if all_v is None else [(v * ju).sum() for v, ju in zip(all_v, filtered)])

    if all_v is None:
        analytical = _analytical_fast_forward(ctx, func, inputs, func_out, all_u)
    else:
        if not outputs:
            _check_no_differentiable_outputs_fast(ctx, func, inputs, inp_idx, all_u)
        analytical = [_projected_vjps(ctx, inputs, o, v, all_u) for o, v in zip(outputs, all_v)]

    for i, n_for_input in enumerate(numerical):
        for j, n in enumerate(n_for_input):
            a = analytical[i][j] if part.forward else analytical[j][i]
            n = n.to(device=a.device)
            atol = _adjusted_atol(ctx.flags.atol, all_u[i], all_v[j] if all_v else None)
            block = part.block(j, i)
            if not allclose_promoted(a, n, ctx.flags.rtol, atol, where=block.named(ctx, "vᵀJu, atol scaled")):
                _localize_fast_failure(ctx, call, block, a, n, atol)
    return True


def _projected_vjps(
    ctx: CheckContext, inputs: Inputs, output: torch.Tensor, v: torch.Tensor, all_u: list[Direction]
) -> list[torch.Tensor]:
    """Per input, vᵀ J u from backward."""
    scalars = []
    for vj, u in zip(_analytical_fast_backward(ctx, inputs, output, v), all_u):
        if isinstance(u, tuple):
            tv = torch.view_as_real(vj.resolve_conj())
            scalars.append(tv.select(-1, 0).dot(u[0]) + 1j * tv.select(-1, 1).dot(u[1]))
        else:
            scalars.append(vj.dot(u))
    return scalars


def _analytical_fast_backward(
    ctx: CheckContext, inputs: Inputs, output: torch.Tensor, v: torch.Tensor
) -> list[torch.Tensor]:
    diff_inputs = [a for a in inputs if requires_grad(a)]
    go = v.reshape(output.shape)

    def once() -> list[list[torch.Tensor | None]]:
        ctx.evaluator.stats.vjp_calls += 1
        grads = autograd_grad((output,), diff_inputs, (go,), retain_graph=True)
        return [[g.clone() if isinstance(g, torch.Tensor) else None] for g in grads]

    given = go.clone()  # torch hands go itself to both passes; this copy tells a write into it
    jac1, types_ok = stack_rows(once(), diff_inputs, 1)
    written = not torch.equal(go, given)
    jac2, _ = stack_rows(once(), diff_inputs, 1)
    if not types_ok:
        ctx.fail_gradient_dtype()
    nondet_tol = ctx.flags.nondet_tol
    for k, (a, b) in enumerate(zip(jac1, jac2)):
        if a.numel() != 0 and (a - b).abs().max() > nondet_tol:
            cause = GRAD_OUTPUT_WRITTEN if written else None
            fail_reentrancy(ctx, nondet_tol, a.reshape(-1), b.reshape(-1), k, block=False, cause=cause)
    return [j.t().squeeze(0) for j in jac1]


def _analytical_fast_forward(
    ctx: CheckContext, func: Callable[..., Any], inputs: Inputs, func_out: tuple[Any, ...], all_u: list[Direction]
) -> list[list[torch.Tensor]]:
    floats = float_outputs(func_out)
    diff = diff_input_indices(inputs)
    result = [[o.new_zeros((o.numel(),), layout=torch.strided) for o in floats] for _ in diff]
    with fwAD.dual_level():
        duals, tangents = make_duals(inputs)
        for i, (t, u) in enumerate(zip(tangents.values(), all_u)):
            t.copy_(real_direction(u).view_as(t))
            ctx.evaluator.stats.jvp_calls += 1
            for k, o in enumerate(float_outputs(as_tuple(func(*duals)))):
                primal, tangent = unpack_dual(o)
                if tangent is not None:
                    ctx.check_forward_dtype(primal, tangent)
                if tangent is None:
                    result[i][k].zero_()
                else:
                    result[i][k].copy_(tangent.detach().reshape(-1))
            t.zero_()
    return result


def _check_no_differentiable_outputs_fast(
    ctx: CheckContext, func: Callable[..., Any], inputs: Inputs, inp_idx: list[int], all_u: list[Direction]
) -> None:
    for idx, u in zip(inp_idx, all_u):
        for jvp in _numerical_jvp(ctx, func, inputs, idx, u):
            if jvp.numel() == 0:
                continue
            if jvp.abs().max() > ctx.flags.nondet_tol:
                fail_no_differentiable_outputs(
                    ctx, "the outputs do not require grad, yet they change when inputs are perturbed"
                )


def _localize_fast_failure(
    ctx: CheckContext, call: Call, block: Block, a: torch.Tensor, n: torch.Tensor, atol: float
) -> None:
    """Fast mode saw a mismatch in v^T J u: recompute this block in full to say where it is."""
    func, inputs, outputs, rtol = call.func, call.inputs, call.outputs, ctx.flags.rtol
    input_i, output_j, is_forward_ad = block.input_idx, block.output_idx, block.is_forward_ad
    head = (
        f"\nfast mode: projected {'J u' if is_forward_ad else 'v^T J u'} analytical "
        f"{_fmt(a)}, numerical {_fmt(n)}, tolerance atol={atol:.4g} (atol scaled by the projections) + "
        f"rtol={rtol:g}; recomputed the full Jacobian block:\n"
    )
    # As torch does, to say where: what fails there fails the call as it fails torch's.
    # torch recomputes with the differentiable outputs only, though the fast check ran over every
    # float output: past them its index raises (IndexError), and so does this one.
    blocks = numerical_jacobian(ctx, func, inputs, outputs, is_forward_ad=is_forward_ad)
    numerical = blocks[input_i][output_j]
    # Every input's block for this output is at hand: a gradient returned for another input is named.
    numerical_of_inputs = [per_output[output_j] for per_output in blocks]
    if is_forward_ad:
        analytical = _one_input_jvp_jacobian(ctx, func, inputs, outputs, input_i, output_j)
    else:
        rows = ctx.layouts.rows_call(call) if ctx.layouts is not None else call
        analytical = analytical_vjp_jacobian(ctx, rows.inputs, rows.outputs[output_j], nondet_tol=float("inf"))[input_i]
    # torch takes the largest difference before it compares the blocks, and an empty block (an
    # input or output of no elements) has none: its max() raises, and so does this one.
    diff = (analytical - numerical.to(analytical.device)).abs()
    largest = diff.max()
    if analytical.dtype != numerical.dtype:
        # torch compares the two blocks with torch.allclose, which refuses mixed dtypes
        # ("Float did not match Double": an input whose dtype is not its output's).
        torch.allclose(analytical, numerical.to(analytical.device), rtol, ctx.flags.atol)
    mismatch = block_mismatch(ctx, block, analytical, numerical, call, numerical_of_inputs)
    extra = ""
    if allclose_promoted(analytical, numerical.to(analytical.device), rtol, ctx.flags.atol):
        extra = "\n" + fast_fail_slow_ok_note()
        extra += f" (max element-wise difference {float(largest):.4g})"
    ctx.fail(
        f"{block.first_line()}{head}{mismatch.describe()}{extra}",
        check=mismatch.check,
        path=mismatch.path,
        mismatch=mismatch,
    )


def _one_input_jvp_jacobian(
    ctx: CheckContext, func: Callable[..., Any], inputs: Inputs, outputs: Sequence[Any], input_i: int, output_j: int
) -> torch.Tensor:
    """torch's recomputed forward-mode block: output j as a function of input i alone, the other
    inputs as given (still requiring grad, so an autograd.Function sees them as torch's call
    shows them: one without a jvp raises NotImplementedError there), without the dtype check."""
    idx = diff_input_indices(inputs)[input_i]

    def of_input(x: torch.Tensor) -> Any:
        args = list(inputs)
        args[idx] = x
        return as_tuple(func(*args))[output_j]

    return analytical_jvp_jacobian(ctx, of_input, (inputs[idx],), (outputs[output_j],), check_dtypes=False)[0][0]


def _fmt(t: torch.Tensor) -> str:
    v = t.item() if t.numel() == 1 else None
    if v is None:
        return f"<tensor of {t.numel()} values, max |.| {float(t.abs().max()) if t.numel() else 0.0:.6g}>"
    return f"{v.real:.6g}{v.imag:+.6g}j" if isinstance(v, complex) else f"{v:.6g}"
