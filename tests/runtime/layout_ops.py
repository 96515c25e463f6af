"""Ops that read the memory between a strided input's elements, as kernels given a data pointer do."""

import torch


def _storage(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x's whole storage, flat, and 1 at the positions of x's elements (0 between them)."""
    size = x.untyped_storage().nbytes() // x.element_size()
    flat = x.detach().as_strided((size,), (1,), 0)
    where = torch.zeros(size, dtype=x.dtype, device=x.device)
    index = torch.arange(size, device=x.device).as_strided(x.shape, x.stride(), x.storage_offset())
    where[index.reshape(-1)] = 1
    return flat, where


class _RowSumsAsContiguous(torch.autograd.Function):
    """Row sums whose forward reads x's memory as if x were contiguous (it ignores the strides);
    its backward is the right one."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        flat, _ = _storage(x)
        return flat[x.storage_offset() : x.storage_offset() + x.numel()].reshape(x.shape).sum(-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.unsqueeze(-1).expand(ctx.shape).clone()


def row_sums_as_contiguous(x):
    return _RowSumsAsContiguous.apply(x)


class _SumMaskedRead(torch.autograd.Function):
    """The sum of x's elements, read as a kernel loading a whole block and multiplying by a 0/1
    mask of the elements would: right wherever the memory between them holds finite numbers."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        flat, where = _storage(x)
        return (flat * where).sum()

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.shape).clone()


def sum_masked_read(x):
    return _SumMaskedRead.apply(x)


def row_sums(x):
    """The float64 reference of row_sums_as_contiguous: plain torch, which follows the strides."""
    return x.sum(-1)
