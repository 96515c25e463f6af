"""The full check: every Jacobian entry, numerical against analytical (torch's slow mode).

The control flow, order of checks and tolerance arithmetic follow torch.autograd.gradcheck 2.13 so
that verdicts agree; what differs is how the Jacobians are computed (batched, see batching/) and
what a failure says (reporting/diagnostics.py). The fast check (random projections) is fast.py.
"""

from __future__ import annotations

from typing import NoReturn

import torch

from opcheck.engine._util import allclose_promoted
from opcheck.engine.comparison.compare import BACKWARD, Block, Part, block_mismatch, raise_mismatch
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.evaluation.analytical import analytical_jvp_jacobian, analytical_vjp_jacobian
from opcheck.engine.evaluation.numerical import numerical_jacobian, settle_rows
from opcheck.engine.flags import DEFAULT_JACOBIAN_BUDGET
from opcheck.engine.reporting import torch_words
from opcheck.failure_facts import FailureFacts, hint_lines

__all__ = [
    "DEFAULT_JACOBIAN_BUDGET",
    "check_no_differentiable_outputs",
    "full_check",
    "fail_no_differentiable_outputs",
    "second_order_hint",
]


def full_check(ctx: CheckContext, call: Call, part: Part = BACKWARD) -> bool:
    """Every Jacobian entry, numerical against analytical (torch's slow mode)."""
    func, inputs, func_out, outputs = call.func, call.inputs, call.func_out, call.outputs
    if not outputs:
        return check_no_differentiable_outputs(ctx, call, is_forward_ad=part.forward)
    numerical = list(zip(*numerical_jacobian(ctx, func, inputs, func_out, is_forward_ad=part.forward)))
    numerical = [nj for o, nj in zip(func_out, numerical) if o.requires_grad]
    rtol, atol = ctx.flags.rtol, ctx.flags.atol

    def compare(block: Block, a: torch.Tensor, n: torch.Tensor) -> None:
        n = settle_rows(ctx, func, inputs, func_out, a, n, block.output_idx, block.input_idx)
        if not allclose_promoted(a, n.to(a.device), rtol, atol, where=block.named(ctx)):
            others = numerical[block.output_idx]
            raise_mismatch(ctx, block_mismatch(ctx, block, a, n, call, others), block.first_line())

    if part.forward:
        analytical = analytical_jvp_jacobian(ctx, func, inputs, func_out)
        for i, n_per_out in enumerate(numerical):
            for j, n in enumerate(n_per_out):
                compare(part.block(i, j), analytical[j][i], n)
    else:
        rows = ctx.layouts.rows_call(call) if ctx.layouts is not None else call
        for i, o in enumerate(rows.outputs):
            analytical_rows = analytical_vjp_jacobian(ctx, rows.inputs, o, nondet_tol=ctx.flags.nondet_tol)
            for j, (a, n) in enumerate(zip(analytical_rows, numerical[i])):
                compare(part.block(i, j), a, n)
    return True


def second_order_hint(ctx: CheckContext) -> tuple[str, ...]:
    """For gradgradcheck's first derivative without differentiable outputs: why, and what to do."""
    if "of" not in ctx.backward_path:  # only gradgradcheck's first-derivative function
        return ()
    return (
        "the first derivative does not require grad, so backward is not differentiable: it runs under "
        "torch.no_grad(), detaches, or is @once_differentiable. If that is intended, declare it "
        "(supports_gradgrad: false in an op spec); otherwise build backward from differentiable ops.",
    )


def fail_no_differentiable_outputs(ctx: CheckContext, what: str) -> NoReturn:
    """Raise: the function's outputs do not require grad, yet `what` (they change ...)."""
    hints = second_order_hint(ctx)
    ctx.fail(
        "\n".join(
            [torch_words.no_differentiable_outputs(), f"check: no differentiable outputs; {what}", *hint_lines(hints)]
        ),
        check="no differentiable outputs",
        path=ctx.backward_path,
        facts=FailureFacts(hints=hints),
    )


def check_no_differentiable_outputs(ctx: CheckContext, call: Call, *, is_forward_ad: bool) -> bool:
    """Without outputs that require grad, perturbing the inputs must not change the outputs."""
    for per_input in numerical_jacobian(ctx, call.func, call.inputs, call.func_out, is_forward_ad=is_forward_ad):
        for jac in per_input:
            if torch.ne(jac, 0).sum() > 0:
                fail_no_differentiable_outputs(
                    ctx,
                    "the function's outputs do not require grad, yet they change when input elements are "
                    f"perturbed (max |d| = {float(jac.abs().max()):.4g})",
                )
    return True
