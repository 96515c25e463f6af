"""A small pre-norm transformer block: the model `opcheck capture` is demonstrated on.

    opcheck capture --op torch.ops.opcheck_examples.rms_norm --op torch.nn.functional.gelu \\
        -- python examples/transformer.py

runs `main` and records each call of those ops at the sizes the block really uses: hidden 80 is
not a multiple of the RMSNorm kernel's 32-column tiles, so its last tile is partial, where a toy
sample ([3, 8], one tile) never looks. float32 on CPU, seeded; `python -m examples.transformer`
works too.

`opcheck_examples::rms_norm(x, weight, eps)` is a torch.library custom op written the way a tiled
kernel is: the last dim in tiles of BLOCK columns, a first pass accumulating each row's sum of
squares, a second writing the output tile by tile; its backward (register_autograd) does the same
for grad_x and grad_weight. op_specs/rms_norm.yaml tests it.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

BLOCK = 32  # columns per tile, as a kernel's BLOCK_SIZE
BATCH, SEQ, HIDDEN, HEADS, MLP = 2, 13, 80, 4, 320


def column_tiles(n: int) -> list[slice]:
    """The last dim's tiles: BLOCK columns each, the last one partial where BLOCK does not divide n."""
    return [slice(start, min(start + BLOCK, n)) for start in range(0, n, BLOCK)]


def as_rows(t: Tensor) -> Tensor:
    """t as the kernel sees it: [rows, n], one row per program, n the last dim."""
    return t.reshape(t.shape[:-1].numel(), t.shape[-1])


def rstd_rows(x: Tensor, eps: float) -> Tensor:
    """1 / sqrt(mean(x²) + eps) of each row of x [rows, n], as a column [rows, 1]; squares summed tile by tile."""
    sum_sq = x.new_zeros(x.shape[0], 1)
    for cols in column_tiles(x.shape[1]):
        sum_sq = sum_sq + (x[:, cols] * x[:, cols]).sum(1, keepdim=True)
    return torch.rsqrt(sum_sq / x.shape[1] + eps)


def rms_norm_tiles(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The forward kernel: x / sqrt(mean(x², -1) + eps) * weight, written tile by tile."""
    rows = as_rows(x)
    rstd = rstd_rows(rows, eps)
    out = torch.empty_like(rows)
    for cols in column_tiles(rows.shape[1]):
        out[:, cols] = rows[:, cols] * rstd * weight[cols]
    return out.reshape(x.shape)


@torch.library.custom_op("opcheck_examples::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x², -1) + eps) * weight, over the last dim."""
    return rms_norm_tiles(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


def rms_norm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def row_dots(grad: Tensor, weight: Tensor, x: Tensor) -> Tensor:
    """Σ_j grad_ij · weight_j · x_ij of each row [rows, n], as a column [rows, 1], tile by tile."""
    dot = grad.new_zeros(grad.shape[0], 1)
    for cols in column_tiles(grad.shape[1]):
        dot = dot + (grad[:, cols] * weight[cols] * x[:, cols]).sum(1, keepdim=True)
    return dot


def rms_norm_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    rows, grad_rows, n = as_rows(x), as_rows(grad), x.shape[-1]
    # rstd is recomputed rather than saved (a memory-lean kernel's choice): it keeps this backward
    # a function of x in differentiable ops, so it has a backward of its own (double backward).
    rstd = rstd_rows(rows, ctx.eps)
    # d/dx (x·rstd·w) = rstd·(g·w) - x·rstd³·mean(g·w·x): the second term needs the whole row first.
    correction = rstd**3 * row_dots(grad_rows, weight, rows) / n
    grad_x, grad_weight = [], []
    for cols in column_tiles(n):
        grad_x.append(rstd * grad_rows[:, cols] * weight[cols] - rows[:, cols] * correction)
        grad_weight.append((grad_rows[:, cols] * rows[:, cols] * rstd).sum(0))
    return torch.cat(grad_x, 1).reshape(x.shape), torch.cat(grad_weight), None


rms_norm.register_autograd(rms_norm_backward, setup_context=rms_norm_setup)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def linear_params(n_out: int, n_in: int) -> tuple[nn.Parameter, nn.Parameter]:
    """A weight [n_out, n_in] and bias [n_out], initialized as nn.Linear's."""
    bound = 1 / math.sqrt(n_in)
    weight = nn.Parameter(torch.empty(n_out, n_in).uniform_(-bound, bound))
    return weight, nn.Parameter(torch.empty(n_out).uniform_(-bound, bound))


class Block(nn.Module):
    """x + attention(norm(x)), then + mlp(norm(·)): causal self-attention, a GELU MLP."""

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS, mlp: int = MLP):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv_weight, self.qkv_bias = linear_params(3 * hidden, hidden)
        self.out_weight, self.out_bias = linear_params(hidden, hidden)
        self.up_weight, self.up_bias = linear_params(mlp, hidden)
        self.down_weight, self.down_bias = linear_params(hidden, mlp)

    def attention(self, x: Tensor) -> Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q, k, v = (t.view(batch, seq, self.heads, head_dim).transpose(1, 2) for t in qkv.split(hidden, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(batch, seq, hidden)
        return F.linear(out, self.out_weight, self.out_bias)

    def mlp(self, x: Tensor) -> Tensor:
        return F.linear(F.gelu(F.linear(x, self.up_weight, self.up_bias)), self.down_weight, self.down_bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description="One forward and backward of a small transformer block.").parse_args(argv)
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(BATCH, SEQ, HIDDEN)
    loss = block(x).pow(2).mean()
    loss.backward()
    print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
