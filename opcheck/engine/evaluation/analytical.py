"""The analytical Jacobians: from backward (VJP rows, checked for reentrancy) and from forward-mode AD."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

from opcheck.engine._util import Inputs, diff_input_indices, float_outputs, identical, requires_grad
from opcheck.engine.batching import BatchedRows, LoopRows, vjp_rows
from opcheck.engine.context import Blocks, CheckContext
from opcheck.engine.errors import failed_nondet_note
from opcheck.engine.reporting import torch_words
from opcheck.failure_facts import FailureFacts


def analytical_vjp_jacobian(
    ctx: CheckContext, inputs: Inputs, output: torch.Tensor, *, nondet_tol: float
) -> list[torch.Tensor]:
    """Per input requiring grad, its (numel_in, numel_out) block from VJPs, checked for reentrancy."""
    diff_inputs = [a for a in inputs if requires_grad(a)]
    m = output.numel()
    rows1 = vjp_rows(ctx.evaluator, output, diff_inputs, nondet_tol)
    # The second pass repeats the first one's path even if batching was dropped meanwhile:
    # batched and looped rows may differ in the last bit, which is not nondeterminism.
    first_batched = any(isinstance(r, torch.Tensor) for r in rows1)
    rows2 = vjp_rows(ctx.evaluator, output, diff_inputs, nondet_tol, batched=first_batched)
    jac1, types_ok = stack_rows(rows1, diff_inputs, m)
    jac2, _ = stack_rows(rows2, diff_inputs, m)
    if not types_ok:
        ctx.fail_gradient_dtype()
    for k, (a, b) in enumerate(zip(jac1, jac2)):
        if a.numel() != 0 and not identical(a, b) and (a - b).abs().max() > nondet_tol:
            fail_reentrancy(ctx, nondet_tol, a, b, k)
    return jac1


def fail_reentrancy(
    ctx: CheckContext,
    nondet_tol: float,
    first: torch.Tensor,
    second: torch.Tensor,
    input_idx: int,
    block: bool = True,
    cause: str | None = None,
) -> NoReturn:
    """Two identical backward passes differ by more than nondet_tol: torch's first line, then
    where they differ and the usual cause (`cause`, where the caller knows it).

    `first`, `second`: what the two passes gave for input `input_idx`: its (input numel, output
    numel) Jacobian block, or (block=False) its VJPs for the same cotangents.
    """
    diff = (first - second).abs()
    worst = float(diff.max())
    differing = int((diff > nondet_tol).sum())
    lines = [
        torch_words.reentrancy(nondet_tol),
        f"check: reentrancy ({ctx.backward_path}); two identical backward passes differ by up to {worst:.4g}, "
        f"in {differing} of {diff.numel()} entries of "
        + (f"d outputs / d input {input_idx}" if block else f"the gradient of input {input_idx}")
        + " (the analytical and numerical Jacobians are compared only after this check, so they may not "
        "match either):",
    ]
    for flat in torch.argsort(diff.reshape(-1), descending=True)[: min(5, differing)].tolist():
        if block and diff.dim() == 2:
            i, j = divmod(flat, diff.shape[1])
            where = f"d out[{j}] / d in[{i}]"
        else:
            where = "[" + ", ".join(str(int(k)) for k in torch.unravel_index(torch.tensor(flat), diff.shape)) + "]"
        lines.append(
            f"  {where}: first pass {float(first.reshape(-1)[flat]):.6g}, "
            f"second pass {float(second.reshape(-1)[flat]):.6g}"
        )
    lines.append(cause or REENTRANCY_CAUSES)
    lines.append(failed_nondet_note())
    ctx.fail("\n".join(lines), check="reentrancy", path=ctx.backward_path, facts=FailureFacts(inputs=(input_idx,)))


REENTRANCY_CAUSES = (
    "An op that writes into its inputs or its saved tensors gives this (a Triton or CUDA kernel writing "
    "through a pointer gets past autograd's version counter): the second pass reads what the first wrote. "
    "A forward that writes into its inputs needs fresh copies on every call (in an op spec: clone_inputs: "
    "true). A backward that overwrites its saved tensors can run once per forward only, which the "
    "repeated backward passes here do not allow: check such a kernel by the low-precision check against "
    "a reference instead (an op spec's lowprec_dtypes and reference, with dtypes: [])."
)


GRAD_OUTPUT_WRITTEN = (
    "Here backward wrote into its grad_output, and torch's fast mode hands the same grad_output to both "
    "passes: the second reads what the first wrote. The gradient itself may be right (torch's full mode "
    "and fast_mode='auto' give every pass its own grad_output). Writing into grad_output is a hazard of its "
    "own, since autograd may hand that tensor to other consumers: write the result into a new tensor, or "
    "check the kernel with fast_mode='auto' and the low-precision check (an op spec's lowprec_dtypes, with "
    "writes_grad_outputs: true where the write is intended)."
)


def stack_rows(
    rows_per_input: BatchedRows | LoopRows, diff_inputs: Sequence[torch.Tensor], m: int
) -> tuple[list[torch.Tensor], bool]:
    """Per input, its (numel_in, m) block from the rows, and whether every row had its input's dtype."""
    jacobians = []
    types_ok = True
    for inp, rows in zip(diff_inputs, rows_per_input):
        if isinstance(rows, torch.Tensor):  # batched: (m, *inp.shape); a transposed view, no copy
            if rows.dtype != inp.dtype:
                types_ok = False
            jacobians.append(rows.reshape(m, -1).t())
            continue
        jac = inp.new_zeros((inp.numel(), m), layout=torch.strided)
        for j, g in enumerate(rows or []):
            if g is None:
                continue
            if g.size() != inp.size():
                raise AssertionError(
                    f"{torch_words.column_size(g.numel(), inp.numel())}\n(backward returned a gradient of "
                    f"shape {tuple(g.shape)} for an input of shape {tuple(inp.shape)})"
                )
            if g.dtype != inp.dtype:
                types_ok = False
            jac[:, j] = g.to_dense().reshape(-1) if g.layout != torch.strided else g.reshape(-1)
        jacobians.append(jac)
    return jacobians, types_ok


def analytical_jvp_jacobian(
    ctx: CheckContext, fn: Callable[..., Any], inputs: Inputs, outputs: tuple[Any, ...], *, check_dtypes: bool = True
) -> Blocks:
    """[input][output] blocks (numel_in, numel_out) from forward-mode AD, column by column; with
    check_dtypes, every tangent's dtype is checked (ctx.check_forward_dtype)."""
    diff = diff_input_indices(inputs)
    if any(inputs[i].is_complex() for i in diff):
        raise ValueError(torch_words.forward_complex_inputs())
    floats = float_outputs(outputs)
    nonempty = [idx for idx in diff if inputs[idx].numel()]
    from opcheck.engine.batching.jvp_columns import ForwardCalls, jvp_columns  # forward AD's: on first use

    check = ctx.check_forward_dtype if check_dtypes else _any_dtype
    calls = ForwardCalls(ctx.evaluator, fn, inputs, check, torch_tangents=not ctx.flags.auto)
    columns = dict(zip(nonempty, jvp_columns(calls, nonempty, outputs) if nonempty else []))
    result = []
    for idx in diff:
        x = inputs[idx]
        cols = columns.get(idx)
        if cols and all(c.shape == (x.numel(), o.numel()) and c.dtype == o.dtype for c, o in zip(cols, floats)):
            result.append(tuple(cols[: len(floats)]))
            continue
        blocks = [o.new_zeros((x.numel(), o.numel()), layout=torch.strided) for o in floats]
        for block, c in zip(blocks, cols or []):
            block.copy_(c)
        result.append(tuple(blocks))
    return result


def _any_dtype(primal: torch.Tensor, tangent: torch.Tensor) -> None:
    """ForwardCalls' dtype check where none applies."""
