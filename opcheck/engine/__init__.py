"""Gradient-checking engine (temporary delegation while the batched engine lands)."""

import torch
from torch.autograd.gradcheck import GradcheckError as _TorchGradcheckError


class GradcheckError(_TorchGradcheckError):
    pass


def gradcheck(func, inputs, **kwargs):
    return torch.autograd.gradcheck(func, inputs, **kwargs)


def gradgradcheck(func, inputs, grad_outputs=None, **kwargs):
    return torch.autograd.gradgradcheck(func, inputs, grad_outputs, **kwargs)
