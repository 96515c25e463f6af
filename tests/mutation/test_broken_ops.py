"""tests/broken_ops.py: every twin is right and every bug is exactly where it says, by torch's own checks.

torch.autograd.gradcheck and gradgradcheck are the referee here, so that these ops stay fit to test
opcheck with: a twin passes them, and a bug changes the gradient only where its name says.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.autograd.gradcheck import GradcheckError

from tests import broken_ops as ops


def _x(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype).requires_grad_()


def _grad(op, x, grad=None):
    y = op(x)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y) if grad is None else grad)
    return gx


@pytest.mark.parametrize(
    "name, op", [("sin", ops.SIN), ("cos", ops.COS), ("exp", ops.EXP), ("tanh", ops.TANH), ("square", ops.SQUARE)]
)
@pytest.mark.parametrize("old_style", [False, True])
def test_a_twin_passes_torchs_checks(name, op, old_style):
    f = op.function(name, old_style=old_style, jvp=not old_style)
    assert gradcheck(f.apply, (_x(3, 4),), check_forward_ad=not old_style)
    assert gradgradcheck(f.apply, (_x(3, 4),))


def test_styles_and_the_vmap_rule():
    old, modern = ops.SIN.function("Old", old_style=True), ops.SIN.function("Modern", vmap=True)
    x = _x(2, 5)
    assert torch.equal(torch.func.vmap(modern.apply)(x), torch.sin(x))
    with pytest.raises(RuntimeError, match="must override the setup_context"):
        torch.func.vmap(old.apply)(x)
    with pytest.raises(ValueError, match="old-style Function has no vmap rule"):
        ops.function("Both", torch.sin, lambda ctx, g: g, old_style=True, vmap=True)
    assert modern.__name__ == "Modern" and issubclass(modern, torch.autograd.Function)


def test_scaled_changes_only_where_it_says():
    x = _x(4, 5)
    right = _grad(ops.SIN.function("Right").apply, x)
    everywhere = _grad(ops.SIN.function("Half", bug=ops.scaled(0.5)).apply, x)
    assert torch.equal(everywhere, right * 0.5)
    entry = _grad(ops.SIN.function("Entry", bug=ops.scaled(2, at=(0, 3))).apply, x)
    wrong = (entry != right).nonzero().tolist()
    assert wrong == [[0, 3]] and entry[0, 3] == 2 * right[0, 3]
    last = _grad(ops.SIN.function("Tail", bug=ops.scaled(1.1, at=ops.tail(7))).apply, x)
    assert (last != right).view(-1).nonzero().view(-1).tolist() == list(range(13, 20))
    batch = _grad(ops.SIN.function("Batch", bug=ops.scaled(2, at=(..., 0, 3))).apply, _x(3, 2, 4))
    assert (batch != _grad(ops.SIN.function("Right").apply, _x(3, 2, 4))).nonzero().tolist() == [
        [i, 0, 3] for i in range(3)
    ]


def test_scaled_when_only_in_its_dtype_or_on_scalars():
    f32 = ops.SIN.function("F32", bug=ops.scaled(1.01, when=ops.in_dtype(torch.float32)))
    right = ops.SIN.function("Right")
    x64, x32 = _x(5), _x(5, dtype=torch.float32)
    assert torch.equal(_grad(f32.apply, x64), _grad(right.apply, x64))
    assert torch.equal(_grad(f32.apply, x32), _grad(right.apply, x32) * 1.01)
    scalars = ops.EXP.function("Scalars", bug=ops.scaled(2, when=ops.zero_dim))
    assert gradcheck(scalars.apply, (_x(3),))
    with pytest.raises(GradcheckError):
        gradcheck(scalars.apply, (_x(),))


def test_rescaled_on_any_tensor():
    t = torch.ones(2, 3)
    assert ops.rescaled(t, 2, at=(..., -1)).tolist() == [[1, 1, 2], [1, 1, 2]]
    assert ops.rescaled(t, 2, at=1).tolist() == [[1, 1, 1], [2, 2, 2]]
    assert ops.rescaled(t, 2, when=lambda t: False) is t


def test_conj_missing():
    complex_exp = ops.Elementwise(torch.exp, lambda y: y.conj(), of="output")
    z = _x(4, dtype=torch.complex128)
    assert gradcheck(complex_exp.function("Right").apply, (z,))
    g = torch.ones(4, dtype=torch.complex128)
    assert torch.equal(_grad(complex_exp.function("NoConj", bug=ops.conj_missing()).apply, z, g), torch.exp(z).detach())
    tail_only = _grad(complex_exp.function("TailNoConj", bug=ops.conj_missing(at=ops.tail(1))).apply, z, g)
    assert torch.equal(tail_only[:3], torch.exp(z[:3]).conj().detach()) and tail_only[3] == torch.exp(z[3])


def test_bugs_of_the_chain_rule():
    x, g = _x(5), _x(5, seed=1).detach()
    assert torch.equal(
        _grad(ops.SIN.function("Ignores", bug=ops.ignores_grad_output).apply, x, g), torch.cos(x).detach()
    )
    noise = [0]

    def counting_noise(d):
        noise[0] += 1
        return torch.full_like(d, 1e-3)

    zero = torch.zeros(5, dtype=torch.float64)
    inside = _grad(ops.SIN.function("Inside", bug=ops.noisy_derivative(counting_noise)).apply, x, zero)
    outside = _grad(ops.SIN.function("Outside", bug=ops.plus_noise(counting_noise)).apply, x, zero)
    # ops.scaled by grad_output inside the derivative, added after it outside; drawn once per call
    assert torch.equal(inside, zero) and torch.equal(outside, torch.full_like(zero, 1e-3)) and noise == [2]


def test_returned_as_converts_the_gradient():
    seen = []
    x = _x(3, 3)
    y = ops.SIN.function("Sparse", bug=ops.returned_as(torch.Tensor.to_sparse)).apply(x)
    y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: seen.append(grad_inputs[0].layout))
    y.sum().backward()
    assert seen == [torch.sparse_coo]


def test_second_derivative_bugs():
    assert gradcheck(ops.SIN.function("Detached", old_style=True, bug=ops.detached).apply, (_x(4),))
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradgradcheck(ops.SIN.function("Detached", old_style=True, bug=ops.detached).apply, (_x(4),))
    x = _x(4)
    (g,) = torch.autograd.grad(ops.SIN.function("NoGrad", bug=ops.without_grad).apply(x).sum(), x, create_graph=True)
    assert not g.requires_grad
    once = ops.SIN.function("Once", old_style=True, once_differentiable=True)
    with pytest.raises(GradcheckError):
        gradgradcheck(once.apply, (_x(4),))


@pytest.mark.parametrize("old_style", [False, True])
def test_with_backward_function(old_style):
    assert gradgradcheck(ops.with_backward_function(ops.SIN, "Right", old_style=old_style).apply, (_x(5),))
    for bugs in (dict(input_bug=ops.scaled(-1)), dict(grad_bug=ops.scaled(1.1, at=ops.tail(2)))):
        wrong = ops.with_backward_function(ops.SIN, "Wrong", old_style=old_style, **bugs)
        assert gradcheck(wrong.apply, (_x(5),))  # the first derivative is right
        with pytest.raises(GradcheckError):
            gradgradcheck(wrong.apply, (_x(5),))


def test_sin_via_a_cos_with_a_wrong_jvp_fails_only_forward_over_reverse():
    cos, wrong_jvp_cos = ops.COS.function("Cos", jvp=True), ops.COS.function("Cos", jvp=True, jvp_bug=ops.scaled(-1))
    right, wrong = ops.sin_via("Right", cos), ops.sin_via("Wrong", wrong_jvp_cos)
    for op in (right, wrong):
        assert gradcheck(op.apply, (_x(4),), check_forward_ad=True)
        assert gradgradcheck(op.apply, (_x(4),))
    assert gradgradcheck(right.apply, (_x(4),), check_fwd_over_rev=True)
    with pytest.raises(GradcheckError):
        gradgradcheck(wrong.apply, (_x(4),), check_fwd_over_rev=True)


def test_written_into_zeros_in_place_breaks_batched_gradients_only():
    for write in ("add", "copy_", "add_"):
        assert gradcheck(ops.SIN.function(write, bug=ops.written_into_zeros(write)).apply, (_x(4),))
    assert gradcheck(
        ops.SIN.function("add", bug=ops.written_into_zeros("add")).apply, (_x(4),), check_batched_grad=True
    )
    with pytest.raises(GradcheckError, match="batched"):
        gradcheck(
            ops.SIN.function("copy_", bug=ops.written_into_zeros("copy_")).apply, (_x(4),), check_batched_grad=True
        )


def test_jvp_of_the_other_saved_tensor_and_jvp_bugs():
    for op in (
        ops.EXP.function("JvpOfInput", jvp=True, jvp_of="input"),
        ops.EXP.function("Twice", jvp=True, jvp_bug=ops.scaled(2)),
    ):
        assert gradcheck(op.apply, (_x(4),))
        with pytest.raises(GradcheckError, match="forward mode"):
            gradcheck(op.apply, (_x(4),), check_forward_ad=True)


def test_broadcast_mul_reductions():
    a, b = _x(4, 1), _x(4, 4, seed=1)
    assert gradcheck(ops.broadcast_mul("Right").apply, (a, b))
    with pytest.raises(GradcheckError):
        gradcheck(ops.broadcast_mul("Transposed", ops.summed_over_dim0_transposed).apply, (a, b))
    with pytest.raises(RuntimeError, match="shape"):
        gradcheck(ops.broadcast_mul("Dim0", ops.summed_over_dim0, old_style=True).apply, (_x(3, 1), _x(3, 4)))


def test_sin_cos_with_undefined_grad_outputs():
    assert gradcheck(ops.sin_cos("Right", ops.handles_undefined).apply, (_x(4),))
    x = _x(4)
    sin, _ = ops.sin_cos("Assumes", ops.assumes_defined, old_style=True).apply(x)
    with pytest.raises(TypeError):
        sin.sum().backward()
    with pytest.raises(GradcheckError, match="undefined output grads"):
        gradcheck(ops.sin_cos("Stacks", ops.stacks_defined_terms).apply, (_x(4),))


def test_sparse_mm_values_bug():
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(4, 5, generator=g, dtype=torch.float64) * (torch.rand(4, 5, generator=g) < 0.5)).to_sparse()
    inputs = (a.requires_grad_(), _x(5, 3, seed=1))
    assert gradcheck(ops.sparse_mm("Right").apply, inputs, masked=True, check_batched_grad=False)
    with pytest.raises(GradcheckError):
        gradcheck(ops.sparse_mm("Wrong", lambda v: v * 1.5).apply, inputs, masked=True, check_batched_grad=False)
