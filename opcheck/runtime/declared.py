"""What a derivative a spec declares unsupported does, decided in a few calls of the op.

`supports_forward_ad: false` and `supports_gradgrad: false` generate tests that pass while the
derivative raises, comes out all zero (no tangent: a torch.library custom op under forward AD), or
is present but wrong, and fail while it works (the declaration is stale). Telling those four apart
needs one directional derivative, not a Jacobian: the derivative along a random direction, against
central differences along the same direction.

- forward AD: one call under forward AD with a random tangent u on every differentiable input
  gives J·u for every output; two plain calls give (f(x + εu) − f(x − εu)) / 2ε. Compared entry by
  entry. 3 calls of the op.
- double backward: S(x, v) = Re⟨w, VJP(x, v)⟩ for random cotangents v and w (the second derivative
  with respect to the inputs and to the cotangents, as torch's gradgradcheck takes both); one
  backward through the first VJP gives ∂S along u, two evaluations of S at x ± εu its central
  difference. 3 forward calls and 5 backward passes.

The tolerance is the check's atol and rtol, atol scaled by how many entries a projection sums
(Σu, and Σu·Σw for the scalar of double backward), as torch's fast mode scales it. The directions
are drawn, non-negative and of unit norm as torch's fast mode draws them, from a generator seeded
with the test's seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import torch
import torch.autograd.forward_ad as fwAD


class UnsupportedCase(Enum):
    """How a derivative that the spec declares unsupported behaved on one call of the check."""

    RAISED = "raised"  # declared unsupported, and torch says so: pass
    ALL_ZERO = "all zero"  # no derivative where finite differences see one (no tangent, for forward AD): pass
    WRONG = "wrong"  # present but disagrees with finite differences: pass; the declaration takes it out of scope
    WORKS = "works"  # present and right: fail, the declaration is stale


@dataclass(frozen=True)
class UnsupportedOutcome:
    """Which UnsupportedCase held, and one line of evidence for it."""

    case: UnsupportedCase
    detail: str


@dataclass(frozen=True)
class Tolerance:
    """The check's finite-difference step and the entrywise bound |a − n| ≤ atol + rtol·|n|."""

    eps: float
    atol: float
    rtol: float


def forward_ad_outcome(
    fn: Callable[..., object], inputs: Sequence[torch.Tensor], tol: Tolerance, generator: torch.Generator
) -> UnsupportedOutcome:
    """Which case holds for forward-mode AD of `fn` at `inputs` (the tensors it differentiates)."""
    u = [_direction(x, generator) for x in inputs]
    try:
        with fwAD.dual_level():
            duals = [fwAD.make_dual(x.detach(), d) for x, d in zip(inputs, u)]
            analytical = [_tangent(o) for o in _outputs(fn(*duals))]
    except Exception as e:
        return _raised(e)
    numerical = _central(lambda *xs: [o.detach() for o in _outputs(fn(*xs))], inputs, u, tol.eps)
    atol = tol.atol * _total(u)
    return _judge("JVP", analytical, numerical, atol, tol.rtol, "(the outputs carry no tangent, or a zero one)")


def gradgrad_outcome(
    fn: Callable[..., object], inputs: Sequence[torch.Tensor], tol: Tolerance, generator: torch.Generator
) -> UnsupportedOutcome:
    """Which case holds for the second derivative (VJP of VJP) of `fn` at `inputs`."""
    xs = [x.detach().requires_grad_() for x in inputs]
    with torch.enable_grad():
        outs = [o for o in _outputs(fn(*xs)) if o.requires_grad]
    if not outs:
        return UnsupportedOutcome(
            UnsupportedCase.ALL_ZERO, "no output requires grad: there is no first derivative to differentiate"
        )
    vs = [_direction(o, generator).requires_grad_() for o in outs]
    ws = [_direction(x, generator) for x in xs]
    variables = xs + vs
    u = [_direction(t, generator) for t in variables]

    def s(*values: torch.Tensor, create_graph: bool = False) -> torch.Tensor:
        """Re⟨w, VJP(x, v)⟩ at the given inputs and cotangents."""
        points = [t.detach().requires_grad_() for t in values[: len(xs)]]
        cotangents = values[len(xs) :]
        with torch.enable_grad():
            first = [o for o in _outputs(fn(*points)) if o.requires_grad]
            grads = torch.autograd.grad(first, points, cotangents, create_graph=create_graph, allow_unused=True)
        return _inner(ws, grads)

    try:
        with torch.enable_grad():
            grads = torch.autograd.grad(outs, xs, vs, create_graph=True, allow_unused=True)
            scalar = _inner(ws, grads)
            second = (
                torch.autograd.grad(scalar, variables, allow_unused=True)
                if scalar.requires_grad
                else [None] * len(variables)
            )
    except Exception as e:
        return _raised(e)
    analytical = _inner(u, [g if g is None else g.detach() for g in second])
    numerical = _central(lambda *values: [s(*values)], variables, u, tol.eps)[0]
    atol = tol.atol * _total(u) * _total(ws)
    return _judge("VJP of VJP", [analytical], [numerical], atol, tol.rtol, "(backward is not differentiable)")


# -- parts ---------------------------------------------------------------------------------------


def _outputs(result: object) -> list[torch.Tensor]:
    """The floating and complex tensors among the outputs: those a derivative reaches."""
    outs = result if isinstance(result, (tuple, list)) else (result,)
    return [o for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())]


def _direction(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Non-negative entries of unit 2-norm (real and imaginary parts both drawn for complex)."""
    real = like.real if like.is_complex() else like
    draw = torch.rand(real.shape, dtype=real.dtype, generator=generator).to(like.device)
    if like.is_complex():
        draw = torch.complex(draw, torch.rand(real.shape, dtype=real.dtype, generator=generator).to(like.device))
    norm = draw.norm()
    return draw / norm if norm > 0 else draw


def _tangent(out: torch.Tensor) -> torch.Tensor:
    tangent = fwAD.unpack_dual(out).tangent
    primal = fwAD.unpack_dual(out).primal
    return torch.zeros_like(primal) if tangent is None else tangent.detach().clone()


def _central(
    f: Callable[..., list[torch.Tensor]], at: Sequence[torch.Tensor], u: Sequence[torch.Tensor], eps: float
) -> list[torch.Tensor]:
    """(f(x + εu) − f(x − εu)) / 2ε, output by output."""
    with torch.no_grad():
        plus = [x.detach() + eps * d for x, d in zip(at, u)]
        minus = [x.detach() - eps * d for x, d in zip(at, u)]
    high, low = f(*plus), f(*minus)
    return [(h.detach() - lo.detach()) / (2 * eps) for h, lo in zip(high, low)]


def _inner(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Re Σ conj(a)·b over the pairs whose b is there (a real scalar, differentiable where b is)."""
    terms = [(torch.conj(x) * y).real.sum() for x, y in zip(a, b) if y is not None]
    return torch.stack(terms).sum() if terms else torch.zeros((), dtype=torch.float64)


def _total(vectors: Sequence[torch.Tensor]) -> float:
    """Σ|entries|: how many atol's a projection onto these vectors adds up (real and imaginary parts)."""
    return float(sum(torch.view_as_real(v).abs().sum() if v.is_complex() else v.abs().sum() for v in vectors))


def _raised(e: Exception) -> UnsupportedOutcome:
    first = (str(e).strip().splitlines() or [""])[0]
    return UnsupportedOutcome(UnsupportedCase.RAISED, f"{type(e).__name__}: {first}" if first else type(e).__name__)


def _judge(
    path: str,
    analytical: Sequence[torch.Tensor],
    numerical: Sequence[torch.Tensor],
    atol: float,
    rtol: float,
    no_derivative: str,
) -> UnsupportedOutcome:
    """WORKS when every entry agrees within the bound, ALL_ZERO when the analytical side is zero
    within atol where finite differences are not, WRONG otherwise."""
    most, worst, worst_at, worst_bound = 0.0, 0.0, 0, 0.0
    for i, (a, n) in enumerate(zip(analytical, numerical)):
        bound = atol + rtol * n.abs()
        excess = ((a - n).abs() - bound).flatten()
        if excess.numel() and float(excess.max()) > most:
            k = int(excess.argmax())
            most, worst_at = float(excess[k]), i
            worst, worst_bound = float((a - n).abs().flatten()[k]), float(bound.flatten()[k])
    if most == 0.0:
        return UnsupportedOutcome(UnsupportedCase.WORKS, f"the {path} agrees with finite differences")
    a_max = max((float(a.abs().max()) for a in analytical if a.numel()), default=0.0)
    n_max = max((float(n.abs().max()) for n in numerical if n.numel()), default=0.0)
    which = f" of output {worst_at}" if path == "JVP" else ""
    if a_max <= atol < n_max:
        return UnsupportedOutcome(
            UnsupportedCase.ALL_ZERO,
            f"the {path}{which} along a random direction is all zero {no_derivative} while finite differences "
            f"reach {n_max:.4g}",
        )
    return UnsupportedOutcome(
        UnsupportedCase.WRONG,
        f"the {path} is present but disagrees with finite differences along a random direction: "
        f"|analytical - numerical| = {worst:.4g}{which} where {worst_bound:.4g} is allowed",
    )
