"""bfloat16 in the interpreter as a GPU computes it.

numpy has no bfloat16, so the interpreter keeps bfloat16 values as their uint16 bit patterns and
runs numpy on those: `a + b` adds bit patterns (values near 1e10, or NaN), comparisons compare
them (wrong for negative values), `tl.sum`, `tl.max`, `tl.cumsum` and `tl.dot` reduce them, and a
float32 -> bfloat16 cast drops the low 16 bits (rounds toward zero). A GPU computes bfloat16 arithmetic in
float32 and rounds each result to nearest even. These patches do the same around the
interpreter's own operations: bfloat16 operands are widened to float32 (exact), the operation runs
as it does on float32, and a bfloat16 result is rounded to nearest even (NaN stays NaN, infinities
stay infinite, values past the largest bfloat16 round to infinity). `tl.atomic_add` on bfloat16,
which the interpreter refused, adds the same way.

A reduction or a cumulative sum/product of bfloat16 values accumulates in float32 and rounds each
result once; a GPU rounds the partial sums of its reduction or scan tree, so its result can differ
from this one by the roundings of those partial sums (this one is the more accurate).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from opcheck.triton._patch import Patch, is_patched, mark, parameters, require


def to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values: exact."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns, rounded to nearest even, NaN kept a (quiet) NaN."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(np.asarray(values, dtype=np.float32)), quiet_nan, rounded).astype(np.uint16)


def _interpreter():
    from triton.runtime import interpreter

    return interpreter


def _is_bf16(handle) -> bool:
    import triton.language as tl

    return getattr(getattr(handle, "dtype", None), "scalar", None) == tl.bfloat16


def _widened(handle):
    """A bfloat16 handle as a float32 one (others as they are)."""
    import triton.language as tl

    if not _is_bf16(handle):
        return handle
    return _interpreter().TensorHandle(to_float32(handle.data), tl.float32)


def _narrowed(handle):
    """A float32 result handle as bfloat16, rounded to nearest even (others as they are)."""
    import triton.language as tl

    if np.asarray(handle.data).dtype != np.float32:  # a comparison's booleans stay booleans
        return handle
    return _interpreter().TensorHandle(to_bfloat16(handle.data), tl.bfloat16)


def _in_float32(original, bf16_result: Callable[[tuple], bool]):
    """`original(self, *handles, *rest)` with bfloat16 handles widened and, where `bf16_result` says
    the result is bfloat16, rounded back."""

    def patched(self, *args):
        if not any(_is_handle(a) and _is_bf16(a) for a in args):
            return original(self, *args)
        result = original(self, *(_widened(a) if _is_handle(a) else a for a in args))
        return _narrowed(result) if bf16_result(args) else result

    return mark(patched, wraps=original)


def _is_handle(value) -> bool:
    return hasattr(value, "data") and hasattr(value, "dtype")


def _last_is_bf16(args) -> bool:
    """binary_op(lhs, rhs, op) and ternary_op(a, b, other, op) type their result by an operand."""
    handles = [a for a in args if _is_handle(a)]
    return _is_bf16(handles[-1]) or _is_bf16(handles[0])


def _builder():
    interpreter = _interpreter()
    require(hasattr(interpreter, "InterpreterBuilder"), "triton.runtime.interpreter has no InterpreterBuilder")
    require(hasattr(interpreter, "TensorHandle"), "triton.runtime.interpreter has no TensorHandle")
    return interpreter.InterpreterBuilder


def _replace(owner, name: str, expected: list[str], make) -> tuple:
    """Check that `owner.name` takes `expected`; the replacement to make once every check passed."""
    original = getattr(owner, name, None)
    require(original is not None, f"the interpreter has no {owner.__name__}.{name}")
    if not is_patched(original):
        found = parameters(original)
        require(found == expected, f"{owner.__name__}.{name} takes ({', '.join(found)}), not ({', '.join(expected)})")
    return owner, name, original, make


def _replace_all(*replacements: tuple) -> None:
    """Apply replacements made by _replace: all of them, after all their guards passed, or none."""
    for owner, name, original, make in replacements:
        if not is_patched(original):
            setattr(owner, name, make(original))


def _patch_arithmetic() -> None:
    builder = _builder()
    _replace_all(
        _replace(builder, "binary_op", ["self", "lhs", "rhs", "op"], lambda f: _in_float32(f, _last_is_bf16)),
        _replace(builder, "ternary_op", ["self", "lhs", "rhs", "other", "op"], lambda f: _in_float32(f, _last_is_bf16)),
        _replace(builder, "unary_op", ["self", "arg", "op"], lambda f: _in_float32(f, lambda args: True)),
        _replace(
            builder, "create_fma", ["self", "x", "y", "z"], lambda f: _in_float32(f, lambda args: _is_bf16(args[2]))
        ),
    )


def _patch_dot() -> None:
    builder = _builder()
    expected = ["self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"]
    _replace_all(_replace(builder, "create_dot", expected, lambda f: _in_float32(f, lambda args: _is_bf16(args[2]))))


def _cast(original):
    def cast_impl(self, src, dst_type):
        import triton.language as tl

        to_bf16 = dst_type.scalar == tl.bfloat16
        if not (_is_bf16(src) or to_bf16):
            return original(self, src, dst_type)
        if not to_bf16:
            return original(self, _widened(src), dst_type)
        values = src.data.astype(np.float32) if not _is_bf16(src) else to_float32(src.data)
        return _interpreter().TensorHandle(to_bfloat16(values), tl.bfloat16)

    return mark(cast_impl, wraps=original)


def _fp_to_fp(original):
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        import triton.language as tl

        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float32 and _rounds_to_nearest(rounding_mode):
            return self.cast_impl(src, dst_type)
        return original(self, src, dst_type, rounding_mode)

    return mark(create_fp_to_fp, wraps=original)


def _rounds_to_nearest(rounding_mode) -> bool:
    if rounding_mode is None:
        return True
    from triton._C.libtriton import ir

    return rounding_mode == ir.ROUNDING_MODE.RTNE


def _get_bf16(self, value):
    """A bfloat16 scalar constant (`y + 1.0` with a bfloat16 y), rounded to nearest even: triton 3.2's
    interpreter has no get_bf16 ("'InterpreterBuilder' object has no attribute 'get_bf16'")."""
    import triton.language as tl

    return self.cast_impl(self.get_fp32(value), tl.bfloat16)


def _patch_casts() -> None:
    builder = _builder()
    require(hasattr(builder, "get_fp32"), "InterpreterBuilder has no get_fp32")
    if not hasattr(builder, "get_bf16"):
        builder.get_bf16 = mark(_get_bf16)
    _replace_all(
        _replace(builder, "cast_impl", ["self", "src", "dst_type"], _cast),
        _replace(builder, "create_fp_to_fp", ["self", "src", "dst_type", "rounding_mode"], _fp_to_fp),
    )


def _float32_tensor(t):
    import triton.language as tl

    handle = _interpreter().TensorHandle(to_float32(t.handle.data), tl.float32)
    ty = tl.block_type(tl.float32, list(t.type.shape)) if isinstance(t.type, tl.block_type) else tl.float32
    return tl.core.tensor(handle, ty)


def _bfloat16_tensor(t):
    import triton.language as tl

    if not isinstance(t, tl.core.tensor) or t.dtype.scalar != tl.float32:
        return t
    handle = _interpreter().TensorHandle(to_bfloat16(t.handle.data), tl.bfloat16)
    ty = tl.block_type(tl.bfloat16, list(t.type.shape)) if isinstance(t.type, tl.block_type) else tl.bfloat16
    return tl.core.tensor(handle, ty)


def _reduction(original):
    def reduce(self, input, *rest, **kwargs):
        first = input[0] if isinstance(input, tuple) else input
        if not _is_bf16(first.handle):
            return original(self, input, *rest, **kwargs)
        result = original(self, _float32_tensor(first), *rest, **kwargs)
        if isinstance(result, (tuple, list)):  # argmax's (value, index); a scan's [values]
            return type(result)(_bfloat16_tensor(r) for r in result)
        return _bfloat16_tensor(result)

    return mark(reduce, wraps=original)


def _patch_reductions() -> None:
    interpreter = _interpreter()
    require(hasattr(interpreter, "ReduceOps"), "triton.runtime.interpreter has no ReduceOps")
    reduce_ops = interpreter.ReduceOps
    _replace_all(
        _replace(reduce_ops, "sum", ["self", "input"], _reduction),
        _replace(reduce_ops, "min_max", ["self", "input", "val_reduce_op", "idx_reduce_op"], _reduction),
    )


def _patch_scans() -> None:
    interpreter = _interpreter()
    require(hasattr(interpreter, "ScanOps"), "triton.runtime.interpreter has no ScanOps")
    scan_ops = interpreter.ScanOps
    _replace_all(
        _replace(scan_ops, "cumsum", ["self", "input"], _reduction),
        _replace(scan_ops, "cumprod", ["self", "input"], _reduction),
    )


def _atomic_add(original):
    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        import triton.language as tl
        from triton._C.libtriton import ir

        # Only the add: Triton's language refuses 16-bit floats for the other atomics, on a GPU too.
        if rmwOp != ir.ATOMIC_OP.FADD or not _is_16_bit_float(val):
            return original(self, rmwOp, ptr, val, mask, sem, scope)
        if not _is_bf16(val):
            try:  # triton 3.1's interpreter refuses float16 atomics; later ones add them themselves
                return original(self, rmwOp, ptr, val, mask, sem, scope)
            except ValueError as e:
                if "Unsupported data type" not in str(e):
                    raise
        added = _add_in_place(ptr.data, val.data, mask.data, bf16=_is_bf16(val))
        return _interpreter().TensorHandle(added, tl.bfloat16 if _is_bf16(val) else tl.float16)

    return mark(create_atomic_rmw, wraps=original)


def _is_16_bit_float(handle) -> bool:
    import triton.language as tl

    return getattr(getattr(handle, "dtype", None), "scalar", None) in (tl.bfloat16, tl.float16)


def _add_in_place(addresses: np.ndarray, values: np.ndarray, mask: np.ndarray, bf16: bool) -> np.ndarray:
    """`*address += value` for each unmasked lane, in lane order, each add in float32 rounded to
    nearest even (bfloat16 bits, or float16 values); what each lane found, as an atomic returns it.
    The interpreter runs one program at a time, so lane order is an order a GPU could take (lanes
    adding to one address each see the sum before them)."""
    import ctypes

    shape = np.shape(addresses)
    addresses = np.broadcast_to(addresses, shape).reshape(-1)
    values = np.broadcast_to(values, shape).reshape(-1)
    mask = np.broadcast_to(mask, shape).reshape(-1)
    found = np.zeros(addresses.shape, dtype=np.uint16 if bf16 else np.float16)
    for lane in np.flatnonzero(mask):
        cell = np.ctypeslib.as_array((ctypes.c_uint16 * 1).from_address(int(addresses[lane]))).view(found.dtype)
        found[lane] = cell[0]
        if bf16:
            cell[0] = to_bfloat16(to_float32(cell) + to_float32(values[lane : lane + 1]))[0]
        else:
            cell[0] = (cell.astype(np.float32) + np.float32(values[lane])).astype(np.float16)[0]
    return found.reshape(shape)


def _patch_atomics() -> None:
    builder = _builder()
    expected = ["self", "rmwOp", "ptr", "val", "mask", "sem", "scope"]
    _replace_all(_replace(builder, "create_atomic_rmw", expected, _atomic_add))


PATCHES = (
    Patch(
        "bfloat16 arithmetic",
        "bfloat16 +, -, *, /, comparisons, min/max, where, fma and math functions computed in float32 and "
        "rounded to nearest even (the interpreter ran them on the uint16 bit patterns)",
        _patch_arithmetic,
    ),
    Patch(
        "bfloat16 casts",
        "casts to bfloat16 round to nearest even (the interpreter truncated), casts from bfloat16 read the value, "
        "not the bit pattern",
        _patch_casts,
    ),
    Patch(
        "bfloat16 reductions",
        "tl.sum, tl.max, tl.min, tl.argmax and tl.argmin of bfloat16 accumulate in float32 and round once "
        "(the interpreter reduced the bit patterns)",
        _patch_reductions,
    ),
    Patch(
        "bfloat16 scans",
        "tl.cumsum and tl.cumprod of bfloat16 accumulate in float32 and round each output once "
        "(the interpreter scanned the bit patterns)",
        _patch_scans,
    ),
    Patch(
        "bfloat16 atomics",
        "tl.atomic_add on bfloat16 (and on float16, which triton 3.1's interpreter refused too) adds in float32 "
        "and rounds each sum to nearest even, as a GPU does (the interpreter refused it: 'Unsupported data type')",
        _patch_atomics,
    ),
    Patch(
        "bfloat16 tl.dot",
        "tl.dot of bfloat16 blocks multiplies their values and accumulates in float32, as tensor cores do "
        "(the interpreter multiplied the bit patterns)",
        _patch_dot,
    ),
)
