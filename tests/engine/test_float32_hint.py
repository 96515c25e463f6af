"""The engine recognizes an op that computes in float32 at float64 inputs (opcheck.engine.reporting.float32)
and its failure hint says so instead of suggesting a wrong formula."""

import pytest
import torch

import opcheck
from opcheck.engine.reporting.float32 import float32_evidence, float32_values
from opcheck.engine.reporting.hints import FLOAT32_HINT


def rand(*shape):
    return torch.rand(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_float32_values_needs_distinct_informative_float32_values():
    x = rand(50)
    assert not float32_values(x)
    assert float32_values(x.float().double())
    assert float32_values(torch.complex(x, x.flip(0)).to(torch.complex64).to(torch.complex128))
    # integers and short binary fractions are float32 values in any precision: they say nothing
    assert not float32_values(torch.tensor([0.5, 0.25, 0.125, 0.375, 3.0, 7.0], dtype=torch.float64))
    assert not float32_values(x.float().double()[:3])  # too few values to tell
    assert not float32_values(x.float())  # not a float64 tensor


def softmax_in_float32(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


@pytest.mark.parametrize(
    "fn, evidence",
    [
        (softmax_in_float32, "its float64 outputs are float32 values"),
        (
            lambda x: torch.softmax(x.float(), -1).double() * 1.1,
            "its float64 outputs do not change when its inputs are rounded to float32",
        ),
        (lambda x: torch.softmax(x, -1), None),
        (lambda x: torch.softmax(x, -1) * 0 + 0.5, None),  # a constant output proves nothing
    ],
)
def test_float32_evidence(fn, evidence):
    assert float32_evidence(fn, (rand(3, 5),)) == evidence


def test_float32_inputs_prove_nothing_and_a_failing_call_says_nothing():
    assert float32_evidence(softmax_in_float32, (rand(3, 5).float().double(),)) is None
    calls = []

    def fails_when_called_again(x):
        calls.append(x)
        if len(calls) > 1:
            raise RuntimeError("only once")
        return torch.softmax(x, -1)

    assert float32_evidence(fails_when_called_again, (rand(3, 5),)) is None


def test_the_failure_of_a_float32_op_hints_at_float32_not_at_the_formula():
    x = rand(3, 5).requires_grad_()
    with pytest.raises(opcheck.GradcheckError) as info:
        opcheck.gradcheck(softmax_in_float32, (x,), fast_mode=False)
    assert FLOAT32_HINT.format(what="backward") in str(info.value)


def test_a_wrong_float64_gradient_gets_no_float32_hint():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * x.cos() * 1.01

    with pytest.raises(opcheck.GradcheckError) as info:
        opcheck.gradcheck(Wrong.apply, (rand(3, 5).requires_grad_(),), fast_mode=False)
    assert "float32" not in str(info.value)
