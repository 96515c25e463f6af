"""Values for a TensorArg: uniform draws, structured makers, and keeping away from `avoid` points.

Everything here runs on the CPU in float64/complex128 (int64 for integer dtypes) with one seeded
torch.Generator; the caller casts to the test's dtype and moves to its device, so a seed gives
the same values on every device.

Makers (a matrix maker needs at least 2 dims; batch dims in front are allowed):

- positive: uniform in [low, high), default [0.25, 2); low must be > 0. Complex: positive real
  part in [low, high), imaginary part uniform in [-high, high).
- symmetric: (B + Bᴴ) / 2 of a uniform square B (Hermitian for complex dtypes).
- spd: A Aᴴ + n·I of a uniform n×n A: eigenvalues >= n, condition number about 1 + 16/3 for the
  default range (Hermitian positive definite for complex dtypes).
- lower_triangular / upper_triangular: tril / triu of a uniform matrix whose diagonal entries are
  pushed to magnitude in [1, 1 + max(|low|, |high|)/2): away from 0, so solves stay well posed.
- unit_norm: a uniform draw divided by its 2-norm over the last dim.
- orthogonal: Q of the QR of a uniform matrix, sign-fixed by diag(R) (orthonormal columns for
  tall m×n, orthonormal rows for wide; unitary for complex dtypes).

Structure makers (what a run's values looked like; rows are along the last dim):

- mask: each entry on with probability `share_on` (default 0.5), then `rows_off` rows, chosen at random,
  all off and `rows_on` others all on; off and on are `mask_values` (default 0 and 1, false and
  true for bool).
- dominant: uniform in [low, high), then one entry per row, at a random position, raised to the
  row's largest plus `gap` (default 4).
- integer: integers uniform in [ceil(low), ceil(high)), as floats.
- constant: every entry `fill`.

A tensor with expanded (stride 0) dims draws its values with those dims of size 1 (TensorArg.draw_shape).
"""

from __future__ import annotations

import math

import torch

from opcheck.spec.model import STRUCTURE_MAKERS, TensorArg

ELEMENTWISE_MAKERS = (None, "positive")
DOMINANT_GAP = 4.0
"""maker dominant's default: the row's largest entry exceeds the rest by this (e**4 ≈ 55x after a softmax)."""
AVOID_ROUNDS = 100


class SampleError(ValueError):
    """A TensorArg that cannot be built as written (the message says which field and why)."""


def uniform(shape, low: float, high: float, gen: torch.Generator, is_complex: bool) -> torch.Tensor:
    def real():
        return torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low

    if is_complex:
        return torch.complex(real(), real())
    return real()


def _draw_integers(arg: TensorArg, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Integers in [ceil(low), ceil(high)), [0, 10) by default."""
    if arg.maker is not None:
        raise SampleError(f"maker {arg.maker!r} makes floating-point values; this tensor is {dtype}")
    low = 0 if arg.low is None else math.ceil(arg.low)
    high = 10 if arg.high is None else math.ceil(arg.high)
    if high <= low:
        raise SampleError(f"low={arg.low} must be below high={arg.high}")
    values = _with_avoid(arg, dtype, lambda: torch.randint(low, high, tuple(arg.shape), generator=gen))
    return values.to(dtype)


def draw_values(arg: TensorArg, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """The values of one tensor at `dtype`, on the CPU, contiguous.

    Explicit values (`values`, `values_file`) draw nothing from `gen`: the sample's other tensors
    get the same values whichever of the two gives them.
    """
    shape = arg.draw_shape
    if arg.values is not None:
        return _compact(arg, _explicit(arg, dtype))
    if arg.values_file is not None:
        from opcheck.runtime.file_values import file_values  # which imports this module

        return _compact(arg, file_values(arg, dtype))
    if arg.maker in STRUCTURE_MAKERS:
        return _structure(arg, shape, dtype, gen)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).to(torch.bool)
    if not (dtype.is_floating_point or dtype.is_complex):
        return _draw_integers(arg, dtype, gen)
    low = arg.low if arg.low is not None else (0.25 if arg.maker == "positive" else -2.0)
    high = arg.high if arg.high is not None else 2.0
    if not high > low:
        raise SampleError(f"low={low} must be below high={high}")
    if arg.avoid and arg.maker not in ELEMENTWISE_MAKERS:
        raise SampleError(
            f"avoid: applies to elementwise values (no maker, or maker: positive); maker "
            f"{arg.maker!r} mixes values, so the points cannot be kept away"
        )
    is_complex = dtype.is_complex

    def draw() -> torch.Tensor:
        return make(arg.maker, shape, low, high, gen, is_complex).to(dtype)

    return _with_avoid(arg, dtype, draw)


def _compact(arg: TensorArg, values: torch.Tensor) -> torch.Tensor:
    """Explicit values at draw_shape: those at index 0 of each expanded dim, which must repeat them."""
    compact = values
    for d in arg.expanded_dims:
        compact = compact.narrow(d, 0, 1)
    if compact.shape != values.shape and not torch.equal(compact.expand(values.shape), values):
        dims = ", ".join(map(str, arg.expanded_dims))
        raise SampleError(f"strides expand dim {dims}, but the values differ along it: an expanded dim repeats a slice")
    return compact


def _structure(arg: TensorArg, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """The values of a structure maker (mask, dominant, integer, constant), at `dtype`."""
    if arg.maker == "constant":
        fill = 0.0 if arg.fill is None else arg.fill
        return torch.full(shape, fill, dtype=torch.float64).to(dtype)
    if arg.maker == "integer":
        first = math.ceil(-2.0 if arg.low is None else arg.low)
        end = math.ceil(2.0 if arg.high is None else arg.high)
        if end <= first:
            raise SampleError(f"maker 'integer': no integer in [low, high) = [{arg.low}, {arg.high})")
        return torch.randint(first, end, shape, generator=gen).to(torch.float64).to(dtype)
    width = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if shape else 1
    if arg.maker == "dominant":
        low = -2.0 if arg.low is None else arg.low
        high = 2.0 if arg.high is None else arg.high
        if not high > low:
            raise SampleError(f"low={low} must be below high={high}")
        values = uniform((rows, width), low, high, gen, False)
        at = torch.randint(0, max(width, 1), (rows,), generator=gen)
        if width and rows:
            top = values.max(dim=-1).values
            values[torch.arange(rows), at] = top + (DOMINANT_GAP if arg.gap is None else arg.gap)
        return values.reshape(shape).to(dtype)
    on = torch.rand((rows, width), generator=gen, dtype=torch.float64) < (0.5 if arg.share_on is None else arg.share_on)
    order = torch.randperm(rows, generator=gen)
    if arg.rows_off + arg.rows_on > rows:
        raise SampleError(f"rows_off + rows_on = {arg.rows_off + arg.rows_on}, but the tensor has {rows} row(s)")
    on[order[: arg.rows_off]] = False
    on[order[arg.rows_off : arg.rows_off + arg.rows_on]] = True
    on = on.reshape(shape)
    if dtype == torch.bool:
        return on
    off_value, on_value = arg.mask_values if arg.mask_values is not None else (0.0, 1.0)
    wide = torch.int64 if not (dtype.is_floating_point or dtype.is_complex) else torch.float64
    values = torch.where(on, torch.tensor(on_value, dtype=wide), torch.tensor(off_value, dtype=wide))
    return values.to(dtype)


def _explicit(arg: TensorArg, dtype: torch.dtype) -> torch.Tensor:
    try:
        values = torch.tensor(_to_list(arg.values), dtype=dtype)
    except Exception as e:
        raise SampleError(f"values: cannot make a {dtype} tensor: {e}") from None
    if tuple(values.shape) != tuple(arg.shape):
        raise SampleError(f"values: have shape {list(values.shape)}, but shape says {list(arg.shape)}")
    return values


def _to_list(values):
    if isinstance(values, (tuple, list)):
        return [_to_list(v) for v in values]
    return values


def _with_avoid(arg: TensorArg, dtype: torch.dtype, draw) -> torch.Tensor:
    """Redraw (from the same distribution) the entries within `margin` of an avoid point.

    Checked at the final dtype: rounding to bfloat16 must not bring a value back within the margin.
    """
    values = draw()
    if not arg.avoid:
        return values
    for _ in range(AVOID_ROUNDS):
        near = too_close(values, arg.avoid, arg.margin)
        if not bool(near.any()):
            return values
        values = torch.where(near, draw(), values)
    raise SampleError(
        f"avoid: could not keep values at least margin={arg.margin} away from "
        f"{list(arg.avoid)} within [low, high) after {AVOID_ROUNDS} redraws: widen the range "
        "or shrink the margin"
    )


def too_close(values: torch.Tensor, points, margin: float) -> torch.Tensor:
    wide = values.to(torch.complex128 if values.is_complex() else torch.float64)
    near = torch.zeros(values.shape, dtype=torch.bool)
    for p in points:
        near |= (wide - p).abs() < margin
    return near


def make(
    maker: str | None, shape: tuple, low: float, high: float, gen: torch.Generator, is_complex: bool
) -> torch.Tensor:
    if maker is None:
        return uniform(shape, low, high, gen, is_complex)
    if maker == "positive":
        if low <= 0:
            raise SampleError(f"maker 'positive' needs low > 0, got low={low}")
        if is_complex:
            return torch.complex(uniform(shape, low, high, gen, False), uniform(shape, -high, high, gen, False))
        return uniform(shape, low, high, gen, False)
    if maker == "unit_norm":
        if len(shape) == 0:
            raise SampleError("maker 'unit_norm' normalizes over the last dim; shape [] has none")
        x = uniform(shape, low, high, gen, is_complex)
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        return x / torch.where(norm == 0, torch.ones_like(norm), norm)
    if len(shape) < 2:
        raise SampleError(f"maker {maker!r} makes matrices: shape needs at least 2 dims, got {list(shape)}")
    m, n = shape[-2], shape[-1]
    if maker in ("symmetric", "spd") and m != n:
        raise SampleError(f"maker {maker!r} makes square matrices; shape ends in {m}x{n}")
    if maker == "symmetric":
        b = uniform(shape, low, high, gen, is_complex)
        return (b + b.mH) / 2
    if maker == "spd":
        a = uniform(shape, low, high, gen, is_complex)
        eye = torch.eye(n, dtype=a.dtype)
        return a @ a.mH + n * eye
    if maker in ("lower_triangular", "upper_triangular"):
        b = uniform(shape, low, high, gen, is_complex)
        t = torch.tril(b) if maker == "lower_triangular" else torch.triu(b)
        d = t.diagonal(dim1=-2, dim2=-1)
        mag = d.abs()
        unit = torch.where(mag == 0, torch.ones_like(d), d / torch.where(mag == 0, torch.ones_like(mag), mag))
        d.copy_(unit * (1 + mag / 2))
        return t
    if maker == "orthogonal":
        tall = m >= n
        square = shape[:-2] + ((m, n) if tall else (n, m))
        a = uniform(square, low, high, gen, is_complex)
        q, r = torch.linalg.qr(a)
        diag = r.diagonal(dim1=-2, dim2=-1)
        phase = torch.where(diag.abs() == 0, torch.ones_like(diag), diag / diag.abs())
        q = q * phase.unsqueeze(-2)
        return q if tall else q.mH
    raise SampleError(f"unknown maker {maker!r}")
