"""A kernel that keeps its gate in float32 beside low-precision activations, its reference, and a
twin whose gate gradient is wrong."""

import torch


def gated(x, gate):
    if gate.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"the gate must be float32, got {gate.dtype}")
    return (x.float() * torch.sigmoid(gate.float())).to(x.dtype)


def gated_reference(x, gate):
    return x * torch.sigmoid(gate)


class _WrongGateGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate):
        ctx.save_for_backward(x, gate)
        return gated(x, gate)

    @staticmethod
    def backward(ctx, grad):
        x, gate = ctx.saved_tensors
        s = torch.sigmoid(gate.float())
        grad_x = (grad.float() * s).to(x.dtype)
        grad_gate = (grad.float() * x.float() * s * (1 - s) * 1.25).sum(0)  # 25% too large
        return grad_x, grad_gate.to(gate.dtype)


def gated_wrong_gate_grad(x, gate):
    return _WrongGateGrad.apply(x, gate)


def gate_first(gate, x):
    """gated with the float32 gate as the first argument: the first input that requires grad keeps
    its own dtype."""
    return gated(x, gate)


def gate_first_reference(gate, x):
    return gated_reference(x, gate)


def gate_first_wrong_gate_grad(gate, x):
    return _WrongGateGrad.apply(x, gate)
