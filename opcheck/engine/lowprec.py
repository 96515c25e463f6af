"""The low-precision check: an op at float32/float16/bfloat16/complex64 against a float64 reference.

For kernels that run only in low precision, this is the check that decides. The op runs at the low
dtype; the reference (by default the op itself) runs on the float64/complex128 copies of the very
same inputs (every low-precision value is exact in double). Compared, each as its own part:

- every floating output;
- the VJP: the gradient of every input that requires grad, for one random cotangent;
- the JVP (with ``check_forward_ad``): the tangent of every output, for one random tangent.

The calibrated criterion ("baseline", the default) judges each entry of a part by what the same
math achieves at that dtype. With R the float64 result, L the op's, u the dtype's unit roundoff:

    |L - R| <= factor * B + ulp(R) + floor * u * max|R|,   B = max(B_emulated, B_cond, B_round, B_plain)

- B_emulated: the error of the reference run with every step rounded (RoundedTo): once to the
  dtype (plain PyTorch at the dtype, autograd's saved tensors included, each kernel rounding
  exactly once) and once to float32 (what a kernel that computes in float32 achieves);
- B_cond: how far the entry moves when every input (and the cotangent, the tangent) is perturbed by
  a relative u, the most over ``perturbations`` draws: the error a backward-stable computation at
  the dtype may make, which covers accumulation and conditioning;
- B_round: |R rounded to the dtype - R|, what no kernel can beat;
- B_plain (float32 and complex64 only, with a reference other than the op): the reference itself
  run at the dtype, FlashAttention's rule, for where kernels have no wider type to compute in;
- ulp(R): one unit in the last place of R at the dtype (a kernel may round the other way);
- floor * u * max|R|: ``floor`` roundings of the part's largest entry (LOWPREC_FLOORS: 0.5 for
  float16 and bfloat16, whose kernels compute in float32 and round once; 256 for float32 and
  complex64, where a correct kernel's cancellation, p - 1 as p -> 1, x - mean at a large mean,
  costs up to 151 in tests/lowprec).

What it guarantees: an entry fails when its error is more than twice the largest of these
baselines and beyond the floor; the baselines are entrywise, so a relative loss on an entry far
smaller than its tensor's largest shows (at float16 and bfloat16 down to half a rounding of the
largest entry), unlike a tolerance scaled by the tensor's largest entry. What it can miss: an error
below the floor (at float32, 256 roundings of the largest entry); an error the one cotangent or
tangent drawn does not excite; a loss that plain PyTorch at the dtype shares, by the reference's
own steps (a reference written as the naive composite rounds where the naive kernel does); an
accumulation no worse than input rounding (a float32 sum in any order).

The "table" criterion is the former fixed per-dtype tolerance: |L - R| <= atol * max(1, max|R|) +
rtol * |R|.

Kernels may write into their inputs through raw pointers, past autograd's version counter: after
the first call of the op (and of the reference) and after the VJP, every input is compared by
value with its copy from before; a change fails the check with the input named. With
``clone_inputs=True`` every call gets fresh copies instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._python_dispatch import TorchDispatchMode

from opcheck.engine._util import make_dual, unpack_dual

OUTPUT, VJP, JVP = "output", "VJP", "JVP"
PARTS = (OUTPUT, VJP, JVP)
BASELINE, TABLE = "baseline", "table"
CRITERIA = (BASELINE, TABLE)

DEFAULT_FACTOR = 2.0
DEFAULT_PERTURBATIONS = 4
LOWPREC_FLOORS: dict[torch.dtype, float] = {
    # 16-bit kernels compute in float32 and round once. The catalog's torch kernels need at most
    # 0.24; the corpus's subtlest 16-bit mutant (a tail block stored through bfloat16) 1.05.
    torch.float16: 0.5,
    torch.bfloat16: 0.5,
    # A float32 kernel has no wider type inside: the catalog's kernels need up to 59 (a Triton
    # cross-entropy at p -> 1; torch's bicubic interpolate 11), the corpus's correct float32
    # kernels up to 151, its float32 mutants 2.4e3 and more.
    torch.float32: 256.0,
    torch.complex64: 256.0,
}
"""Default `floor`: roundings of a part's largest entry that any entry may carry, per dtype
(benchmarks/bench_lowprec.py prints the floor each catalog test, twin and mutant needs)."""

TABLE_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-4),
    torch.complex64: (1e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
"""(atol, rtol) of the "table" criterion per dtype."""

HIGH = {
    torch.float32: torch.float64,
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.complex64: torch.complex128,
    torch.float64: torch.float64,
    torch.complex128: torch.complex128,
}
WORST = 5


class LowPrecisionError(AssertionError):
    """The low-precision run disagrees with the float64 reference, or the op wrote into its inputs."""

    def __init__(self, message: str, report: LowPrecisionReport | None = None):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Criterion:
    """How a part's entries are judged; see the module docstring."""

    kind: str = BASELINE  # of CRITERIA
    factor: float = DEFAULT_FACTOR
    floor: float | None = None  # None: LOWPREC_FLOORS for the dtype
    atol: float | None = None  # "table" only; None: TABLE_TOLERANCES for the dtype
    rtol: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in CRITERIA:
            raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {self.kind!r}")
        if not self.factor > 0:
            raise ValueError(f"factor must be > 0, got {self.factor!r}")
        if self.floor is not None and not self.floor >= 0:
            raise ValueError(f"floor must be >= 0, got {self.floor!r}")

    def floor_for(self, dtype: torch.dtype) -> float:
        return self.floor if self.floor is not None else LOWPREC_FLOORS.get(dtype, 16.0)

    def table_for(self, dtype: torch.dtype) -> tuple[float, float]:
        atol, rtol = TABLE_TOLERANCES.get(dtype, (1e-5, 1e-4))
        return (self.atol if self.atol is not None else atol, self.rtol if self.rtol is not None else rtol)

    def describe(self, dtype: torch.dtype) -> str:
        if self.kind == TABLE:
            atol, rtol = self.table_for(dtype)
            return f"table: |low - ref| <= atol={atol:g} * max(1, max|ref|) + rtol={rtol:g} * |ref|"
        steps = dict.fromkeys((_name(dtype), _name(_compute_dtype(dtype))))
        return (
            f"baseline: |low - ref| <= factor={self.factor:g} * baseline + ulp(ref) + floor={self.floor_for(dtype):g} "
            f"* u * max|ref|; baseline: the largest of the reference with each step rounded to "
            f"{' / '.join(steps)}, the reference moved by input rounding, ref rounded to {_name(dtype)}"
        )


@dataclass(frozen=True)
class WorstEntry:
    index: tuple[int, ...]
    low: complex | float
    ref: complex | float
    error: float
    baseline: float  # the bound's baseline term (table: the allowed error)
    allowed: float

    @property
    def ratio(self) -> float:
        return self.error / self.allowed if self.allowed > 0 else math.inf


@dataclass(frozen=True)
class PartResult:
    """One compared tensor: an output, one input's gradient (VJP) or one output's tangent (JVP)."""

    path: str  # OUTPUT, VJP or JVP
    what: str  # "output 0", "VJP: gradient of input 1", "JVP: tangent of output 0"
    numel: int
    exceeding: int
    max_ratio: float
    worst: tuple[WorstEntry, ...] = ()
    text: str = ""  # the whole report of a failing part, else ""
    floor_needed: float = 0.0  # the least `floor` with which every entry passes (baseline criterion)

    @property
    def passed(self) -> bool:
        return self.exceeding == 0 and not self.text


@dataclass(frozen=True)
class LowPrecisionReport:
    """What `lowprec_report` compared and found; `error` is None when everything agrees."""

    dtype: torch.dtype
    criterion: Criterion
    parts: tuple[PartResult, ...] = ()
    notes: tuple[str, ...] = ()
    error: LowPrecisionError | None = field(default=None, compare=False)

    @property
    def passed(self) -> bool:
        return self.error is None

    @property
    def first_failure(self) -> PartResult | None:
        return next((p for p in self.parts if not p.passed), None)

    @property
    def message(self) -> str:
        return str(self.error) if self.error is not None else ""


# ------------------------------------------------------------------------------------ public API
def lowprec_check(fn: Callable[..., Any], inputs: Any, **kwargs: Any) -> bool:
    """`lowprec_report`, raising LowPrecisionError on a failure; True otherwise."""
    __tracebackhide__ = True
    report = lowprec_report(fn, inputs, **kwargs)
    if report.error is not None:
        raise report.error
    return True


def lowprec_report(
    fn: Callable[..., Any],
    inputs: Any,
    *,
    dtype: torch.dtype | None = None,
    reference: Callable[..., Any] | None = None,
    plain: Callable[..., Any] | None | str = "reference",
    parts: Sequence[str] = PARTS,
    check_forward_ad: bool = False,
    criterion: Criterion | str = BASELINE,
    factor: float | None = None,
    floor: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    reference_device: torch.device | str | None = None,
    clone_inputs: bool = False,
    generator: torch.Generator | None = None,
    perturbations: int = DEFAULT_PERTURBATIONS,
) -> LowPrecisionReport:
    """Compare fn at a low dtype with a float64 reference, part by part, entry by entry.

    fn: called as fn(*inputs), like torch.autograd.gradcheck's function. inputs: a tensor or a
    tuple; floating tensors are cast to ``dtype`` when given (else used as they are), and the
    VJP/JVP are taken with respect to those that require grad. reference: the float64 implementation,
    called with the float64/complex128 copies (default: fn itself); when given, it is also run at the
    dtype where that dtype is the one kernels compute in (float32, complex64). plain: what is run
    there instead (the same math in plain PyTorch, called with the low-precision inputs), or None
    for nothing. check_forward_ad:
    also compare the JVP. criterion: "baseline" (default) or "table", or a Criterion; factor, floor,
    atol, rtol override its values. generator: draws the cotangent and tangent (default seed 0).
    """
    __tracebackhide__ = True
    crit = _criterion(criterion, factor=factor, floor=floor, atol=atol, rtol=rtol)
    low_inputs = _as_tuple(inputs)
    if dtype is not None:
        low_inputs = tuple(_cast(x, dtype) for x in low_inputs)
    low_dtype = dtype or _low_dtype(low_inputs)
    if low_dtype is None:
        raise ValueError("lowprec_report needs a floating tensor input or dtype=")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    device = reference_device if reference_device is not None else _device_of(low_inputs)
    ref_inputs = tuple(upcast(x, device) if _is_float(x) else x for x in low_inputs)
    ref_fn = reference if reference is not None else fn
    # Where kernels have no wider type to compute in (float32, complex64), plain PyTorch at the
    # dtype is a baseline too (FlashAttention's rule): a separate reference, run at the dtype.
    base_fn = None
    if _compute_dtype(low_dtype) == low_dtype:
        base_fn = reference if plain == "reference" else plain
    if isinstance(base_fn, str):
        raise ValueError(f"plain must be a callable, None or 'reference', got {plain!r}")
    run = _Run(crit, low_dtype, clone_inputs)
    return run.compare(fn, ref_fn, base_fn, low_inputs, ref_inputs, parts, check_forward_ad, generator, perturbations)


def judge(
    low: torch.Tensor,
    ref: torch.Tensor,
    criterion: Criterion | str = BASELINE,
    *,
    what: str = "tensor",
    dtype: torch.dtype | None = None,
    baselines: Sequence[torch.Tensor] = (),
    moved: Sequence[torch.Tensor] = (),
) -> PartResult:
    """Judge one low-precision tensor against its float64 reference by `criterion`.

    baselines: results of the same math at the dtype (their error against ref is the entry's
    baseline); moved: the reference's results on perturbed inputs (B_cond). dtype: the low dtype
    (default: low's). Without baselines and moved values, the baseline criterion is the rounding of
    ref, one ulp and the floor."""
    crit = criterion if isinstance(criterion, Criterion) else Criterion(kind=criterion)
    run = _Run(crit, dtype or low.dtype, clone_inputs=False)
    path = what.split(":")[0] if what.startswith((VJP, JVP)) else OUTPUT
    return run._judge(path, what, low, ref, list(baselines), list(moved))


def _criterion(criterion: Criterion | str, **overrides: float | None) -> Criterion:
    crit = criterion if isinstance(criterion, Criterion) else Criterion(kind=criterion)
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return crit
    values = {"kind": crit.kind, "factor": crit.factor, "floor": crit.floor, "atol": crit.atol, "rtol": crit.rtol}
    values.update(given)
    return Criterion(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ the run
class _InputsChanged(Exception):
    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


@dataclass
class _Run:
    criterion: Criterion
    dtype: torch.dtype
    clone_inputs: bool
    notes: list[str] = field(default_factory=list)

    def compare(
        self,
        fn: Callable[..., Any],
        ref_fn: Callable[..., Any],
        base_fn: Callable[..., Any] | None,
        low_inputs: tuple[Any, ...],
        ref_inputs: tuple[Any, ...],
        parts: Sequence[str],
        check_forward_ad: bool,
        gen: torch.Generator,
        perturbations: int,
    ) -> LowPrecisionReport:
        __tracebackhide__ = True
        diff_low = [i for i, x in enumerate(low_inputs) if _is_float(x) and x.requires_grad]
        want_vjp = VJP in parts and bool(diff_low)
        want_jvp = JVP in parts and check_forward_ad and bool(diff_low)
        drawn: dict[str, list[torch.Tensor]] = {}

        def draw(outs: list[Any]) -> list[torch.Tensor]:
            # Cotangent then tangents, drawn whatever is compared so that each stays the same.
            drawn["cots"] = [_random_like(o, gen) for o in outs if _differentiable(o)] if diff_low else []
            drawn["tans"] = [_random_like(low_inputs[i], gen) for i in diff_low]
            return drawn["cots"]

        call = _cloning(fn) if self.clone_inputs else fn
        ref_call = _cloning(ref_fn) if self.clone_inputs else ref_fn
        ref_device = _device_of(ref_inputs)
        try:
            low = self._guarded(call, low_inputs, diff_low, draw, want_vjp, want_jvp, drawn, "the op")
            up = {k: [upcast(t, ref_device) for t in v] for k, v in drawn.items()}
            ref = self._guarded(
                ref_call, ref_inputs, diff_low, lambda _: up["cots"], want_vjp, want_jvp, up, "the reference"
            )
        except _InputsChanged as e:
            return self._report((), LowPrecisionError(e.text))
        if len(low.outputs) != len(ref.outputs):
            text = f"the low-precision run returned {len(low.outputs)} outputs, the reference {len(ref.outputs)}"
            return self._report((), LowPrecisionError(text))
        base: _Evaluated | None = None
        emulated: list[_Evaluated] = []
        conds: list[_Evaluated] = []
        if self.criterion.kind == BASELINE:
            for rounding in dict.fromkeys((self.dtype, _compute_dtype(self.dtype))):
                try:
                    with RoundedTo(rounding):
                        emulated.append(
                            _evaluate(
                                ref_call,
                                ref_inputs,
                                diff_low,
                                lambda _: up["cots"],
                                want_vjp,
                                up["tans"] if want_jvp else None,
                            )
                        )
                except Exception as e:  # e.g. an op that rejects rounded values: no such baseline then
                    self.notes.append(
                        f"the reference does not run with its steps rounded to {_name(rounding)} "
                        f"({type(e).__name__}: {e}): no baseline from it"
                    )
            pgen = torch.Generator().manual_seed(0x10F)
            u = torch.finfo(self.dtype).eps / 2
            for _ in range(perturbations):
                p_in = tuple(_perturb(x, u, pgen) if _is_float(x) else x for x in ref_inputs)
                p_cots = [_perturb(c, u, pgen) for c in up["cots"]]
                p_tans = [_perturb(t, u, pgen) for t in up["tans"]]
                conds.append(
                    _evaluate(ref_call, p_in, diff_low, _constant(p_cots), want_vjp, p_tans if want_jvp else None)
                )
        names = _part_names(low, parts)
        results = []
        for key, what in names:
            lo, rf = low.get(key), ref.get(key)
            if lo is None and rf is None:
                continue
            if lo is None or rf is None:
                side = "low-precision" if lo is None else "reference"
                results.append(PartResult(key[0], what, 0, 1, math.inf, text=f"{what} is None in the {side} run only"))
                continue
            bs = [b.get(key) for b in ([base] if base is not None else []) + emulated]
            cs = [c.get(key) for c in conds]
            results.append(
                self._judge(key[0], what, lo, rf, [b for b in bs if b is not None], [c for c in cs if c is not None])
            )
        failing = next((r for r in results if not r.passed), None)
        error = LowPrecisionError(self._failure_text(failing, results)) if failing is not None else None
        return self._report(tuple(results), error)

    def _report(self, parts: tuple[PartResult, ...], error: LowPrecisionError | None) -> LowPrecisionReport:
        report = LowPrecisionReport(self.dtype, self.criterion, parts, tuple(self.notes), error)
        if error is not None:
            error.report = report
        return report

    def _guarded(
        self,
        fn: Callable[..., Any],
        inputs: tuple[Any, ...],
        diff: list[int],
        cots: Callable[[list[Any]], list[torch.Tensor]],
        want_vjp: bool,
        want_jvp: bool,
        drawn: dict[str, list[torch.Tensor]],
        who: str,
    ) -> _Evaluated:
        """_evaluate, failing when a call writes into the inputs (compared by value with a copy)."""
        __tracebackhide__ = True
        before = [x.detach().clone() if isinstance(x, torch.Tensor) else None for x in inputs]
        return _evaluate(
            fn,
            inputs,
            diff,
            cots,
            want_vjp,
            lambda: drawn["tans"] if want_jvp else None,
            guard=lambda when: self._unchanged(inputs, before, who, when),
        )

    def _unchanged(self, inputs: tuple[Any, ...], before: list[torch.Tensor | None], who: str, when: str) -> None:
        for k, (x, old) in enumerate(zip(inputs, before)):
            if old is None or not isinstance(x, torch.Tensor):
                continue
            now = x.detach()
            if now.layout != torch.strided:
                now, old = now.to_dense(), old.to_dense()
            same = (now == old) | (torch.isnan(now) & torch.isnan(old)) if _is_float(now) else now == old
            if bool(same.all()):
                continue
            changed = int((~same).sum())
            raise _InputsChanged(
                f"{who} wrote into its input {k} (Tensor{list(x.shape)} {_name(x.dtype)}): {changed} of "
                f"{x.numel()} entries changed by value during its {when}. A kernel that writes into its inputs "
                "through a raw pointer (Triton, CUDA) gets past autograd's version counter, so every later "
                "comparison would read the overwritten values.\nfix: give every call fresh copies "
                "(`clone_inputs: true` in the spec, clone_inputs=True here), or clone inside the op"
            )

    def _judge(
        self,
        path: str,
        what: str,
        low: torch.Tensor,
        ref: torch.Tensor,
        bases: list[torch.Tensor],
        conds: list[torch.Tensor],
    ) -> PartResult:
        if tuple(low.shape) != tuple(ref.shape):
            return PartResult(
                path,
                what,
                0,
                1,
                math.inf,
                text=f"{what}: shape {tuple(low.shape)} at low precision, {tuple(ref.shape)} in the reference",
            )
        lo, rf = _dense(low), _dense(ref)
        if not (_is_float(lo) and _is_float(rf)):
            wrong = int((lo != rf.to(lo.dtype)).sum())
            text = f"{what}: {wrong} of {lo.numel()} entries differ ({lo.dtype} output must match exactly)"
            return PartResult(path, what, lo.numel(), wrong, math.inf if wrong else 0.0, text=text if wrong else "")
        wide = torch.complex128 if rf.is_complex() or lo.is_complex() else torch.float64
        rf, lo_w = rf.to(wide), lo.to(wide)
        if lo.numel() == 0:
            return PartResult(path, what, 0, 0, 0.0)
        err = (lo_w - rf).abs()
        if self.criterion.kind == TABLE:
            atol, rtol = self.criterion.table_for(self.dtype)
            finite = rf[torch.isfinite(rf)].abs()
            scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
            allowed = atol * scale + rtol * rf.abs()
            term = allowed
            floor_needed = 0.0
        else:
            term = _rounding(rf, self.dtype)
            for base in bases:  # a baseline that overflowed or failed says nothing about the entry
                b_err = (_dense(base).to(wide) - rf).abs()
                term = torch.maximum(term, torch.where(torch.isfinite(b_err), b_err, torch.zeros_like(b_err)))
            if conds:
                moved = torch.stack([(_dense(c).to(wide) - rf).abs() for c in conds]).amax(0)
                term = torch.maximum(term, torch.where(torch.isfinite(moved), moved, torch.zeros_like(moved)))
            finite = rf[torch.isfinite(rf)].abs()
            scale = float(finite.max()) if finite.numel() else 0.0
            u = torch.finfo(self.dtype).eps / 2
            entrywise = self.criterion.factor * term + _ulp(rf, self.dtype)
            allowed = entrywise + self.criterion.floor_for(self.dtype) * u * scale
            over = torch.nan_to_num((err - entrywise) / (u * scale) if scale > 0 else err - entrywise, nan=math.inf)
            floor_needed = max(0.0, float(over.max()))
        same = (lo_w == rf) | (torch.isnan(lo_w) & torch.isnan(rf))
        bad = ~((err <= allowed) | same)
        ratio = torch.where(same, torch.zeros_like(err), err / allowed.clamp_min(1e-300))
        ratio = torch.nan_to_num(ratio, nan=math.inf)
        exceeding = int(bad.sum())
        max_ratio = float(ratio.max())
        order = torch.argsort(ratio.reshape(-1), descending=True)[: min(WORST, lo.numel())]
        worst = tuple(
            WorstEntry(
                _unravel(flat, lo.shape),
                _scalar(lo_w.reshape(-1)[flat]),
                _scalar(rf.reshape(-1)[flat]),
                float(err.reshape(-1)[flat]),
                float(term.reshape(-1)[flat]),
                float(allowed.reshape(-1)[flat]),
            )
            for flat in order.tolist()
            if bad.reshape(-1)[flat]
        )
        text = self._part_text(what, lo, rf, bad, worst, max_ratio) if exceeding else ""
        return PartResult(path, what, lo.numel(), exceeding, max_ratio, worst, text, floor_needed)

    def _part_text(self, what, lo, rf, bad, worst, max_ratio) -> str:  # type: ignore[no-untyped-def]
        table = self.criterion.kind == TABLE
        lines = [
            f"{what}: {int(bad.sum())} of {bad.numel()} entries beyond the bound (shape {tuple(lo.shape)}, "
            f"{_name(lo.dtype)} against {_name(rf.dtype)})",
            f"criterion: {self.criterion.describe(self.dtype)}",
            "worst entries (op error / baseline error = how many times what the math loses at this dtype):"
            if not table
            else "worst entries:",
        ]
        for w in worst:
            idx = ", ".join(map(str, w.index))
            if table:
                lines.append(
                    f"  [{idx}]: {_name(lo.dtype)} {_num(w.low)}, {_name(rf.dtype)} {_num(w.ref)}, "
                    f"abs err {w.error:.4g}, allowed {w.allowed:.4g}"
                )
            else:
                times = w.error / w.baseline if w.baseline > 0 else math.inf
                lines.append(
                    f"  [{idx}]: {_name(lo.dtype)} {_num(w.low)}, {_name(rf.dtype)} {_num(w.ref)}, op error "
                    f"{w.error:.4g}, baseline error {w.baseline:.4g} ({times:.3g}x), allowed {w.allowed:.4g}"
                )
        lines.append(f"max error / allowed: {max_ratio:.4g}")
        hint = narrower_dtype_hint(lo, lo.to(rf.dtype), rf, bad)
        if hint:
            lines.append(f"hint: {hint}")
        return "\n".join(lines)

    def _failure_text(self, failing: PartResult, results: list[PartResult]) -> str:
        others = [r for r in results if not r.passed and r is not failing]
        text = failing.text
        if others:
            text += "\nalso beyond the bound: " + ", ".join(f"{r.what} ({r.exceeding} entries)" for r in others)
        passed = [r.what for r in results if r.passed]
        if passed:
            text += "\nwithin the bound: " + ", ".join(passed)
        if self.notes:
            text += "\n" + "\n".join(f"note: {n}" for n in self.notes)
        return text


@dataclass
class _Evaluated:
    outputs: list[Any]
    values: dict[tuple[str, int], torch.Tensor | None]

    def get(self, key: tuple[str, int]) -> torch.Tensor | None:
        return self.values.get(key)


def _evaluate(
    fn: Callable[..., Any],
    inputs: tuple[Any, ...],
    diff: list[int],
    cots: Callable[[list[Any]], list[torch.Tensor]],
    want_vjp: bool,
    tans: list[torch.Tensor] | Callable[[], list[torch.Tensor] | None] | None,
    guard: Callable[[str], None] | None = None,
) -> _Evaluated:
    """The outputs of fn(*inputs), its VJP for cots(outputs) when want_vjp, its JVP for the
    tangents when given; `guard` runs after each call of fn."""
    __tracebackhide__ = True
    xs = list(inputs)
    for i in diff:
        xs[i] = inputs[i].detach().requires_grad_(True)
    outs = _outputs(fn(*xs))
    if guard is not None:
        guard("call")
    cot = cots(outs)
    values: dict[tuple[str, int], torch.Tensor | None] = {}
    for i, o in enumerate(outs):
        if isinstance(o, torch.Tensor) and _is_float(o):
            values[(OUTPUT, i)] = o.detach()
    pairs = [o for o in outs if _differentiable(o)]
    if want_vjp and pairs:
        grads = torch.autograd.grad(pairs, [xs[i] for i in diff], cot[: len(pairs)], allow_unused=True)
        for k, g in enumerate(grads):
            values[(VJP, k)] = None if g is None else g.detach()
        if guard is not None:
            guard("backward (VJP)")
    tangents = tans() if callable(tans) else tans
    if tangents is not None:
        values.update(_jvp(fn, inputs, diff, tangents).values)
        if guard is not None:
            guard("forward-mode call (JVP)")
    return _Evaluated(outs, values)


def _jvp(fn: Callable[..., Any], inputs: tuple[Any, ...], diff: list[int], tans: list[torch.Tensor]) -> _Evaluated:
    __tracebackhide__ = True
    with fwAD.dual_level():
        xs = list(inputs)
        for i, t in zip(diff, tans):
            xs[i] = make_dual(inputs[i].detach(), t)
        outs = _outputs(fn(*xs))
        values: dict[tuple[str, int], torch.Tensor | None] = {}
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and _is_float(o):
                tangent = unpack_dual(o)[1]
                values[(JVP, i)] = None if tangent is None else tangent.detach()
    return _Evaluated(outs, values)


def _part_names(low: _Evaluated, parts: Sequence[str]) -> list[tuple[tuple[str, int], str]]:
    names = []
    for key in low.values:
        path, k = key
        if path not in parts:
            continue
        what = {OUTPUT: f"output {k}", VJP: f"VJP: gradient of input {k}", JVP: f"JVP: tangent of output {k}"}[path]
        names.append((key, what))
    return names


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


def _constant(cots: list[torch.Tensor]) -> Callable[[list[Any]], list[torch.Tensor]]:
    return lambda _: cots


def _cloning(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*xs: Any) -> Any:
        return fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in xs])

    return call


# ------------------------------------------------------------------------------------ numbers
def upcast(t: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """The float64/complex128 copy of t (on `device`), same strides (a sparse t: the same layout
    and pattern), same requires_grad."""
    dtype = HIGH.get(t.dtype, t.dtype)
    device = t.device if device is None else device
    if t.layout != torch.strided:
        return t.detach().to(device=device, dtype=dtype, copy=True).requires_grad_(t.requires_grad)
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
