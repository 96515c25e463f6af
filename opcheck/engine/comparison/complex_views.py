"""Complex tensors seen through torch.view_as_real, for the checks that run on real Jacobians.

The Jacobian of the real view holds the same entries as the full check's, split into real and
imaginary parts: the fused passes (complex outputs) and the projection check (complex inputs and
outputs) run on it unchanged, with memory O((n + m) k).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opcheck._records import record
from opcheck.engine._util import Func, Inputs, as_tuple, mapped


def as_real(outputs: Any) -> tuple[Any, ...]:
    """The outputs with every complex tensor as torch.view_as_real (shape (..., 2))."""
    return tuple(_real_view(o) if isinstance(o, torch.Tensor) and o.is_complex() else o for o in as_tuple(outputs))


def _real_view(o: torch.Tensor) -> torch.Tensor:
    o = o.resolve_conj()
    try:
        return torch.view_as_real(o)
    except RuntimeError:
        # make_dual under the legacy vmap: the tangent can be a conjugate view (exp, sin), which
        # resolve_conj leaves and view_as_real refuses; a copy resolves it
        return torch.view_as_real(o.clone())


def real_outputs(func: Func) -> Func:
    """func with its complex outputs seen through torch.view_as_real."""
    return mapped(func, outputs=as_real)


@record
class RealViews:
    """Which complex tensors the projection check sees as torch.view_as_real (shape (..., 2))."""

    inputs: tuple[int, ...]  # positions in the inputs
    outputs: tuple[int, ...]  # positions in func's outputs

    def hints(self, input_pos: int, output_pos: int) -> list[str]:
        said = [f"input {input_pos}"] if input_pos in self.inputs else []
        said += [f"output {output_pos}"] if output_pos in self.outputs else []
        if not said:
            return []
        return [
            f"complex {' and '.join(said)} checked as torch.view_as_real (shape (..., 2)): the last index "
            "is 0 for the real part, 1 for the imaginary part"
        ]


def real_views(
    func: Func, func_out: tuple[Any, ...], inputs: Inputs, diff: Sequence[int]
) -> tuple[Func, Inputs, RealViews]:
    """func on real tensors: complex differentiable inputs and complex outputs as view_as_real.

    The full check compares backward's grad of a complex input x = a + ib with ds/da + i ds/db,
    i.e. the Jacobian with respect to the pair (a, b), and the forward check splits complex
    outputs the same way; on the real view both are ordinary real Jacobians, so the projection
    stages apply unchanged and memory stays O((n + m) k).
    """
    cin = tuple(j for j in diff if inputs[j].is_complex())

    def complex_args(args: Sequence[Any]) -> list[Any]:
        new = list(args)
        for j in cin:
            new[j] = torch.view_as_complex(new[j])
        return new

    real_inputs = tuple(
        torch.view_as_real(a.detach().resolve_conj()).clone().requires_grad_() if j in cin else a
        for j, a in enumerate(inputs)
    )
    cout = tuple(p for p, o in enumerate(func_out) if isinstance(o, torch.Tensor) and o.is_complex())
    return mapped(func, args=complex_args, outputs=as_real), real_inputs, RealViews(cin, cout)
