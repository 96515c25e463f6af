"""A failure's facts (opcheck.failure_facts) say what its message says: the worst entry it lists
first, every hint, and the inputs it names, on each path the engine fails by."""

import re

import pytest
import torch

import opcheck
from opcheck.engine.lowprec.check import lowprec_report


def _wrong_backward(scale=2.0, swap=False, ignore_grad_output=False):
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            if ignore_grad_output:
                g = torch.ones_like(g)
            gx, gy = g * y, g * x
            if swap:
                gx, gy = gy, gx
            gx = gx.clone()
            gx[-1] *= scale  # the tail entry is wrong
            return gx, gy

    return Wrong.apply


def _inputs(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.rand(n, dtype=torch.float64, generator=g).add_(0.5).requires_grad_() for _ in range(2))


def _failure(check, *args, **kwargs):
    with pytest.raises((opcheck.GradcheckError, AssertionError)) as info:
        check(*args, **kwargs)
    return info.value


def _as_the_message_says(error):
    """The facts, checked against the message's own lines."""
    message, facts = str(error), error.facts
    hints = tuple(
        dict.fromkeys(line.removeprefix("hint: ") for line in message.splitlines() if line.startswith("hint: "))
    )
    assert facts.hints == hints
    if facts.worst:
        block, _, entry = facts.worst.partition(", d out" if ", d out" in facts.worst else ", ")
        assert block.strip() in message
        assert any(line.strip().endswith(facts.worst[len(block) + 2 :]) for line in message.splitlines())
    numbers = {int(m) for m in re.findall(r"\binputs? (\d+)\b", message)}
    assert set(facts.inputs) <= numbers  # it names no input the message does not
    return facts


@pytest.mark.parametrize("fast_mode", [False, True, "auto"])
def test_a_wrong_entry_names_its_block_entry_hints_and_input(fast_mode):
    facts = _as_the_message_says(_failure(opcheck.gradcheck, _wrong_backward(), _inputs(), fast_mode=fast_mode))
    assert facts.worst.startswith("d output 0 / d input 0, d out[5] / d in[5]: analytical")
    assert facts.inputs == (0,)


def test_a_gradient_returned_for_the_other_input_names_both():
    facts = _as_the_message_says(
        _failure(opcheck.gradcheck, _wrong_backward(scale=1.0, swap=True), _inputs(), fast_mode=False)
    )
    assert set(facts.inputs) == {0, 1}
    assert any("matches input 1's numerical gradient" in h for h in facts.hints)


def test_a_block_beyond_the_budget_names_its_projection_entry():
    x = torch.rand(400, dtype=torch.float64, requires_grad=True)
    y = torch.rand(400, dtype=torch.float64, requires_grad=True)
    error = _failure(opcheck.gradcheck, _wrong_backward(), (x, y), fast_mode="auto", jacobian_budget=1000)
    facts = _as_the_message_says(error)
    assert facts.worst.startswith("d output 0 / d input 0, ") and facts.inputs[:1] == (0,)


def test_a_backward_that_ignores_grad_output_names_the_input():
    error = _failure(opcheck.gradcheck, _wrong_backward(scale=1.0, ignore_grad_output=True), _inputs(), fast_mode=False)
    facts = _as_the_message_says(error)
    assert facts.inputs and facts.inputs[0] in (0, 1)


def test_gradgradcheck_names_the_inputs_of_its_first_derivative():
    class OnceWrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x * x.detach()  # the second derivative misses half of its term

    x = torch.rand(4, dtype=torch.float64, requires_grad=True)
    facts = _as_the_message_says(_failure(opcheck.gradgradcheck, OnceWrong.apply, (x,), fast_mode=False))
    assert facts.worst.startswith("d grad of input 0 / d input 0, ") and facts.inputs == (0,)


def test_a_low_precision_failure_names_its_part_entry_and_the_gradients_inputs():
    def op(x, y):
        return (x.double() * y).to(x.dtype) if x.requires_grad else x * y

    class Narrow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y.to(torch.float16).to(g.dtype), g * x  # x's gradient rounded to float16

    x, y = (torch.rand(64, dtype=torch.float32).add_(1).requires_grad_() for _ in range(2))
    report = lowprec_report(Narrow.apply, (x, y), reference=lambda a, b: a * b)
    assert report.error is not None
    facts = _as_the_message_says(report.error)
    assert facts.worst.startswith("VJP: gradient of input 0, [")
    assert facts.inputs == (0, 1)  # the failing gradient's input, and the one within the bound
