"""Numbers of the low-precision check: upcasts, roundings, ulps, perturbations, and the
RoundedTo mode that runs float64 code as plain PyTorch at a low dtype."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HIGH = {
    torch.float32: torch.float64,
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.complex64: torch.complex128,
    torch.float64: torch.float64,
    torch.complex128: torch.complex128,
}
"""The dtype a reference runs in for each dtype (float64, or complex128 for complex ones)."""


class RoundedTo(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Runs float64 code with every operation's result rounded to a low dtype (kept in float64):
    plain PyTorch at that dtype as if each kernel rounded exactly once, the saved tensors of autograd
    and the steps of a composite included. Views are left alone (their base is rounded already)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()  # type: ignore[no-untyped-call]
        self.dtype = dtype

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        aliased = {_storage(t) for t in _tensors((args, kwargs or {}))}
        writes = any(r.alias_info is not None and r.alias_info.is_write for r in func._schema.returns)
        return _tree_map(lambda t: self._round(t, aliased, writes), out)

    def _round(self, t: Any, aliased: set[int], writes: bool) -> Any:
        if (
            not isinstance(t, torch.Tensor)
            or t.layout != torch.strided
            or t.dtype not in (torch.float64, torch.complex128)
        ):
            return t
        rounded = t.to(_partner(self.dtype, t)).to(t.dtype)
        if _storage(t) in aliased:
            if writes:  # an in-place result: round the values where they are, past the version
                t.data.copy_(rounded)  # counter (autograd may have saved t)
            return t  # a view: its base is rounded already
        return rounded


def _storage(t: Any) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # no storage (a sparse or wrapper tensor)
        return -1


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _tree_map(fn: Callable[[Any], Any], out: Any) -> Any:
    if isinstance(out, (tuple, list)):
        return type(out)(_tree_map(fn, o) for o in out)
    return fn(out)


# ------------------------------------------------------------------------------------ numbers
def upcast(t: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """The float64/complex128 copy of t (on `device`), same strides (a sparse t: the same layout
    and pattern; an expanded t differentiated: dense), same requires_grad."""
    dtype = HIGH.get(t.dtype, t.dtype)
    device = t.device if device is None else device
    if t.layout != torch.strided:
        return t.detach().to(device=device, dtype=dtype, copy=True).requires_grad_(t.requires_grad)
    expanded = [d for d, (n, st) in enumerate(zip(t.shape, t.stride())) if st == 0 and n > 1]
    if expanded and not t.requires_grad:  # an expanded (stride 0) dim stays one: elements share memory
        base = t
        for d in expanded:
            base = base.narrow(d, 0, 1)
        return upcast(base, device).expand(t.shape)
    if expanded:  # a leaf to differentiate cannot be a view; its copy is dense
        return t.detach().to(device=device, dtype=dtype, copy=True).requires_grad_()
    out = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=device)
    with torch.no_grad():
        out.copy_(t.detach())
    return out.requires_grad_(t.requires_grad)


def _rounding(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|r rounded to dtype - r|: what storing the exact result at the dtype loses."""
    rounded = r.to(_partner(dtype, r)).to(r.dtype)
    out = (rounded - r).abs()
    return torch.where(torch.isfinite(out), out, torch.zeros_like(out))


def _ulp(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of |r| at dtype (the spacing of subnormals at 0)."""
    real = dtype if not dtype.is_complex else (torch.float32 if dtype == torch.complex64 else torch.float64)
    fi = torch.finfo(real)
    mag = r.abs().to(torch.float64)
    _, exp = torch.frexp(mag)
    ulp = torch.ldexp(torch.ones_like(mag), exp - 1) * fi.eps
    ulp = ulp.clamp_min(fi.smallest_normal * fi.eps)
    return torch.where(torch.isfinite(ulp), ulp, torch.zeros_like(ulp))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels at `dtype` compute in: float32 (complex64), whatever they load and store."""
    return torch.complex64 if dtype.is_complex else torch.float32


def _partner(dtype: torch.dtype, like: torch.Tensor) -> torch.dtype:
    """dtype, or its complex or real counterpart, to match whether `like` is complex."""
    if like.is_complex():
        return _complex_partner(dtype)
    return torch.float32 if dtype == torch.complex64 else dtype


def _complex_partner(dtype: torch.dtype) -> torch.dtype:
    return torch.complex64 if dtype in (torch.float32, torch.complex64, torch.float16, torch.bfloat16) else dtype


def _perturb(t: torch.Tensor, u: float, gen: torch.Generator) -> torch.Tensor:
    """t * (1 + delta), delta uniform in [-u, u] per entry: one draw of input rounding."""
    dense = t.detach()
    values = dense._values() if dense.layout == torch.sparse_coo else dense
    if values.layout != torch.strided:
        return dense  # compressed sparse layouts: left as they are
    delta = (torch.rand(values.shape, generator=gen, dtype=torch.float64) * 2 - 1) * u
    scaled = values * (1 + delta.to(values.device, values.real.dtype if values.is_complex() else values.dtype))
    if dense.layout == torch.sparse_coo:
        coo = torch.sparse_coo_tensor(dense._indices(), scaled, dense.shape, check_invariants=True)
        return coo.coalesce().requires_grad_(t.requires_grad)
    return scaled.requires_grad_(t.requires_grad)


def _random_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    real = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1
    if t.is_complex():
        real = torch.complex(real, torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1)
    return real.to(t.dtype).to(t.device)


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if not _is_float(x):
        return x
    target = _complex_partner(dtype) if x.is_complex() else dtype
    if x.dtype == target:
        return x
    return x.detach().to(target).requires_grad_(x.requires_grad)


def _low_dtype(inputs: tuple[Any, ...]) -> torch.dtype | None:
    for x in inputs:
        if _is_float(x):
            return x.dtype if not x.is_complex() else torch.complex64
    return None


def _device_of(inputs: tuple[Any, ...]) -> torch.device:
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _as_tuple(inputs: Any) -> tuple[Any, ...]:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def _differentiable(o: Any) -> bool:
    return isinstance(o, torch.Tensor) and o.requires_grad and _is_float(o)


def _dense(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    t = t.to_dense() if t.layout != torch.strided else t
    return t.to("cpu")


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    if not len(shape):
        return ()
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def _scalar(t: torch.Tensor) -> complex | float:
    v = t.item()
    return v if isinstance(v, complex) else float(v)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _num(v: complex | float) -> str:
    return f"{v.real:.6g}{v.imag:+.6g}j" if isinstance(v, complex) else f"{v:.6g}"


NARROWER = {
    torch.float32: (torch.bfloat16, torch.float16),
    torch.complex64: (torch.bfloat16, torch.float16),
    torch.float16: (torch.bfloat16,),
}
"""The dtypes a kernel at each low-precision dtype might compute in by mistake, narrowest first."""


def narrower_dtype_hint(lo: torch.Tensor, lo_w: torch.Tensor, rf: torch.Tensor, bad: torch.Tensor) -> str | None:
    """A hint when the wrong entries' errors look like the rounding of a narrower dtype than lo's.

    Rounding to a dtype with unit roundoff u (2^-8 for bfloat16, 2^-11 for float16) leaves
    relative errors up to u, of both signs; a stray factor leaves one relative error of one sign.
    So: the largest relative error of the wrong entries lies within [u/4, 2u] (these windows do
    not overlap for bfloat16 and float16), and the errors have both signs or every low value is
    exactly representable in the narrower dtype (the result was rounded there and cast back).
    lo: the low-precision values; lo_w: the same in rf's dtype; bad: the out-of-tolerance entries.
    """
    candidates = NARROWER.get(lo.dtype, ())
    if not candidates:
        return None
    keep = bad & torch.isfinite(rf) & torch.isfinite(lo_w) & (rf != 0)
    if not bool(keep.any()):
        return None
    err = (lo_w - rf)[keep]
    rel = float((err.abs() / rf[keep].abs()).max())
    signed = torch.view_as_real(err).reshape(-1) if err.is_complex() else err
    both_signs = bool((signed > 0).any()) and bool((signed < 0).any())
    for narrow in candidates:
        u = torch.finfo(narrow).eps / 2
        if not u / 4 <= rel <= 2 * u:
            continue
        if both_signs or _representable_in(lo, narrow):
            name = _name(narrow)
            return (
                f"errors of the size of {name} rounding (relative {rel:.1e}; {name}'s unit roundoff is "
                f"{u:.1e}): is a kernel computing in a narrower dtype?"
            )
    return None


def _representable_in(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Every finite value of t survives a round trip through dtype unchanged."""
    parts = torch.view_as_real(t) if t.is_complex() else t
    finite = parts[torch.isfinite(parts)]
    return bool(finite.numel()) and bool(torch.equal(finite.to(dtype).to(finite.dtype), finite))
