"""Triton kernels as kernel authors write them, tested by op_specs/triton_*.yaml.

Each op is a torch.autograd.Function whose forward and backward are Triton kernels, next to a
float64 reference in plain torch ops that the specs check it against (`reference:`):

- `rms_norm(x, weight, eps)`: x / sqrt(mean(x², -1) + eps) * weight, gradients for x and weight
  (`rms_norm_reference`);
- `swiglu(a, b)`: silu(a) * b, gradients for a and b (`swiglu_reference`);
- `cross_entropy(logits, targets)`: softmax cross-entropy of logits [N, C] with integer targets
  [N] in [0, C), mean over rows, gradient for the logits (`cross_entropy_reference`);
- `cross_entropy_inplace(logits, targets)`: the same loss, but its forward WRITES THE GRADIENT
  INTO `logits`' MEMORY (through the pointer, so autograd's version counter does not see it) and
  its backward returns that memory, scaled in place: the memory-saving trick of fused
  cross-entropy kernels (Liger-Kernel's among them). After the call `logits` holds
  (softmax - one_hot) / N, not logits: give it a fresh copy. Its spec,
  op_specs/triton_cross_entropy_inplace.yaml, says `clone_inputs: true`.

How the kernels are written: one program per row, BLOCK_SIZE = triton.next_power_of_2(n_cols)
(one block holds the row), masked loads with `other=` for the tail of the block past n_cols (0
for sums, -inf for the max), everything computed in float32 whatever the input dtype (float32,
float16, bfloat16), and each result rounded once, at the store.

Where they run. Without a GPU (`torch.cuda.is_available()` false) this module sets
TRITON_INTERPRET=1 before defining any kernel (unless the environment sets it already), so
`triton.jit` makes interpreted kernels, which run on CPU tensors with numpy: that is how CI
tests them. The setting is process-wide: triton reads it when a kernel is defined, its own
`tl.sum`, `tl.max` and `tl.sigmoid` included, so one process cannot mix interpreted and compiled
kernels. Where triton was imported before this module (torch.testing._internal and torch._dynamo
import it), its own kernels were defined compiled; the module then defines them again,
interpreted (see the `importlib.reload` below), as importing triton after the setting would have.

With a GPU, `triton.jit` compiles for the GPU, and a compiled kernel cannot read CPU tensors (its
launcher raises ValueError: "Pointer argument cannot be accessed from Triton (cpu tensor?)"). The
wrappers check that first and raise a RuntimeError that says what to do. The specs list
`devices: [cpu, cuda]`, so:

- without a GPU, the cpu tests run the interpreted kernels and the cuda tests are not collected;
- with a GPU, the cuda tests run the compiled kernels and the cpu tests fail with that error:
  run them with TRITON_INTERPRET=1 (every device then runs interpreted: the interpreter copies
  cuda tensors to the host and back), and the cuda tests alone with `--opcheck-device cuda`.

The interpreter's limits (triton 3.9.0; 3.2.0 the same; 3.1.0 the same with numpy < 2, while
with numpy 2 its loads and stores misread memory, and this module refuses to load), and what the
kernels do about them:

- bfloat16 arithmetic is broken: numpy has no bfloat16, so the interpreter keeps bfloat16 values
  as uint16 and `a + b` on two bfloat16 blocks adds bit patterns (NaN or garbage). The kernels
  convert every load to float32 first; bfloat16 <-> float32 conversions themselves are exact.
- float32 -> bfloat16 casts truncate (round toward zero) in the interpreter, where GPUs round to
  nearest even: up to one bfloat16 ulp off instead of half of one. `_rounded` rounds the float32
  value to nearest even with integer operations on its bits before a bfloat16 store, which makes
  the cast exact on both (values below bfloat16's normal range flush to zero under the
  interpreter). float16 stores round to nearest even there already (numpy's cast).
- libdevice functions (`triton.language.extra.libdevice.exp`, `.tanh`, `.rsqrt`, ...) fail under
  the interpreter (TypeError: cannot convert None to tensor). The kernels use `tl.exp`, `tl.log`,
  `tl.rsqrt` and `tl.sigmoid`, which it implements; these take float32 or float64 only (on a GPU
  too), one more reason to compute in float32.
- a Python float kernel argument stays a Python float under the interpreter, not a float32
  scalar as on a GPU: arithmetic with blocks works (`mean_sq + eps`), methods do not
  (`eps.to(tl.float32)` raises AttributeError). `rms_norm` passes eps as a float and only adds it.
"""

import importlib
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (after TRITON_INTERPRET: triton reads it when a kernel is defined)
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

MAX_BLOCK_SIZE = 65536
"""The widest row one program holds (elements); wider rows would need a loop over column blocks."""


def _kernel_for(kernel, tensor: torch.Tensor):
    """`kernel`, after checking that it can read `tensor`: a compiled kernel reads GPU memory only."""
    if tensor.device.type == "cpu" and not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(
            f"{kernel.fn.__name__} got CPU tensors, but this process compiles its Triton kernels for the GPU "
            "(TRITON_INTERPRET is not 1: examples.triton_kernels sets it only where torch sees no GPU), and a "
            "compiled kernel reads GPU memory only. Run with TRITON_INTERPRET=1 to test on CPU under the Triton "
            "interpreter, or test on the GPU alone (pytest --opcheck-device cuda)."
        )
    return kernel


def _launch_config(n_cols: int) -> tuple[int, int]:
    """BLOCK_SIZE (one block per row) and num_warps for rows of n_cols elements."""
    block_size = triton.next_power_of_2(n_cols)
    if block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"rows of {n_cols} elements exceed one block ({MAX_BLOCK_SIZE} elements)")
    num_warps = 4 if block_size < 2048 else 8 if block_size < 8192 else 16
    return block_size, num_warps


def _rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """`t` as a contiguous [rows, n_cols] matrix (a view when it is contiguous already)."""
    return t.contiguous().view(-1, n_cols)


@triton.jit
def _rounded(x, dtype: tl.constexpr):
    """float32 `x` as `dtype`, rounded to nearest even. For bfloat16 the rounding is done on the
    bits, so that the cast is exact: the interpreter's float32 -> bfloat16 cast truncates."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        x = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return x.to(dtype)


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


if isinstance(_rounded, InterpretedFunction):
    import numpy

    if _version(triton.__version__) < (3, 2) and _version(numpy.__version__) >= (2, 0):
        raise ImportError(
            f"the Triton interpreter of triton {triton.__version__} computes garbage with numpy "
            f"{numpy.__version__} (its loads and stores misread memory): it needs triton>=3.2, or numpy<2"
        )
    if not isinstance(tl.sum, InterpretedFunction):
        # triton was imported before TRITON_INTERPRET was set (torch.testing._internal and
        # torch._dynamo import it), so its own @triton.jit functions (tl.sum, tl.max, tl.sigmoid,
        # ...) were made compiled, and an interpreted kernel cannot call them ("Cannot call
        # @triton.jit'd outside of the scope of a kernel"). Define them again under the setting,
        # as importing triton now would.
        for _module in ("triton.language.standard", "triton.language.random", "triton.language"):
            importlib.reload(sys.modules[_module])


# ------------------------------------------------------------------------------------ RMSNorm
@triton.jit
def _rms_norm_fwd_kernel(X, W, Y, RSTD, x_row_stride, y_row_stride, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    rstd = tl.rsqrt(mean_sq + eps)
    y = x * rstd * w
    tl.store(Y + row * y_row_stride + cols, _rounded(y, Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DX, DW_PARTIAL, dy_row_stride, x_row_stride, dx_row_stride, n_cols, BLOCK_SIZE: tl.constexpr
):
    # y = x̂ w with x̂ = x rstd, rstd = (mean(x²) + eps)^(-1/2):
    # dx = rstd (dy w - x̂ mean(dy w x̂)), and row's share of dw = dy x̂ (summed over rows outside).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dy = tl.load(DY + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    x_hat = x * rstd
    dy_w = dy * w
    dx = rstd * (dy_w - x_hat * (tl.sum(dy_w * x_hat, axis=0) / n_cols))
    tl.store(DX + row * dx_row_stride + cols, _rounded(dx, DX.dtype.element_ty), mask=mask)
    tl.store(DW_PARTIAL + row * n_cols + cols, dy * x_hat, mask=mask)


class RMSNorm(torch.autograd.Function):
    """RMSNorm over the last dim, forward and backward in Triton, float32 inside."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        n_cols = x.shape[-1]
        if weight.shape != (n_cols,):
            raise ValueError(f"weight must have shape ({n_cols},), got {tuple(weight.shape)}")
        x2 = _rows(x, n_cols)
        weight = weight.contiguous()
        y = torch.empty_like(x2)
        rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        block_size, num_warps = _launch_config(n_cols)
        _kernel_for(_rms_norm_fwd_kernel, x)[(x2.shape[0],)](
            x2,
            weight,
            y,
            rstd,
            x2.stride(0),
            y.stride(0),
            n_cols,
            float(eps),
            BLOCK_SIZE=block_size,
            num_warps=num_warps,
        )
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        n_rows, n_cols = x2.shape
        dy = _rows(grad, n_cols)
        dx = torch.empty_like(x2)
        dw_partial = torch.empty(n_rows, n_cols, dtype=torch.float32, device=x2.device)
        block_size, num_warps = _launch_config(n_cols)
        _kernel_for(_rms_norm_bwd_kernel, x2)[(n_rows,)](
            dy,
            x2,
            weight,
            rstd,
            dx,
            dw_partial,
            dy.stride(0),
            x2.stride(0),
            dx.stride(0),
            n_cols,
            BLOCK_SIZE=block_size,
            num_warps=num_warps,
        )
        dw = dw_partial.sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return dx.view(ctx.x_shape), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return RMSNorm.apply(x, weight, eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# ------------------------------------------------------------------------------------ SwiGLU
@triton.jit
def _swiglu_fwd_kernel(A, B, OUT, a_row_stride, b_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    a = tl.load(A + row * a_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + row * b_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    out = a * tl.sigmoid(a) * b
    tl.store(OUT + row * out_row_stride + cols, _rounded(out, OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    DOUT,
    A,
    B,
    DA,
    DB,
    dout_row_stride,
    a_row_stride,
    b_row_stride,
    da_row_stride,
    db_row_stride,
    n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    # out = silu(a) b: da = dout b σ(a) (1 + a (1 - σ(a))), db = dout silu(a).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dout = tl.load(DOUT + row * dout_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + row * a_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + row * b_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    da = dout * b * sig * (1.0 + a * (1.0 - sig))
    db = dout * a * sig
    tl.store(DA + row * da_row_stride + cols, _rounded(da, DA.dtype.element_ty), mask=mask)
    tl.store(DB + row * db_row_stride + cols, _rounded(db, DB.dtype.element_ty), mask=mask)


class SwiGLU(torch.autograd.Function):
    """silu(a) * b for a and b of one shape, forward and backward in Triton, float32 inside."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.shape != b.shape:
            raise ValueError(f"a and b must have one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
        n_cols = a.shape[-1]
        a2, b2 = _rows(a, n_cols), _rows(b, n_cols)
        out = torch.empty_like(a2)
        block_size, num_warps = _launch_config(n_cols)
        _kernel_for(_swiglu_fwd_kernel, a)[(a2.shape[0],)](
            a2, b2, out, a2.stride(0), b2.stride(0), out.stride(0), n_cols, BLOCK_SIZE=block_size, num_warps=num_warps
        )
        ctx.save_for_backward(a2, b2)
        ctx.shape = a.shape
        return out.view(a.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a2, b2 = ctx.saved_tensors
        n_rows, n_cols = a2.shape
        dout = _rows(grad, n_cols)
        da, db = torch.empty_like(a2), torch.empty_like(b2)
        block_size, num_warps = _launch_config(n_cols)
        _kernel_for(_swiglu_bwd_kernel, a2)[(n_rows,)](
            dout,
            a2,
            b2,
            da,
            db,
            dout.stride(0),
            a2.stride(0),
            b2.stride(0),
            da.stride(0),
            db.stride(0),
            n_cols,
            BLOCK_SIZE=block_size,
            num_warps=num_warps,
        )
        return da.view(ctx.shape), db.view(ctx.shape)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return SwiGLU.apply(a, b)


def swiglu_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * torch.sigmoid(a) * b


# ------------------------------------------------------------------------------------ cross-entropy
@triton.jit
def _log1p(r):
    """log(1 + r) for r >= 0, accurate where 1 + r rounds (Kahan's form; tl has no log1p, and
    libdevice's fails under the interpreter)."""
    w = 1.0 + r
    exact = w == 1.0
    return tl.where(exact, r, tl.log(w) * r / tl.where(exact, 1.0, w - 1.0))


@triton.jit
def _cross_entropy_row(row_ptr, TARGETS, row, cols, mask):
    """The row's loss, probabilities and 1 - p[target], in float32, without cancellation.

    The row is loaded from row_ptr (masked lanes as -inf: out of the max and the sums), its
    target from TARGETS[row].

    With m = max(x), e = exp(x - m), s = sum(e) and rest = s - e[target] summed directly: the loss
    is log(s) - (x[target] - m), which is log1p(rest / e[target]) when the target dominates (a
    confident model's loss of 1e-10 is not rounded to 0), and 1 - p[target] is rest / s, not
    1 - p[target] (p[target] -> 1 would leave its rounding error alone)."""
    x = tl.load(row_ptr + cols, mask=mask, other=-float("inf")).to(tl.float32)
    target = tl.load(TARGETS + row)
    x_target = tl.load(row_ptr + target).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)  # 0 in the tail: exp(-inf)
    s = tl.sum(e, axis=0)
    rest = tl.sum(tl.where(cols == target, 0.0, e), axis=0)
    e_target = tl.exp(x_target - m)
    ratio = rest / e_target
    loss = tl.where(ratio < 1.0, _log1p(ratio), tl.log(s) - (x_target - m))
    return loss, e / s, rest / s, target


@triton.jit
def _cross_entropy_fwd_kernel(
    LOGITS, TARGETS, LOSS, logits_row_stride, n_cols, n_rows, WRITE_GRAD: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    # WRITE_GRAD: the row's gradient of the mean loss, (softmax(x) - one_hot(t)) / n_rows,
    # overwrites the logits (the in-place variant).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    row_ptr = LOGITS + row * logits_row_stride
    loss, p, not_target, target = _cross_entropy_row(row_ptr, TARGETS, row, cols, mask)
    tl.store(LOSS + row, loss)
    if WRITE_GRAD:
        grad = tl.where(cols == target, -not_target, p) / n_rows
        tl.store(row_ptr + cols, _rounded(grad, LOGITS.dtype.element_ty), mask=mask)


@triton.jit
def _cross_entropy_bwd_kernel(
    LOGITS, TARGETS, DLOSS, DLOGITS, logits_row_stride, dlogits_row_stride, n_cols, n_rows, BLOCK_SIZE: tl.constexpr
):
    # d mean-loss / dx = (softmax(x) - one_hot(t)) / n_rows, times the loss's gradient. The row's
    # max and sums are recomputed, not saved.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    scale = tl.load(DLOSS).to(tl.float32) / n_rows
    _, p, not_target, target = _cross_entropy_row(LOGITS + row * logits_row_stride, TARGETS, row, cols, mask)
    grad = tl.where(cols == target, -not_target, p) * scale
    tl.store(DLOGITS + row * dlogits_row_stride + cols, _rounded(grad, DLOGITS.dtype.element_ty), mask=mask)


@triton.jit
def _scale_rows_inplace_kernel(X, SCALE, row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    x = x * tl.load(SCALE).to(tl.float32)
    tl.store(X + row * row_stride + cols, _rounded(x, X.dtype.element_ty), mask=mask)


def _check_cross_entropy_args(logits: torch.Tensor, targets: torch.Tensor) -> None:
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, C] and targets [N], got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if targets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"targets must be int32 or int64 class indices, got {targets.dtype}")


def _cross_entropy_forward(logits: torch.Tensor, targets: torch.Tensor, write_grad: bool) -> torch.Tensor:
    """The mean loss, in logits' dtype (the per-row losses are float32, rounded once after the mean)."""
    n_rows, n_cols = logits.shape
    losses = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    block_size, num_warps = _launch_config(n_cols)
    _kernel_for(_cross_entropy_fwd_kernel, logits)[(n_rows,)](
        logits,
        targets,
        losses,
        logits.stride(0),
        n_cols,
        n_rows,
        WRITE_GRAD=write_grad,
        BLOCK_SIZE=block_size,
        num_warps=num_warps,
    )
    return losses.mean().to(logits.dtype)


class CrossEntropy(torch.autograd.Function):
    """Mean softmax cross-entropy of logits [N, C] and class indices [N], forward and backward in Triton."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        _check_cross_entropy_args(logits, targets)
        logits, targets = logits.contiguous(), targets.contiguous()
        ctx.save_for_backward(logits, targets)
        return _cross_entropy_forward(logits, targets, write_grad=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets = ctx.saved_tensors
        n_rows, n_cols = logits.shape
        dlogits = torch.empty_like(logits)
        block_size, num_warps = _launch_config(n_cols)
        _kernel_for(_cross_entropy_bwd_kernel, logits)[(n_rows,)](
            logits,
            targets,
            grad.contiguous(),
            dlogits,
            logits.stride(0),
            dlogits.stride(0),
            n_cols,
            n_rows,
            BLOCK_SIZE=block_size,
            num_warps=num_warps,
        )
        return dlogits, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return CrossEntropy.apply(logits, targets)


class CrossEntropyInplace(torch.autograd.Function):
    """CrossEntropy whose forward overwrites `logits` with the gradient (see cross_entropy_inplace)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        _check_cross_entropy_args(logits, targets)
        if not logits.is_contiguous():
            raise ValueError("cross_entropy_inplace writes the gradient into logits, which must be contiguous")
        loss = _cross_entropy_forward(logits, targets.contiguous(), write_grad=True)
        ctx.save_for_backward(logits.detach())
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (dlogits,) = ctx.saved_tensors  # logits' memory, holding d(mean loss)/d(logits) since forward
        n_rows, n_cols = dlogits.shape
        block_size, num_warps = _launch_config(n_cols)
        _kernel_for(_scale_rows_inplace_kernel, dlogits)[(n_rows,)](
            dlogits, grad.contiguous(), dlogits.stride(0), n_cols, BLOCK_SIZE=block_size, num_warps=num_warps
        )
        return dlogits, None


def cross_entropy_inplace(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """cross_entropy that saves memory by WRITING INTO `logits`: on return, `logits` holds the
    gradient of the mean loss, (softmax(logits) - one_hot(targets)) / N, and backward scales that
    memory in place by the loss's gradient and returns it. Autograd does not notice (the kernel
    writes through the pointer, not a torch in-place op), so pass a fresh copy of the logits
    (`logits.detach().clone().requires_grad_()`) whenever they are needed afterwards. In float16
    and bfloat16 that gradient is rounded twice, at the forward's store and after the scaling,
    unless the loss's gradient is 1."""
    return CrossEntropyInplace.apply(logits, targets)


def cross_entropy_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # torch's fused cross_entropy, not logsumexp minus the gathered logit: the low-precision check
    # rounds the reference's steps to find what the math reaches at a dtype, and the composite's
    # backward rounds softmax before subtracting 1, as a kernel must not.
    return torch.nn.functional.cross_entropy(logits, targets)


def dominant_class_logits(device: str, dtype: torch.dtype, generator: torch.Generator):
    """Logits [8, 600] (a sample `generator:`) whose target class stands at 30, the others in
    [-2, 2): the target's softmax probability is 1 - 1e-10 and the loss 1e-10 per row, and the
    other classes' gradients are down to 2e-15: a confident model's logits. Float32 rounds the
    loss to 0 there, an absolute error of 1e-10 (torch's own cross_entropy does the same)."""
    n_rows, n_cols = 8, 600
    logits = torch.rand(n_rows, n_cols, generator=generator, dtype=torch.float64) * 4 - 2
    targets = torch.randint(0, n_cols, (n_rows,), generator=generator)
    logits[torch.arange(n_rows), targets] = 30.0
    return (logits.to(device=device, dtype=dtype).requires_grad_(), targets.to(device)), {}
