"""The low-precision check: an op at float32/float16/bfloat16/complex64 against its own float64 run.

The sample is built once at the low dtype; its float64/complex128 copy holds the very same values
(every low-precision value is exact in double), so any difference is the kernel's rounding, never
the inputs'. Compared, each with the dtype's tolerances (tolerances.LOWPREC_TOLERANCES):

- every output;
- the VJP (gradient of every differentiable input) for one random cotangent, drawn at the low
  dtype from a generator seeded by the case's id (its "cotangent" stream, CaseId.seed);
- with `gradcheck.check_forward_ad`, the JVP of every output for one random tangent.

`lowprec_parts:` rules choose fewer of these per device, dtype and sample (resolve_parts): a
bfloat16 JVP that torch does not implement leaves the output and VJP comparisons in place.

Integer and bool outputs must be equal. On mps the reference runs on the CPU (no float64 there).
A sparse input is upcast in its layout, with its pattern; sparse gradients are compared dense.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.runtime.call import Call
from opcheck.runtime.devices import HIGH_PRECISION, reference_device
from opcheck.runtime.samples import seeded_generator
from opcheck.runtime.tolerances import Tolerances
from opcheck.spec.case import CaseId
from opcheck.spec.model import LOWPREC, LOWPREC_PARTS, LowprecPart, OpSpec

WORST = 5


@dataclass(frozen=True)
class LowPrecisionDiff:
    """One compared quantity that is out of tolerance."""

    path: str  # "output", "VJP", "JVP"
    what: str  # "output 0", "VJP: grad of input 1", ...
    text: str  # the localized report


@dataclass(frozen=True)
class LowPrecisionParts:
    """What one low-precision test compares, and the rule that left the other parts out (if any)."""

    parts: tuple[str, ...]  # of LOWPREC_PARTS, in their order
    dropped: tuple[str, ...] = ()  # parts the spec would compare that the rule leaves out
    rule: str = ""  # where the deciding rule is written, and its reason

    def note(self) -> str | None:
        """`JVP not compared (op_specs/x.yaml:12:5: reason)`, or None when nothing is left out."""
        if not self.dropped:
            return None
        labels = [LowprecPart(p).label for p in self.dropped]
        return f"{' and '.join(labels)} not compared ({self.rule})"


def resolve_parts(spec: OpSpec, device: str, dtype: str, sample: str) -> LowPrecisionParts:
    """The parts compared for one test: the last matching `lowprec_parts` rule, less specific
    rules before more specific ones, then in file order; every part when none matches. The JVP
    needs `gradcheck.check_forward_ad` (and forward AD supported) whatever a rule says."""
    available = tuple(
        p
        for p in LOWPREC_PARTS
        if p != LowprecPart.JVP or (spec.gradcheck.check_forward_ad and spec.supports_forward_ad)
    )
    matching = [
        (rule.where.specificity, i, rule)
        for i, rule in enumerate(spec.lowprec_parts)
        if rule.where.matches(device=device, dtype=dtype, check=LOWPREC, sample=sample)
    ]
    if not matching:
        return LowPrecisionParts(available)
    rule = max(matching, key=lambda m: (m[0], m[1]))[2]
    where = str(rule.location) if rule.location.file else f"{spec.source} lowprec_parts"
    return LowPrecisionParts(
        tuple(p for p in available if p in rule.parts),
        tuple(p for p in available if p not in rule.parts),
        where + (f": {rule.reason}" if rule.reason else ""),
    )


def _is_float(t) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def upcast(t: torch.Tensor, device: str) -> torch.Tensor:
    """The float64/complex128 copy of t on `device`, same strides (a sparse t: the same layout and
    pattern), same requires_grad."""
    dtype = HIGH_PRECISION.get(t.dtype, t.dtype)
    if t.layout != torch.strided:
        return t.detach().to(device=device, dtype=dtype, copy=True).requires_grad_(t.requires_grad)
    out = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=device)
    with torch.no_grad():
        out.copy_(t.detach())
    return out.requires_grad_(t.requires_grad)


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _random_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    real = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1
    if t.is_complex():
        real = torch.complex(real, torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1)
    return real.to(t.dtype).to(t.device)


def compare_lowprec(
    call: Call,
    case: CaseId,
    *,
    attempt: int = 0,
    tolerances: Tolerances,
    check_forward_ad: bool,
    reference_op=None,
    parts: Collection[str] = LOWPREC_PARTS,
) -> LowPrecisionDiff | None:
    """The first quantity out of tolerance, or None when outputs, VJP and JVP all agree.

    Only the `parts` named are compared (the JVP only with check_forward_ad too); the outputs
    are computed whatever they are, the VJP and JVP only when compared.

    `call` is the case's sample drawn on its device and low-precision dtype; the cotangent and the
    tangents come from the case's "cotangent" stream at `attempt`. reference_op: the float64
    implementation to compare with (the spec's `reference`), for kernels that have no float64 path;
    by default the op itself on upcast inputs.
    """
    __tracebackhide__ = True
    ref_device = reference_device(case.device)
    ref_call = call.map_tensors(lambda t: upcast(t, ref_device))
    if reference_op is not None:
        ref_call = replace(ref_call, op=reference_op)
    out_low = _outputs(call.run())
    out_ref = _outputs(ref_call.run())
    if len(out_low) != len(out_ref):
        return LowPrecisionDiff(
            "output", "outputs", f"the low-precision run returned {len(out_low)} outputs, the reference {len(out_ref)}"
        )
    for i, (lo, ref) in enumerate(zip(out_low, out_ref)):
        if LowprecPart.OUTPUT in parts and isinstance(lo, torch.Tensor):
            diff = compare(lo, ref, tolerances, f"output {i}")
            if diff:
                return LowPrecisionDiff("output", f"output {i}", diff)

    inputs_low, inputs_ref = call.gradcheck_inputs(), ref_call.gradcheck_inputs()
    pairs = [
        (lo, ref)
        for lo, ref in zip(out_low, out_ref)
        if isinstance(lo, torch.Tensor) and lo.requires_grad and isinstance(ref, torch.Tensor)
    ]
    gen = seeded_generator(case.seed(attempt, stream="cotangent"))
    if inputs_low and pairs:
        # Drawn even when the VJP is not compared, so the JVP's tangents stay the same.
        cot_low = [_random_like(lo, gen) for lo, _ in pairs]
    if LowprecPart.VJP in parts and inputs_low and pairs:
        cot_ref = [upcast(c, ref_device) for c in cot_low]
        g_low = torch.autograd.grad([p[0] for p in pairs], inputs_low, cot_low, allow_unused=True)
        g_ref = torch.autograd.grad([p[1] for p in pairs], inputs_ref, cot_ref, allow_unused=True)
        vjp_diff = _first_diff("VJP", "VJP: gradient of differentiable input {}", g_low, g_ref, tolerances)
        if vjp_diff:
            return vjp_diff

    if check_forward_ad and LowprecPart.JVP in parts and inputs_low:
        t_low = [_random_like(x, gen) for x in inputs_low]
        t_ref = [upcast(t, ref_device) for t in t_low]
        jvp_low = _jvp(call, inputs_low, t_low)
        jvp_ref = _jvp(ref_call, inputs_ref, t_ref)
        return _first_diff("JVP", "JVP: tangent of output {}", jvp_low, jvp_ref, tolerances)
    return None


def _first_diff(path: str, label: str, lows, refs, tolerances: Tolerances) -> LowPrecisionDiff | None:
    """The first pair (gradients or tangents) out of tolerance, or defined in one run only."""
    for k, (lo, ref) in enumerate(zip(lows, refs)):
        what = label.format(k)
        if (lo is None) != (ref is None):
            return LowPrecisionDiff(
                path, what, f"{what} is None in the {'low-precision' if lo is None else 'reference'} run only"
            )
        if lo is not None:
            diff = compare(lo, ref, tolerances, what)
            if diff:
                return LowPrecisionDiff(path, what, diff)
    return None


def _jvp(call: Call, inputs, tangents) -> list:
    fn = call.as_function()
    with fwAD.dual_level():
        duals = [fwAD.make_dual(x.detach(), t) for x, t in zip(inputs, tangents)]
        outs = _outputs(fn(*duals))
        return [fwAD.unpack_dual(o).tangent if _is_float(o) else None for o in outs]


def compare(low: torch.Tensor, ref: torch.Tensor, tol: Tolerances, what: str) -> str | None:
    """None when |low - ref| <= atol * max(1, max|ref|) + rtol * |ref| everywhere, else a report."""
    if tuple(low.shape) != tuple(ref.shape):
        return f"{what}: shape {tuple(low.shape)} at low precision, {tuple(ref.shape)} in the reference"
    lo = _dense(low.detach().to("cpu"))
    rf = _dense(ref.detach().to("cpu"))
    if not (_is_float(lo) and _is_float(rf)):
        if torch.equal(lo, rf.to(lo.dtype)):
            return None
        wrong = int((lo != rf.to(lo.dtype)).sum())
        return f"{what}: {wrong} of {lo.numel()} entries differ ({lo.dtype} output must match exactly)"
    rf = rf.to(torch.complex128 if rf.is_complex() or lo.is_complex() else torch.float64)
    lo_w = lo.to(rf.dtype)
    if lo.numel() == 0:
        return None
    finite = rf[torch.isfinite(rf)].abs()
    scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
    allowed = tol.atol * scale + tol.rtol * rf.abs()
    diff = (lo_w - rf).abs()
    same = (lo_w == rf) | (torch.isnan(lo_w) & torch.isnan(rf))
    bad = ~((diff <= allowed) | same)
    if not bool(bad.any()):
        return None
    excess = torch.where(bad, torch.nan_to_num(diff - allowed, nan=float("inf")), torch.full_like(diff, -1.0))
    order = torch.argsort(excess.reshape(-1), descending=True)[: min(WORST, int(bad.sum()))]
    lines = [
        f"{what}: {int(bad.sum())} of {bad.numel()} entries differ beyond atol={tol.atol:g} * "
        f"{scale:.4g} (max(1, max|ref|)) + rtol={tol.rtol:g} * |ref| "
        f"(shape {tuple(lo.shape)}, {_name(lo.dtype)} against {_name(rf.dtype)})",
        "worst entries:",
    ]
    for flat in order.tolist():
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), lo.shape)) if lo.dim() else ()
        lines.append(
            f"  [{', '.join(map(str, idx))}]: {_name(lo.dtype)} {_num(lo_w.reshape(-1)[flat])}, "
            f"{_name(rf.dtype)} {_num(rf.reshape(-1)[flat])}, abs err "
            f"{float(diff.reshape(-1)[flat]):.4g}, allowed {float(allowed.reshape(-1)[flat]):.4g}"
        )
    ratio = diff / allowed.clamp_min(1e-300)
    lines.append(f"max |low - ref| / allowed: {float(torch.nan_to_num(ratio, nan=float('inf')).max()):.4g}")
    hint = narrower_dtype_hint(lo, lo_w, rf, bad)
    if hint:
        lines.append(f"hint: {hint}")
    return "\n".join(lines)


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


def _dense(t: torch.Tensor) -> torch.Tensor:
    """Sparse outputs and gradients (of sparse inputs) are compared at every dense position."""
    return t.to_dense() if t.layout != torch.strided else t


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _num(t: torch.Tensor) -> str:
    v = t.item()
    return f"{v.real:.6g}{v.imag:+.6g}j" if isinstance(v, complex) else f"{v:.6g}"
