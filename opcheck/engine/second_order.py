"""gradgradcheck's function: the first derivative of func, as a function of its inputs and grad_outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opcheck._records import record
from opcheck.engine._util import Func, Inputs, as_tuple, autograd_grad, differentiable_outputs, of_inputs, requires_grad
from opcheck.engine.batching import batching_enabled, warm_functorch


def random_grad_outputs(outputs: Sequence[torch.Tensor], noncontiguous: bool) -> tuple[torch.Tensor, ...]:
    """gradgradcheck's grad_outputs, drawn as torch draws them (from the global generator, uniform in
    [-1, 1)): a seeded caller checks the same function with either tool, so verdicts agree."""
    return tuple(
        torch.testing.make_tensor(
            x.shape,
            dtype=x.dtype if (x.is_floating_point() or x.is_complex()) else torch.double,
            device=x.device,
            low=-1,
            high=1,
            requires_grad=True,
            noncontiguous=noncontiguous,
        )
        for x in outputs
    )


@record
class FirstDerivative:
    """What gradgradcheck checks: func, its inputs and the names its failures use."""

    func: Func
    inputs: Inputs
    diff_inputs: list[int]  # positions of the inputs that require grad
    diff_grad_outputs: list[int]  # positions, among the grad_outputs, of those that require grad

    def output_name(self, i: int) -> str:
        n_in = len(self.diff_inputs)
        return f"grad of input {self.diff_inputs[i]}" if i < n_in else f"output {i}"

    def input_name(self, j: int) -> str:
        n_in = len(self.diff_inputs)
        return f"input {self.diff_inputs[j]}" if j < n_in else f"grad_output {self.diff_grad_outputs[j - n_in]}"

    def named_inputs(self, i: int | None, j: int | None) -> tuple[int, ...]:
        """The numbers of the inputs output i's and input j's names speak of ("grad of input 2", "input 0")."""
        n_in = len(self.diff_inputs)
        named = [self.diff_inputs[k] for k in (i, j) if k is not None and k < n_in]
        return tuple(dict.fromkeys(named))


def first_derivative(func: Func, inputs: Any, grad_outputs: Any, gen_non_contig_grad_outputs: bool) -> FirstDerivative:
    """The function gradgradcheck checks: inputs + grad_outputs -> grads of inputs (graph kept).

    It carries a `vmap_form`: the same function through torch.func, which (unlike autograd.grad)
    composes with vmap.
    """
    tupled_inputs = as_tuple(inputs)
    if grad_outputs is None:
        outs = differentiable_outputs(func(*tupled_inputs))
        tupled_grad_outputs = random_grad_outputs(outs, gen_non_contig_grad_outputs)
    else:
        tupled_grad_outputs = as_tuple(grad_outputs)
    num_outputs = len(tupled_grad_outputs)
    diff_input_indices = {i for i, x in enumerate(tupled_inputs) if requires_grad(x)}
    diff_go_indices = {i for i, x in enumerate(tupled_grad_outputs) if x.requires_grad}

    def new_func(*args: Any) -> tuple[torch.Tensor, ...]:
        input_args = tuple(
            x.requires_grad_() if i in diff_input_indices else x for i, x in enumerate(args[:-num_outputs])
        )
        outputs = differentiable_outputs(func(*input_args))
        gos = tuple(x.requires_grad_() if i in diff_go_indices else x for i, x in enumerate(args[-num_outputs:]))
        diff_args = tuple(x for i, x in enumerate(input_args) if i in diff_input_indices)
        grads = autograd_grad(outputs, diff_args, gos, create_graph=True)
        return tuple(g for g in grads if g is not None)

    order = sorted(diff_input_indices)

    def vmap_form(*args: Any) -> tuple[torch.Tensor, ...]:
        input_args = list(args[:-num_outputs])
        f = of_inputs(func, input_args, order, differentiable_outputs)
        pullback = torch.func.vjp(f, *[input_args[i] for i in order])[1]
        return tuple(pullback(tuple(args[-num_outputs:])))

    new_func.vmap_form = vmap_form  # type: ignore[attr-defined]
    if batching_enabled():
        warm_functorch("vjp")  # before a pilot batch of vmap_form is timed
    return FirstDerivative(new_func, tupled_inputs + tupled_grad_outputs, order, sorted(diff_go_indices))
