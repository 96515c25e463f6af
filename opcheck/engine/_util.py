"""Small tensor helpers shared by the engine's modules."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch.overrides import is_tensor_like


def as_tuple(x: Any) -> tuple:
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def is_float_or_complex(obj: Any) -> bool:
    return is_tensor_like(obj) and (obj.is_floating_point() or obj.is_complex())


def requires_grad(obj: Any) -> bool:
    return is_tensor_like(obj) and obj.requires_grad


def differentiable_outputs(x: Any) -> tuple[torch.Tensor, ...]:
    # Same filter as torch: a non-tensor output raises AttributeError here, as it does there.
    return tuple(o for o in as_tuple(x) if o.requires_grad)


def diff_input_indices(inputs: tuple) -> list[int]:
    return [i for i, a in enumerate(inputs) if requires_grad(a)]


SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
MKLDNN = torch._mkldnn  # type: ignore[attr-defined]


def _strided_content(inp: torch.Tensor) -> torch.Tensor | None:
    """What torch's stride-0 test looks at: the values of a sparse input, nothing of an MKLDNN one."""
    if inp.layout == MKLDNN:
        return None
    if inp.layout == torch.sparse_coo:
        return inp._values()
    if inp.layout in SPARSE_LAYOUTS:
        return inp.values()
    return inp


def check_inputs(inputs: tuple) -> None:
    """Validate gradcheck inputs the way torch does, with advice where torch has none.

    Of a sparse input torch looks at its values' strides, of an MKLDNN input at none.
    """
    found = False
    for idx, inp in enumerate(inputs):
        if not requires_grad(inp):
            continue
        if inp.dtype not in (torch.float64, torch.complex128):
            warnings.warn(
                f"Input #{idx} requires gradient and is not a double precision floating point or complex. "
                "This check will likely fail if all the inputs are not of double precision floating point "
                f"or complex. (It is {inp.dtype}: finite differences with eps=1e-6 lose most of its digits. "
                "Check gradients in float64/complex128, and cover the low-precision kernel with a "
                "consistency check against the float64 result instead.)",
                stacklevel=4,
            )
        content = _strided_content(inp)
        found = True
        if content is None:
            continue
        if not all(st > 0 or sz <= 1 for st, sz in zip(content.stride(), content.size())):
            raise RuntimeError(
                f"The {idx}th input has a dimension with stride 0. gradcheck only supports inputs that "
                "are non-overlapping to be able to compute the numerical gradients correctly. You should "
                "call .contiguous on the input before passing it to gradcheck. (Perturbing one element of "
                f"a tensor with strides {tuple(content.stride())} moves every element that shares its memory.)"
            )
        if has_internal_overlap(content):
            raise RuntimeError(
                f"The {idx}th input has overlapping memory (shape {tuple(content.shape)}, strides "
                f"{tuple(content.stride())}): perturbing one element would move others too. "
                "Call .contiguous() on it before passing it to gradcheck."
            )
    if not found:
        raise ValueError(
            "gradcheck expects at least one input tensor to require gradient, "
            "but none of them have requires_grad=True."
        )


def has_internal_overlap(t: torch.Tensor) -> bool:
    """True when two different indices of a strided tensor certainly address the same memory."""
    # torch's own test (used to refuse in-place writes): 0 = no overlap, 1 = overlap, 2 = too hard to tell.
    return t.numel() > 1 and torch._debug_has_internal_overlap(t) == 1


def exception_line(e: BaseException) -> str:
    """`TypeName: first line of the message`, for one-line reasons."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def check_outputs(outputs: tuple) -> None:
    """torch's output check (sparse first, then MKLDNN, with its words); other layouts after it."""
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    advice = "Please call to_dense(masked_grad=...) on the output of fn for gradcheck."
    if any(t.layout in SPARSE_LAYOUTS for t in tensors):
        raise ValueError(f"Sparse output is not supported at gradcheck yet. {advice}")
    if any(t.layout == MKLDNN for t in tensors):
        raise ValueError(f"MKLDNN output is not supported at gradcheck yet. {advice}")
    for t in tensors:
        if t.layout != torch.strided:
            raise ValueError(f"Output with layout {t.layout} is not supported at gradcheck yet. {advice}")


def unravel(k: int, shape) -> tuple[int, ...]:
    """Multi-index of flat (row-major) position k in a tensor of this shape."""
    out = []
    for size in reversed(tuple(shape)):
        out.append(k % size)
        k //= size
    return tuple(reversed(out))


def make_duals(inputs) -> tuple[list, dict[int, torch.Tensor]]:
    """Dual copies of the inputs that require grad, with zero tangents to write into.

    Call inside fwAD.dual_level(). Returns the argument list and {input index: tangent}.
    """
    duals, tangents = [], {}
    for i, a in enumerate(inputs):
        if requires_grad(a):
            a = fwAD.make_dual(a.detach(), torch.zeros_like(a))
            # A differentiable view may not keep the tangent object given to make_dual: read it back.
            tangents[i] = fwAD.unpack_dual(a)[1]
        duals.append(a)
    return duals, tangents
