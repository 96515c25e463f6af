"""What a failing Jacobian block suggests: one cause that explains the whole block, else what the
wrong entries have in common (diagnostics.find_mismatch puts these hints in its report).

Each hypothesis ("analytical = 2 x numerical", "backward ignores grad_output") is tried on a few of
the failing entries before the whole block, and every whole-block question is one pass over it:
a block can hold millions of entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from opcheck.engine._util import allclose_promoted, unravel
from opcheck.engine.reporting.float32 import float32_values
from opcheck.engine.reporting.pattern_hints import index_hint, swapped_input, swapped_message

Shape = tuple[int, ...]

FLOAT32_HINT = (
    "the analytical derivatives at the failing entries are float32 values in a float64 check: {what} "
    "seems to compute in float32, and float32 rounding divided by eps swamps float64 finite differences "
    "(not a kink); check it at float32 and lower against a float64 reference instead"
)

PROBE_ENTRIES = 64
"""How many failing entries a hint's hypothesis is tried on before the whole block (hints_for)."""


def hints_for(
    a: Tensor,
    n: Tensor,
    bad: Tensor,
    *,
    failing: Tensor,
    norms: tuple[float, float],
    rtol: float,
    atol: float,
    input_shape: Shape,
    output_shape: Shape,
    names: tuple[str, str] = ("the input", "the output"),
    input_idx: int = 0,
    numerical_of_inputs: Sequence[Tensor | None] = (),
    forward: bool = False,
) -> tuple[list[str], tuple[int, ...]]:
    """Recognize the common shapes of a wrong gradient: one that explains the whole block, else
    what the wrong entries have in common. Returns the hints, and the other inputs they name (by
    number: the input whose gradient this one is).

    names: the block's (input name, output name); input_idx and numerical_of_inputs (see
    find_mismatch) let a gradient that belongs to another input be recognized. forward: the block
    is a forward-mode (JVP) Jacobian, whose causes differ from backward's (a zero JVP usually means
    no forward-mode formula, not a detached output). failing: the flat indices of bad's entries;
    norms: abs_max of a and of n.
    """
    nonfinite = _nonfinite_hint(*norms)
    if nonfinite:
        return [nonfinite], ()

    # A hypothesis about the whole block ("analytical = 2 x numerical") is first tried on the
    # entries that fail: where it fails there, allclose over the block is False too, and most
    # hypotheses are rejected without a pass over millions of entries. The probe indexes by row
    # and column, so that a view (an expanded column, a transpose) is not copied for it.
    count = failing.numel()
    probe = failing[:PROBE_ENTRIES]
    rows, cols = (probe // bad.shape[1], probe % bad.shape[1]) if bad.dim() == 2 else (None, None)

    def close(x: Tensor, y: Tensor, scale: float | complex | None = None) -> bool:
        """allclose(x, scale * y) (scale: 1 when None)."""
        if rows is not None and x.shape == y.shape == bad.shape and rows.numel():
            xs, ys = x[rows, cols], y[rows, cols]
            if not torch.allclose(xs, ys if scale is None else scale * ys, rtol=rtol, atol=atol):
                return False
        return allclose_promoted(x, y if scale is None else scale * y, rtol, atol)

    if rows is not None and float32_values(a[rows, cols]):
        return [FLOAT32_HINT.format(what="JVP" if forward else "backward")], ()

    swapped = swapped_input(a, input_idx, numerical_of_inputs, close)
    if swapped is not None:
        return [swapped_message(input_idx, swapped)], (swapped,)

    whole = _whole_block_hint(a, n, close, atol, norms, forward=forward)
    if whole:
        return [whole], ()
    hints = []
    if a.is_complex():
        real_ok, imag_ok = close(a.real, n.real), close(a.imag, n.imag)
        if real_ok != imag_ok:
            hints.append(
                f"only the {'imaginary' if real_ok else 'real'} parts disagree: look for a missing "
                "conj() or a dropped or sign-flipped imaginary term"
            )
    related = _related_hint(a, n, close)
    if related:
        return [*hints, related], ()
    return hints + _entry_hints(bad, count, input_shape, output_shape, names), ()


def abs_max(x: Tensor) -> float:
    """max |x| in one pass without a temporary: NaN where x has a NaN, inf where it has an inf."""
    if not x.numel():
        return 0.0
    if x.is_complex():
        return float(torch.linalg.vector_norm(x.reshape(-1), math.inf))
    lo, hi = (float(v) for v in torch.aminmax(x.reshape(-1)))
    return math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi)


def _nonfinite_hint(a_max: float, n_max: float) -> str | None:
    """a_max, n_max: abs_max of the analytical and numerical blocks."""
    if not math.isfinite(a_max):
        return (
            "the analytical Jacobian has NaN or inf entries: backward divides by zero or "
            "evaluates a function outside its domain at this sample"
        )
    if not math.isfinite(n_max):
        return (
            "the numerical Jacobian has NaN or inf entries: the sample sits at or next to a "
            "point where the op is undefined; move the sample away from it"
        )
    return None


def _whole_block_hint(
    a: Tensor,
    n: Tensor,
    close: Callable[..., bool],
    atol: float,
    norms: tuple[float, float],
    *,
    forward: bool = False,
) -> str | None:
    """A cause that explains every entry: a detached output or a missing forward-mode formula, an
    ignored grad_output, a missing conj. norms: max |a| and max |n|."""
    a_norm, n_norm = norms
    if a_norm <= atol and n_norm > atol:
        if forward:
            # torch does not raise for an op without a forward-mode formula that it cannot see
            # (a torch.library custom op): the output just carries no tangent, read as zero.
            return (
                "the JVP is all zero while the numerical derivative is not: the op has no forward-mode "
                "formula or drops the tangent (a torch.library custom op registers no jvp: declare "
                "`supports_forward_ad: false` in its spec, or implement jvp on an autograd.Function "
                "with setup_context), or the output does not depend on this input's tangent "
                "(detached, a non-differentiable op)"
            )
        return (
            "the analytical gradient is all zero while the numerical one is not: the output is "
            "detached from this input (.detach(), .data, no_grad, a non-differentiable op), or "
            "backward returns zeros/None for it"
        )
    if a.shape[1] > 1 and close(a, a[:, :1].expand_as(a)) and not close(n, n[:, :1].expand_as(n)):
        return (
            "every output element gets the same analytical gradient: backward ignores grad_output "
            "(it must return grad_output-weighted derivatives, e.g. grad * f'(x), not f'(x))"
        )
    if n_norm <= atol and a_norm > atol:
        return "the numerical gradient is zero (the output does not depend on this input), yet " + (
            "the JVP is nonzero for it" if forward else "backward returns a nonzero gradient for it"
        )
    if a.is_complex() and (close(a.conj(), n) or close(-a.conj(), n)):
        # For the imaginary part of a complex output, a missing conj shows up with a sign flip too.
        return (
            "analytical ≈ ±conj(numerical): a .conj() is missing in backward (PyTorch's "
            "convention is grad_input = grad_output * conj(df/dz))"
        )
    return None


def _related_hint(a: Tensor, n: Tensor, close: Callable[..., bool]) -> str | None:
    """The analytical block as a simple function of the numerical one: a multiple, or its transpose."""
    scale = _scale(a, n)
    if scale is not None and close(a, n, scale):
        c = complex(scale) if isinstance(scale, complex) else float(scale)
        if isinstance(c, float) and abs(c + 1) < 1e-3:
            return "analytical ≈ -1 × numerical everywhere: the gradient's sign is flipped"
        return (
            f"analytical ≈ {number_text(c)} × numerical everywhere: a constant factor is missing or "
            "extra (a forgotten 2, 1/n or scale)"
        )
    if a.shape[0] == a.shape[1] and a.shape[0] > 1 and close(a, n.t()):
        return (
            "the analytical Jacobian is the transpose of the numerical one: backward multiplies "
            "by a matrix where it should use its transpose (e.g. grad @ W instead of grad @ W.T)"
        )
    return None


def _entry_hints(bad: Tensor, count: int, input_shape: Shape, output_shape: Shape, names: tuple[str, str]) -> list[str]:
    """What the wrong entries (count of them) have in common: a broadcast input's dims, one entry,
    one input or output element, one index of either."""
    hints = []
    dims = _broadcast_dims(input_shape, output_shape)
    if dims:
        hints.append(
            f"this input (shape {shape_text(input_shape)}) is broadcast along output dim(s) "
            f"{', '.join(map(str, dims))} of shape {shape_text(output_shape)}: its gradient must be "
            "summed over exactly those dims; a mismatch here often means it was reduced over the "
            "wrong one"
        )
    if count == 1:
        hints.append("only one entry differs: look for a special case or an off-by-one index in backward")
    elif count:
        rows = bad.any(dim=1)
        if int(rows.sum()) == 1 and bad.shape[0] > 1:
            row = int(rows.nonzero()[0])
            hints.append(f"all wrong entries belong to input element {index_text(unravel(row, input_shape))}")
        cols = bad.any(dim=0)
        if int(cols.sum()) == 1 and bad.shape[1] > 1:
            col = int(cols.nonzero()[0])
            hints.append(f"all wrong entries belong to output element {index_text(unravel(col, output_shape))}")
        shared = index_hint(bad, input_shape, output_shape, names)
        if shared:
            hints.append(shared)
    return hints


def _scale(a: torch.Tensor, n: torch.Tensor) -> float | complex | None:
    """The least-squares c of a ≈ c n (None for 1 or a zero n)."""
    af, nf = a.reshape(-1), n.reshape(-1)
    denom = torch.vdot(nf, nf) if n.is_complex() else torch.dot(nf, nf)
    if float(denom.abs()) == 0.0:
        return None
    num = torch.vdot(nf, af) if n.is_complex() else torch.dot(nf, af)
    c = (num / denom).item()
    if isinstance(c, complex):
        if abs(c.imag) <= 1e-6 * max(1.0, abs(c)):
            c = c.real
        else:
            return c
    if abs(c - 1.0) < 1e-6:
        return None
    return c


def _broadcast_dims(input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> list[int]:
    if not input_shape or len(input_shape) > len(output_shape) or input_shape == output_shape:
        return []
    padded = (1,) * (len(output_shape) - len(input_shape)) + tuple(input_shape)
    if any(i not in (1, o) for i, o in zip(padded, output_shape)):
        return []
    return [d for d, (i, o) in enumerate(zip(padded, output_shape)) if i == 1 and o > 1]


def index_text(idx: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, idx)) + "]"


def shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def number_text(v: complex | float) -> str:
    if isinstance(v, complex):
        return f"{v.real:.6g}{v.imag:+.6g}j"
    return f"{v:.6g}"
