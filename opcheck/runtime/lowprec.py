"""The low-precision test of one case: its parts, criterion and switches, then the engine's check.

The sample is built once at the low dtype; its float64/complex128 copy holds the very same values
(every low-precision value is exact in double), so any difference is the kernel's rounding, never
the inputs'. The engine (opcheck.engine.lowprec) compares the outputs, the VJP for one cotangent
and, with `gradcheck.check_forward_ad`, the JVP for one tangent, drawn at the low dtype from a
generator seeded by the case's id (its "cotangent" stream, CaseId.seed), entry by entry, by the
criterion the spec's `tolerances:` rules resolve (tolerances.resolve_lowprec_criterion).

`lowprec_parts:` rules choose fewer parts per device, dtype and sample (resolve_parts): a
bfloat16 JVP that torch does not implement leaves the output and VJP comparisons in place.

The reference is the op itself on the upcast copy, or the spec's `reference:`; on mps it runs on
the CPU (no float64 there). A sparse input is upcast in its layout, with its pattern; sparse
gradients are compared dense. Integer and bool outputs must be equal.

A backward that writes into its grad_output (or a forward-AD rule into its tangent) fails the
test unless the spec declares it (`writes_grad_outputs: true`); a reference that computes in
float32 fails the float32 test. What a passing test found all the same goes to `on_finding`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import torch

from opcheck.engine.lowprec import (
    TABLE,
    Criterion,
    LowPrecisionReport,
    judge,
    lowprec_report,
    narrower_dtype_hint,
    upcast,
)
from opcheck.failure_facts import FailureFacts
from opcheck.runtime.call import SampleCall
from opcheck.runtime.devices import reference_device
from opcheck.runtime.input_names import gradcheck_input_names, with_spec_names
from opcheck.runtime.margins import note_lowprec_margin
from opcheck.runtime.samples import seeded_generator
from opcheck.runtime.tolerances import Tolerances
from opcheck.spec.case import CaseId
from opcheck.spec.model import LOWPREC, LOWPREC_PARTS, LowprecPart, OpSpec

__all__ = [
    "LowPrecisionDiff",
    "LowPrecisionParts",
    "case_report",
    "compare",
    "compare_lowprec",
    "narrower_dtype_hint",
    "upcast",
]


@dataclass(frozen=True)
class LowPrecisionDiff:
    """One compared quantity beyond the criterion's bound (or an input the op wrote into)."""

    path: str  # "output", "VJP", "JVP", "inputs", "grad_outputs" or "reference"
    what: str  # "output 0", "VJP: gradient of input 1", ...
    text: str  # the localized report
    facts: FailureFacts = FailureFacts()  # what the engine's report names, as values


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


ENGINE_PARTS = {LowprecPart.OUTPUT.value: "output", LowprecPart.VJP.value: "VJP", LowprecPart.JVP.value: "JVP"}


def compare_lowprec(
    call: SampleCall,
    case: CaseId,
    *,
    attempt: int = 0,
    criterion: Criterion | None = None,
    tolerances: Tolerances | None = None,
    check_forward_ad: bool,
    reference_op=None,
    parts: Collection[str] = LOWPREC_PARTS,
    clone_inputs: bool = False,
    writes_grad_outputs: bool = False,
    on_finding: Callable[[str], None] | None = None,
) -> LowPrecisionDiff | None:
    """The first quantity beyond the criterion's bound, or None when outputs, VJP and JVP all agree.

    criterion: the engine's Criterion (default: "baseline" with its defaults; `tolerances` alone
    selects the table with those atol/rtol). on_finding: told what a passing comparison found all
    the same (a declared write into grad_output, a float32 reference at float16). The rest as for
    case_report.
    """
    __tracebackhide__ = True
    if criterion is None:
        criterion = Criterion(TABLE, atol=tolerances.atol, rtol=tolerances.rtol) if tolerances else Criterion()
    report = case_report(
        call,
        case,
        criterion,
        attempt=attempt,
        check_forward_ad=check_forward_ad,
        reference_op=reference_op,
        parts=parts,
        clone_inputs=clone_inputs,
        writes_grad_outputs=writes_grad_outputs,
    )
    if report.error is None:
        note_lowprec_margin(report)
        if on_finding is not None:
            for finding in report.findings:
                on_finding(finding)
        return None
    if report.failure:  # an input or a grad_output written into, a reference that is not float64
        who = "the reference" if report.failure == "reference" else "the op"
        return LowPrecisionDiff(report.failure, who, report.message, report.error.facts)
    failing = report.first_failure
    if failing is None:  # outputs that do not pair up
        return LowPrecisionDiff("output", "the op", report.message, report.error.facts)
    names = gradcheck_input_names(call.args, call.kwargs)
    text = with_spec_names(report.message, report.error.facts.inputs, names)
    return LowPrecisionDiff(failing.path, failing.what, text, report.error.facts)


def case_report(
    call: SampleCall,
    case: CaseId,
    criterion: Criterion,
    *,
    attempt: int = 0,
    check_forward_ad: bool,
    reference_op=None,
    parts: Collection[str] = LOWPREC_PARTS,
    clone_inputs: bool = False,
    writes_grad_outputs: bool = False,
) -> LowPrecisionReport:
    """The engine's report on one call of a case: `call` is the case's sample drawn on its device
    and low-precision dtype. reference_op: the float64 implementation to compare with (the spec's
    `reference`), for kernels that have no float64 path; by default the op itself on upcast inputs.
    clone_inputs: every call gets fresh copies of the inputs (the call's own setting also does).
    writes_grad_outputs: the op's backward writes into its grad_output on purpose (the spec's
    `writes_grad_outputs`): a finding, not a failure."""
    __tracebackhide__ = True
    ref_device = reference_device(case.device)
    ref_call = call.map_tensors(lambda t: upcast(t, ref_device))
    plain = None
    if reference_op is not None:
        ref_call = replace(ref_call, op=reference_op)
        plain = replace(call, op=reference_op).as_function()
    return lowprec_report(
        call.as_function(),
        call.gradcheck_inputs(),
        reference=ref_call.as_function(),
        plain=plain,
        parts=tuple(ENGINE_PARTS[p] for p in parts),
        check_forward_ad=check_forward_ad,
        criterion=criterion,
        reference_device=ref_device,
        clone_inputs=clone_inputs,
        writes_grad_outputs=writes_grad_outputs,
        generator=seeded_generator(case.seed(attempt, stream="cotangent")),
        dtype=getattr(torch, case.dtype),
        keep_dtype=_kept(call, case.dtype),
    )


def _kept(call: SampleCall, dtype: str) -> tuple[int, ...]:
    """The inputs built at a dtype of their own (`lowprec_dtype`, or a fixed `dtype`), which the
    engine leaves as they are while it judges every entry at the test's dtype."""
    test = getattr(torch, dtype)
    return tuple(
        k
        for k, x in enumerate(call.gradcheck_inputs())
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and x.dtype != test
    )


def compare(low: torch.Tensor, ref: torch.Tensor, tol: Tolerances, what: str) -> str | None:
    """The table criterion on one tensor: None when |low - ref| <= atol * max(1, max|ref|) +
    rtol * |ref| everywhere, else its report."""
    part = judge(low, ref, Criterion(TABLE, atol=tol.atol, rtol=tol.rtol), what=what)
    return part.text or None
