"""Triton kernels written the way public kernel libraries write them, for GPUs, not for opcheck:
autotuned, bfloat16 arithmetic straight on the loads, `i.to(tl.int64)` on loop indices, grids
sized from the SM count behind `with torch.cuda.device(...)`, `tl.cumsum` and `tl.atomic_add`
straight on bfloat16, a backward that writes its result
into grad_output, a kernel that refuses anything but float32, and a persistent kernel (one program
per SM, rows strided by the program count) whose launcher asks the SM count as Triton's tutorials,
flash-linear-attention and others do. Nothing here sets
TRITON_INTERPRET or works around the interpreter: opcheck.triton does that.

Each op has a float64 reference in plain torch ops (`*_reference`) and a twin with a planted bug
(`*_bug`), the kind each style of kernel tends to have. The module stands alone (torch and triton
only): the end-to-end test copies it into a scratch project.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


# ------------------------------------------------------------------------------------ matmul
# Autotuned (several configs, keyed on the shape) and tl.dot on the loaded tiles, bfloat16 included.
# Bug: the K loop runs K // BLOCK_K steps, dropping the tail of K where BLOCK_K does not divide it.
@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=2),
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}, num_warps=4),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=8),
    ],
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    FLOOR_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FLOOR_K:
        k_steps = K // BLOCK_K
    else:
        k_steps = tl.cdiv(K, BLOCK_K)
    for k in range(0, k_steps):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = accumulator.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def _matmul(a: torch.Tensor, b: torch.Tensor, floor_k: bool) -> torch.Tensor:
    (M, K), (_, N) = a.shape, b.shape
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))

    matmul_kernel[grid](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), FLOOR_K=floor_k
    )
    return c


class _MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, floor_k):
        ctx.save_for_backward(a, b)
        ctx.floor_k = floor_k
        return _matmul(a, b, floor_k)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        return _matmul(dc, b.t(), ctx.floor_k), _matmul(a.t(), dc, ctx.floor_k), None


def matmul(a, b):
    return _MatMul.apply(a, b, False)


def matmul_bug(a, b):
    return _MatMul.apply(a, b, True)


def matmul_reference(a, b):
    return a @ b


# ------------------------------------------------------------------------------------ mul_add
# bfloat16 arithmetic straight on the loads (x * y + x, no upcast), as a GPU runs it.
# Bug: the gradient of y multiplies by y instead of x.
@triton.jit
def _mul_add_fwd(X, Y, Z, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    tl.store(Z + offs, x * y + x, mask=mask)


@triton.jit
def _mul_add_bwd(DZ, X, Y, DX, DY, n, BUG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dz = tl.load(DZ + offs, mask=mask)
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    tl.store(DX + offs, dz * (y + 1.0), mask=mask)
    if BUG:
        tl.store(DY + offs, dz * y, mask=mask)
    else:
        tl.store(DY + offs, dz * x, mask=mask)


class _MulAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, bug):
        x, y = x.contiguous(), y.contiguous()
        z = torch.empty_like(x)
        n = x.numel()
        _mul_add_fwd[(triton.cdiv(n, 64),)](x, y, z, n, BLOCK=64)
        ctx.save_for_backward(x, y)
        ctx.bug = bug
        return z

    @staticmethod
    def backward(ctx, dz):
        x, y = ctx.saved_tensors
        dz = dz.contiguous()
        dx, dy = torch.empty_like(x), torch.empty_like(y)
        n = x.numel()
        _mul_add_bwd[(triton.cdiv(n, 64),)](dz, x, y, dx, dy, n, BUG=ctx.bug, BLOCK=64)
        return dx, dy, None


def mul_add(x, y):
    return _MulAdd.apply(x, y, False)


def mul_add_bug(x, y):
    return _MulAdd.apply(x, y, True)


def mul_add_reference(x, y):
    return x * y + x


# ------------------------------------------------------------------------------------ row_sumsq
# A loop over column blocks with an int64 offset from the loop index: `i.to(tl.int64)`.
# Bug: the backward's loop stops at the last whole block, leaving the tail's gradient zero.
@triton.jit
def _row_sumsq_fwd(X, OUT, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, n_cols, BLOCK):
        cols = i.to(tl.int64) + tl.arange(0, BLOCK)
        x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(OUT + row, tl.sum(acc, axis=0))


@triton.jit
def _row_sumsq_bwd(DOUT, X, DX, n_cols, stride, BUG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dout = tl.load(DOUT + row)
    end = n_cols
    if BUG:
        end = n_cols - n_cols % BLOCK
    for i in range(0, end, BLOCK):
        cols = i.to(tl.int64) + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride + cols, 2.0 * x * dout, mask=mask)


class _RowSumSq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bug):
        x = x.contiguous()
        out = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
        _row_sumsq_fwd[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=16)
        ctx.save_for_backward(x)
        ctx.bug = bug
        return out

    @staticmethod
    def backward(ctx, dout):
        (x,) = ctx.saved_tensors
        dx = torch.zeros_like(x)
        _row_sumsq_bwd[(x.shape[0],)](dout.contiguous(), x, dx, x.shape[1], x.stride(0), BUG=ctx.bug, BLOCK=16)
        return dx, None


def row_sumsq(x):
    return _RowSumSq.apply(x, False)


def row_sumsq_bug(x):
    return _RowSumSq.apply(x, True)


def row_sumsq_reference(x):
    return (x * x).sum(-1)


# ------------------------------------------------------------------------------------ rms_norm
# The backward of a fused RMSNorm in the style of Liger-Kernel's: one program per SM, each summing
# the weight gradient of its rows into a partial, the partials summed after; launches wrapped in
# `with torch.cuda.device(...)`. Bug: only the first program's partial is kept, which a single
# "SM" cannot show.
@triton.jit
def _rms_norm_fwd(X, W, Y, RSTD, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd(DY, X, W, RSTD, DX, DW_PARTIAL, n_rows, n_cols, stride, rows_per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    for row in range(row_start, row_end):
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = x * rstd
        wdy = w * dy
        dw += dy * xhat
        dx = rstd * (wdy - xhat * (tl.sum(wdy * xhat, axis=0) / n_cols))
        tl.store(DX + row * stride + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_PARTIAL + pid * n_cols + cols, dw, mask=mask)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, bug):
        x = x.contiguous()
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        block = triton.next_power_of_2(n_cols)
        with torch.cuda.device(x.device.index):
            _rms_norm_fwd[(n_rows,)](x, weight, y, rstd, n_cols, x.stride(0), eps, BLOCK=block)
        ctx.save_for_backward(x, weight, rstd)
        ctx.bug = bug
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        n_rows, n_cols = x.shape
        sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count
        rows_per_program = math.ceil(n_rows / sm_count)
        dx = torch.empty_like(x)
        dw_partial = torch.empty((sm_count, n_cols), device=x.device, dtype=torch.float32)
        block = triton.next_power_of_2(n_cols)
        with torch.cuda.device(x.device.index):
            _rms_norm_bwd[(sm_count,)](
                dy, x, weight, rstd, dx, dw_partial, n_rows, n_cols, x.stride(0), rows_per_program, BLOCK=block
            )
        dw = dw_partial[0] if ctx.bug else dw_partial.sum(0)
        return dx, dw.to(weight.dtype), None, None


def rms_norm(x, weight, eps=1e-6):
    return _RMSNorm.apply(x, weight, eps, False)


def rms_norm_bug(x, weight, eps=1e-6):
    return _RMSNorm.apply(x, weight, eps, True)


def rms_norm_reference(x, weight, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


# ------------------------------------------------------------------------------------ rope
# Rotary embedding in place, as Liger-Kernel's: the forward rotates a copy of x, the backward
# rotates grad_output back IN ITS OWN MEMORY and returns it. Bug: the backward rotates forward.
@triton.jit
def _rope_kernel(X, COS, SIN, n_half, stride, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_half
    x1 = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    x2 = tl.load(X + row * stride + n_half + cols, mask=mask, other=0.0)
    c = tl.load(COS + row * n_half + cols, mask=mask, other=0.0)
    s = tl.load(SIN + row * n_half + cols, mask=mask, other=0.0)
    if BACKWARD:
        s = -s
    tl.store(X + row * stride + cols, x1 * c - x2 * s, mask=mask)
    tl.store(X + row * stride + n_half + cols, x2 * c + x1 * s, mask=mask)


def _tables(n_rows: int, n_half: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(n_rows, dtype=torch.float64)[:, None]
    freqs = 10000.0 ** (-torch.arange(n_half, dtype=torch.float64) / n_half)
    angles = positions * freqs
    return angles.cos().float().to(device), angles.sin().float().to(device)


def _rotate(x: torch.Tensor, backward: bool) -> torch.Tensor:
    n_rows, dim = x.shape
    cos, sin = _tables(n_rows, dim // 2, x.device)
    block = triton.next_power_of_2(dim // 2)
    _rope_kernel[(n_rows,)](x, cos, sin, dim // 2, x.stride(0), BACKWARD=backward, BLOCK=block)
    return x


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bug):
        ctx.bug = bug
        return _rotate(x.contiguous().clone(), backward=False)

    @staticmethod
    def backward(ctx, dy):
        return _rotate(dy.contiguous(), backward=not ctx.bug), None


def rope(x):
    return _Rope.apply(x, False)


def rope_bug(x):
    return _Rope.apply(x, True)


def rope_reference(x):
    n_rows, dim = x.shape
    positions = torch.arange(n_rows, dtype=torch.float64, device=x.device)[:, None]
    freqs = 10000.0 ** (-torch.arange(dim // 2, dtype=torch.float64, device=x.device) / (dim // 2))
    cos, sin = (positions * freqs).cos().to(x.dtype), (positions * freqs).sin().to(x.dtype)
    x1, x2 = x[:, : dim // 2], x[:, dim // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


# ------------------------------------------------------------------------------------ softmax (float32 only)
# A kernel that takes float32 and nothing else. Bug: the backward subtracts sum(dy), not sum(dy * y).
@triton.jit
def _softmax_fwd(X, Y, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(Y + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def _softmax_bwd(DY, Y, DX, n_cols, stride, BUG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0)
    y = tl.load(Y + row * stride + cols, mask=mask, other=0.0)
    if BUG:
        dot = tl.sum(dy, axis=0)
    else:
        dot = tl.sum(dy * y, axis=0)
    tl.store(DX + row * stride + cols, y * (dy - dot), mask=mask)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bug):
        if x.dtype != torch.float32:
            raise TypeError(f"softmax: float32 only, got {x.dtype}")
        x = x.contiguous()
        y = torch.empty_like(x)
        block = triton.next_power_of_2(x.shape[1])
        _softmax_fwd[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=block)
        ctx.save_for_backward(y)
        ctx.bug = bug
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(y)
        block = triton.next_power_of_2(y.shape[1])
        _softmax_bwd[(y.shape[0],)](dy, y, dx, y.shape[1], y.stride(0), BUG=ctx.bug, BLOCK=block)
        return dx, None


def softmax(x):
    return _Softmax.apply(x, False)


def softmax_bug(x):
    return _Softmax.apply(x, True)


def softmax_reference(x):
    return torch.softmax(x, dim=-1)


# ------------------------------------------------------------------------------------ softmax_persistent
# The persistent softmax of Triton's fused-softmax tutorial: as many programs as the device has SMs
# (or rows, where fewer), each taking every num_programs-th row. The launcher asks the SM count in
# one of the ways public kernels do (SM_COUNT_QUERIES). Bug: a program's rows are counted as
# n_rows // num_programs from its start, so with more than one program the tail rows are never
# written (one "SM" hides it).
@triton.jit
def _softmax_persistent_fwd(X, Y, n_rows, n_cols, stride, BUG: tl.constexpr, BLOCK: tl.constexpr):
    start = tl.program_id(0)
    step = tl.num_programs(0)
    end = n_rows
    if BUG:
        end = start + (n_rows // step) * step
    for row in tl.range(start, end, step):
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(Y + row * stride + cols, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty), mask=mask)


def _sm_count_of_triton_driver(x: torch.Tensor) -> int:
    """flash-linear-attention's get_multiprocessor_count(x.device.index)."""
    return triton.runtime.driver.active.utils.get_device_properties(x.device.index)["multiprocessor_count"]


def _sm_count_of_current_triton_device(x: torch.Tensor) -> int:
    """Triton's fused-softmax tutorial (3.1's; later ones take get_active_torch_device().index)."""
    driver = triton.runtime.driver.active
    return driver.utils.get_device_properties(driver.get_current_device())["multiprocessor_count"]


def _sm_count_of_current_torch_device(x: torch.Tensor) -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _sm_count_of_cuda(x: torch.Tensor) -> int:
    """Triton's persistent-matmul tutorial: "cuda", hard-coded."""
    return torch.cuda.get_device_properties("cuda").multi_processor_count


SM_COUNT_QUERIES = {
    "triton_driver": _sm_count_of_triton_driver,
    "current_triton_device": _sm_count_of_current_triton_device,
    "current_torch_device": _sm_count_of_current_torch_device,
    "cuda": _sm_count_of_cuda,
}


def _softmax_persistent(x: torch.Tensor, bug: bool, query: str) -> torch.Tensor:
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.zeros_like(x)  # rows left unwritten stay zero (empty_like could hand back the right values)
    programs = min(SM_COUNT_QUERIES[query](x), n_rows)
    with torch.cuda.device(torch.cuda.current_device()):
        _softmax_persistent_fwd[(programs,)](
            x, y, n_rows, n_cols, x.stride(0), BUG=bug, BLOCK=triton.next_power_of_2(n_cols)
        )
    return y


def softmax_persistent(x, query="triton_driver"):
    return _softmax_persistent(x, False, query)


def softmax_persistent_bug(x, query="triton_driver"):
    return _softmax_persistent(x, True, query)


def softmax_persistent_reference(x):
    return torch.softmax(x, dim=-1)


# ------------------------------------------------------------------------------------ cumsum
# A row-wise cumulative sum straight on the loads (flash-linear-attention's chunk cumsum without its
# float32 upcast); the backward is the reversed cumulative sum of grad_output.
# Bug: the backward scans forward.
@triton.jit
def _cumsum_kernel(X, Y, n_cols, stride, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    tl.store(Y + row * stride + cols, tl.cumsum(x, axis=0, reverse=REVERSE), mask=mask)


def _cumsum_rows(x: torch.Tensor, reverse: bool) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    _cumsum_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), REVERSE=reverse, BLOCK=block)
    return y


class _Cumsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bug):
        ctx.bug = bug
        return _cumsum_rows(x, reverse=False)

    @staticmethod
    def backward(ctx, dy):
        return _cumsum_rows(dy, reverse=not ctx.bug), None


def cumsum(x):
    return _Cumsum.apply(x, False)


def cumsum_bug(x):
    return _Cumsum.apply(x, True)


def cumsum_reference(x):
    return x.cumsum(-1)


# ------------------------------------------------------------------------------------ embedding
# An embedding lookup whose backward adds each row's gradient into the weight's gradient with
# tl.atomic_add, in the weight's dtype (as Liger-Kernel's embedding backward does), so that rows
# sharing an index add up. Bug: a plain store, so the last row sharing an index wins.
@triton.jit
def _embedding_fwd(IDX, W, Y, dim, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    index = tl.load(IDX + row)
    tl.store(Y + row * dim + cols, tl.load(W + index * dim + cols, mask=mask), mask=mask)


@triton.jit
def _embedding_bwd(IDX, DY, DW, dim, BUG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    index = tl.load(IDX + row)
    dy = tl.load(DY + row * dim + cols, mask=mask)
    if BUG:
        tl.store(DW + index * dim + cols, dy, mask=mask)
    else:
        tl.atomic_add(DW + index * dim + cols, dy, mask=mask)


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indices, weight, bug):
        indices, weight = indices.contiguous(), weight.contiguous()
        y = torch.empty((indices.numel(), weight.shape[1]), device=weight.device, dtype=weight.dtype)
        block = triton.next_power_of_2(weight.shape[1])
        _embedding_fwd[(indices.numel(),)](indices, weight, y, weight.shape[1], BLOCK=block)
        ctx.save_for_backward(indices, weight)
        ctx.bug = bug
        return y

    @staticmethod
    def backward(ctx, dy):
        indices, weight = ctx.saved_tensors
        dw = torch.zeros_like(weight)
        block = triton.next_power_of_2(weight.shape[1])
        _embedding_bwd[(indices.numel(),)](indices, dy.contiguous(), dw, weight.shape[1], BUG=ctx.bug, BLOCK=block)
        return None, dw, None


def embedding(indices, weight):
    return _Embedding.apply(indices, weight, False)


def embedding_bug(indices, weight):
    return _Embedding.apply(indices, weight, True)


def embedding_reference(indices, weight):
    return weight[indices]
