"""lowprec_report and lowprec_check: the runs of the op, its reference and the baselines, and the
check of the inputs after each call."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import field, replace
from typing import Any

import torch

from opcheck._records import record
from opcheck.engine.lowprec.criterion import (
    BASELINE,
    DEFAULT_PERTURBATIONS,
    JVP,
    OUTPUT,
    PARTS,
    VJP,
    Criterion,
    LowPrecisionError,
    LowPrecisionReport,
    PartResult,
)
from opcheck.engine.lowprec.evaluation import Evaluated, evaluate
from opcheck.engine.lowprec.judge import judge_part
from opcheck.engine.lowprec.numbers import (
    RoundedTo,
    _as_tuple,
    _cast,
    _compute_dtype,
    _device_of,
    _differentiable,
    _is_float,
    _low_dtype,
    _name,
    _perturb,
    _random_like,
    upcast,
)
from opcheck.engine.lowprec.reference import LARGE, SMALL, blind_share, is_blind, not_float64_text
from opcheck.failure_facts import FailureFacts

# ------------------------------------------------------------------------------------ public API
FLOAT32_DTYPES = (torch.float32, torch.complex64)
"""Where a float32 reference lowers the bar to nothing: a failure there, a finding elsewhere."""


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
    keep_dtype: Sequence[int] = (),
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
    writes_grad_outputs: bool = False,
    generator: torch.Generator | None = None,
    perturbations: int = DEFAULT_PERTURBATIONS,
) -> LowPrecisionReport:
    """Compare fn at a low dtype with a float64 reference, part by part, entry by entry.

    fn: called as fn(*inputs), like torch.autograd.gradcheck's function. inputs: a tensor or a
    tuple; floating tensors are cast to ``dtype`` when given (else used as they are), but for the
    positions in ``keep_dtype`` (float32 gates or states beside bfloat16 activations), and the
    VJP/JVP are taken with respect to those that require grad. Every entry is judged at ``dtype``
    (default: the first floating input's). reference: the float64 implementation,
    called with the float64/complex128 copies (default: fn itself); when given, it is also run at the
    dtype where that dtype is the one kernels compute in (float32, complex64). plain: what is run
    there instead (the same math in plain PyTorch, called with the low-precision inputs), or None
    for nothing. check_forward_ad:
    also compare the JVP. criterion: "baseline" (default) or "table", or a Criterion; factor, floor,
    atol, rtol override its values. generator: draws the cotangent and tangent (default seed 0).
    writes_grad_outputs: the op's backward writes into its grad_output (or its forward-AD rule into
    its tangent) on purpose: reported as a finding, not a failure.
    """
    __tracebackhide__ = True
    crit = _criterion(criterion, factor=factor, floor=floor, atol=atol, rtol=rtol)
    low_inputs = _as_tuple(inputs)
    if dtype is not None:
        low_inputs = tuple(x if k in keep_dtype else _cast(x, dtype) for k, x in enumerate(low_inputs))
    low_dtype = dtype or _low_dtype(low_inputs)
    if low_dtype is None:
        raise ValueError("lowprec_report needs a floating tensor input or dtype=")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    device = reference_device if reference_device is not None else _device_of(low_inputs)
    ref_inputs = _upcast_all(low_inputs, device)
    ref_fn = reference if reference is not None else fn
    # Where kernels have no wider type to compute in (float32, complex64), plain PyTorch at the
    # dtype is a baseline too (FlashAttention's rule): a separate reference, run at the dtype.
    base_fn = None
    if _compute_dtype(low_dtype) == low_dtype:
        base_fn = reference if plain == "reference" else plain
    if isinstance(base_fn, str):
        raise ValueError(f"plain must be a callable, None or 'reference', got {plain!r}")
    run = _Run(crit, low_dtype, clone_inputs, writes_grad_outputs)
    return run.compare(fn, ref_fn, base_fn, low_inputs, ref_inputs, parts, check_forward_ad, generator, perturbations)


def _upcast_all(inputs: tuple[Any, ...], device: torch.device | str) -> tuple[Any, ...]:
    """The float64 copies of the floating inputs; the same tensor passed twice stays one tensor in
    the reference's call, as it is in the op's."""
    done: dict[int, Any] = {}
    for x in inputs:
        if _is_float(x) and id(x) not in done:
            done[id(x)] = upcast(x, device)
    return tuple(done.get(id(x), x) for x in inputs)


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
    path = what.split(":")[0] if what.startswith((VJP, JVP)) else OUTPUT
    return judge_part(crit, dtype or low.dtype, path, what, low, ref, list(baselines), list(moved))


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


@record(frozen=False)
class _Run:
    criterion: Criterion
    dtype: torch.dtype
    clone_inputs: bool
    writes_grad_outputs: bool = False
    notes: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)  # what the op's backward / forward AD wrote into
    findings: list[str] = field(default_factory=list)

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
            return self._report((), LowPrecisionError(e.text), inputs_written=True, failure="inputs")
        if len(low.outputs) != len(ref.outputs):
            text = f"the low-precision run returned {len(low.outputs)} outputs, the reference {len(ref.outputs)}"
            return self._report((), LowPrecisionError(text))
        base: Evaluated | None = None
        emulated: list[Evaluated] = []
        conds: list[Evaluated] = []
        if self.criterion.kind == BASELINE:
            for rounding in dict.fromkeys((self.dtype, _compute_dtype(self.dtype))):
                try:
                    with RoundedTo(rounding):
                        emulated.append(
                            evaluate(
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
                    evaluate(ref_call, p_in, diff_low, _constant(p_cots), want_vjp, p_tans if want_jvp else None)
                )
        names = _part_names(low, parts)
        results = []
        for key, what in names:
            lo, rf = low.get(key), ref.get(key)
            if lo is None and rf is None:
                continue
            if lo is None or rf is None:
                side = "low-precision" if lo is None else "reference"
                text = f"{what} is None in the {side} run only"
                vjp_input = key[1] if key[0] == VJP else None
                results.append(PartResult(key[0], what, 0, 1, math.inf, text=text, input=vjp_input))
                continue
            bs = [b.get(key) for b in ([base] if base is not None else []) + emulated]
            cs = [c.get(key) for c in conds]
            judged = judge_part(
                self.criterion,
                self.dtype,
                key[0],
                what,
                lo,
                rf,
                [b for b in bs if b is not None],
                [c for c in cs if c is not None],
            )
            results.append(replace(judged, input=key[1]) if key[0] == VJP else judged)
        failing = next((r for r in results if not r.passed), None)
        facts = _facts(results)
        error = LowPrecisionError(self._failure_text(failing, results), facts=facts) if failing is not None else None
        failure = ""
        reference_text = self._reference_precision(ref_call, ref_inputs, diff_low, up["cots"], want_vjp, ref, names)
        if reference_text is not None and self.dtype in FLOAT32_DTYPES:
            error = LowPrecisionError(self._finding_text(reference_text, results), facts=facts)
            failure = "reference"
        elif reference_text is not None:
            self.findings.append(reference_text)
        if self.written:
            text = _written_text(self.written, self.writes_grad_outputs)
            if self.writes_grad_outputs:
                self.findings.append(text)
            else:  # first: the values are right only because each call got its own copy
                error, failure = LowPrecisionError(self._finding_text(text, results), facts=facts), "grad_outputs"
        if error is not None and self.findings:
            error = LowPrecisionError(str(error) + "".join(f"\nnote: {f}" for f in self.findings), facts=error.facts)
        return self._report(tuple(results), error, reference_not_float64=reference_text is not None, failure=failure)

    def _report(
        self,
        parts: tuple[PartResult, ...],
        error: LowPrecisionError | None,
        inputs_written: bool = False,
        reference_not_float64: bool = False,
        failure: str = "",
    ) -> LowPrecisionReport:
        report = LowPrecisionReport(
            self.dtype,
            self.criterion,
            parts,
            tuple(self.notes),
            error,
            inputs_written,
            tuple(self.written),
            reference_not_float64,
            tuple(self.findings),
            failure,
        )
        if error is not None:
            error.report = report
        return report

    def _reference_precision(
        self,
        ref_call: Callable[..., Any],
        ref_inputs: tuple[Any, ...],
        diff: list[int],
        cots: list[torch.Tensor],
        want_vjp: bool,
        ref: Evaluated,
        names: list[tuple[tuple[str, int], str]],
    ) -> str | None:
        """The finding when the reference computes in float32 or narrower inside (see
        opcheck.engine.lowprec.reference), else None: one more run of the reference (no JVP), and a
        second only when the first leaves enough entries unchanged (a float64 reference moves)."""
        gen = torch.Generator().manual_seed(0x3E7)

        def moved(size: float) -> Evaluated | None:
            p_in = tuple(_perturb(x, size, gen) if _is_float(x) else x for x in ref_inputs)
            p_cots = [_perturb(c, size, gen) for c in cots]
            try:
                return evaluate(ref_call, p_in, diff, _constant(p_cots), want_vjp, None)
            except Exception as e:  # a reference that rejects moved inputs: nothing measured
                self.notes.append(f"the reference's precision was not measured ({type(e).__name__}: {e})")
                return None

        def counted(small: Evaluated, large: Evaluated | None) -> list[tuple[str, int, int]]:
            found = []
            for key, what in names:
                b, s = ref.get(key), small.get(key)
                if key[0] != JVP and b is not None and s is not None:
                    found.append((what, *blind_share(b, s, None if large is None else large.get(key))))
            return found

        small = moved(SMALL)
        # The entries SMALL leaves unchanged bound the blind ones: too few, and LARGE need not run.
        if small is None or not is_blind(*_totals(counted(small, None))):
            return None
        large = moved(LARGE)
        if large is None:
            return None
        found = counted(small, large)
        blind, total = _totals(found)
        if not is_blind(blind, total):
            return None
        whats = ", ".join(what for what, b, _ in found if b)
        return not_float64_text("the reference", whats, blind, total, self.dtype in FLOAT32_DTYPES)

    def _finding_text(self, text: str, results: list[PartResult]) -> str:
        """A failure that is not about values: its text, then how the values compared."""
        failing = [r for r in results if not r.passed]
        if failing:
            text += "\nvalues beyond the bound as well:\n" + self._failure_text(failing[0], results)
        else:
            passed = [r.what for r in results]
            if passed:
                text += "\nwithin the bound: " + ", ".join(passed)
            if self.notes:
                text += "\n" + "\n".join(f"note: {n}" for n in self.notes)
        return text

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
    ) -> Evaluated:
        """_evaluate, failing when a call writes into the inputs (compared by value with a copy)."""
        __tracebackhide__ = True
        before = [x.detach().clone() if isinstance(x, torch.Tensor) else None for x in inputs]
        return evaluate(
            fn,
            inputs,
            diff,
            cots,
            want_vjp,
            lambda: drawn["tans"] if want_jvp else None,
            guard=lambda when: self._unchanged(inputs, before, who, when),
            written=self.written if who == "the op" else None,
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


def _facts(results: list[PartResult]) -> FailureFacts:
    """What a report of these parts names: the first failing part's worst entry and hints, and the
    inputs whose gradients it lists (failing or within the bound)."""
    failing = next((r for r in results if not r.passed), None)
    worst = f"{failing.what}, {failing.first_entry}" if failing is not None and failing.first_entry else ""
    inputs = tuple(r.input for r in results if r.input is not None)
    return FailureFacts(worst=worst, hints=failing.hints if failing is not None else (), inputs=inputs)


def _part_names(low: Evaluated, parts: Sequence[str]) -> list[tuple[tuple[str, int], str]]:
    names = []
    for key in low.values:
        path, k = key
        if path not in parts:
            continue
        what = {OUTPUT: f"output {k}", VJP: f"VJP: gradient of input {k}", JVP: f"JVP: tangent of output {k}"}[path]
        names.append((key, what))
    return names


def _totals(found: list[tuple[str, int, int]]) -> tuple[int, int]:
    return sum(f[1] for f in found), sum(f[2] for f in found)


def _written_text(written: list[str], declared: bool) -> str:
    """What the op's backward or forward-AD rule wrote into, why it matters, and the key that declares it."""
    what = "; ".join(written)
    if declared:
        return (
            f"the op writes into what autograd hands it: {what}, declared intended "
            "(writes_grad_outputs); every call here got its own copy, and the values compare as shown"
        )
    why = []
    if any(w.startswith("the grad_output") for w in written):
        why.append(
            "autograd may hand the same gradient tensor to other consumers (both inputs of an add, the "
            "grad_outputs a caller passed to backward), whose gradients the write then changes"
        )
    if any(w.startswith("the tangent") for w in written):
        why.append(
            "forward AD hands an input's tangent to every op that reads the input, and the caller keeps it "
            "(the tangent given to make_dual), so the write changes their tangents"
        )
    reason = "; ".join(why)
    return (
        f"the op writes into what autograd hands it: {what}. {reason[0].upper()}{reason[1:]}. Every call here "
        "got its own copy, so the values below compare as if it did not write.\nfix: write the result into a new "
        "tensor (or clone the grad_output or tangent first), or, where no caller shares that gradient, "
        "declare the write: `writes_grad_outputs: true` in the spec (writes_grad_outputs=True here)"
    )


def _constant(cots: list[torch.Tensor]) -> Callable[[list[Any]], list[torch.Tensor]]:
    return lambda _: cots


def _cloning(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*xs: Any) -> Any:
        return fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in xs])

    return call
