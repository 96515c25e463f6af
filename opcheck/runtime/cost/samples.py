"""The probes of one spec's samples, as its tests build them: the function each check differentiates
(the op, or gradgradcheck's first derivative), shared by the checks of the same function, and the
runs of the low-precision check, timed.

Each is probed once per sample: the op's probe serves the first-order checks and, for the draw of
their grad_outputs, the second-order ones. The checks that only run the op (compile,
torch.library.opcheck, the low-precision check's run of the op) take the sample's probe at the first
dtype asked for, and the low-precision check's reference runs are timed there too; all are priced the
same at the other dtypes (the same kernel at another element type: its time is the launch and the
loop over elements, not the dtype; the float64 reference runs are the same runs). A gradient check
keeps a probe per dtype (`timing`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from opcheck.runtime.cost.plan import Calls
from opcheck.runtime.cost.probe import Probe, timed
from opcheck.spec.case import CaseId
from opcheck.spec.model import OpSpec


@dataclass(frozen=True)
class LowprecCost:
    """A low-precision test's runs: their seconds together, their calls, the sample's calls, and the
    slowest run of the op itself at the dtype (what another device would speed up)."""

    seconds: float
    calls: Calls
    sample_calls: int
    op_run: float


@dataclass
class SampleProbes:
    """The probes of one spec's samples, shared by the checks that differentiate the same function
    (gradcheck and forward_ad the op; gradgradcheck and fwgrad_bwgrad its first derivative)."""

    spec: OpSpec
    found: dict[tuple[str, str, str, bool], list[tuple[Probe, Probe | None]]] = field(default_factory=dict)
    lowprec_found: dict[tuple[str, str], list[_LowprecRuns]] = field(default_factory=dict)
    warmed: set[str] = field(default_factory=set)  # what was timed once already: later runs pay no warm-up

    def first(self, what: str) -> bool:
        """Whether this is the first timing of `what` ("op", "low precision") for the spec."""
        seen = what in self.warmed
        self.warmed.add(what)
        return not seen

    def calls(self, case: CaseId) -> list[Any]:
        """The sample's calls (opcheck.runtime.call.SampleCall) as the test builds them."""
        from opcheck.runtime.samples import build_calls

        calls = build_calls(self.spec, self.spec.sample(case.sample), case.device, case.dtype, case.seed())
        return [replace(c, clone_inputs=True) for c in calls] if self.spec.clone_inputs else calls

    def for_check(self, case: CaseId, second_order: bool) -> list[tuple[Probe, Probe | None]]:
        """Per call of the sample, the probe of the function checked and, for a second-order check,
        the probe of the op itself."""
        key = (case.device, case.dtype, case.sample, second_order)
        if key not in self.found:
            found: list[tuple[Probe, Probe | None]] = []
            ops = self.first_order(case) if second_order else [None] * len(self.calls(case))
            for call, op in zip(self.calls(case), ops):
                fn, inputs = call.as_function(), call.gradcheck_inputs()
                if op is None:
                    probe = Probe(fn, inputs, masked=self.spec.gradcheck.masked, first=self.first(case.device))
                    found.append((probe, None))
                else:  # the op's probe is the first-order checks' own
                    found.append((_first_derivative(fn, inputs, case, self.spec), op))
            self.found[key] = found
        return self.found[key]

    def first_order(self, case: CaseId) -> list[Probe]:
        return [p for p, _ in self.for_check(case, second_order=False)]

    def timing(self, case: CaseId) -> list[Probe]:
        """Per call of the sample, a probe whose forward and backward seconds price a run of the op
        at the case's dtype: the sample's probe at any dtype of the same kind (real or complex)
        already made, else the case's own. The checks that only run the op (compile, low precision,
        torch.library.opcheck) share it; a gradient check needs its own dtype's probe (which
        batched evaluations agree with a plain call, whether a JVP agrees with finite differences)."""
        complex_kind = getattr(torch, case.dtype).is_complex
        for (device, dtype, sample, second_order), found in self.found.items():
            if (device, sample, second_order) == (case.device, case.sample, False):
                if getattr(torch, dtype).is_complex == complex_kind:
                    return [p for p, _ in found]
        return self.first_order(case)

    def lowprec(self, case: CaseId) -> LowprecCost:
        """The low-precision test's runs, timed once per sample (at the first dtype asked for)."""
        key = (case.device, case.sample)
        if key not in self.lowprec_found:
            warm_up = self.first(f"low precision {case.device}")
            ops = self.timing(case)
            self.lowprec_found[key] = _lowprec_runs(self.spec, case, self.calls(case), ops, warm_up)
        return _lowprec_cost(self.spec, case, self.lowprec_found[key])


def _first_derivative(fn: Callable[..., Any], inputs: tuple[Any, ...], case: CaseId, spec: OpSpec) -> Probe:
    """The probe of gradgradcheck's function (inputs and grad_outputs → the input gradients)."""
    from opcheck.engine.second_order import first_derivative
    from opcheck.runtime.devices import seed_global

    with torch.random.fork_rng(devices=[]):
        seed_global(case.device, case.seed())
        first = first_derivative(fn, inputs, None, spec.gradgradcheck.gen_non_contig_grad_outputs)
    return Probe(first.func, first.inputs)


PERTURBED = 4
"""The float64 reference's runs at perturbed points (opcheck.engine.lowprec's DEFAULT_PERTURBATIONS)."""


@dataclass(frozen=True)
class _LowprecRuns:
    """One call of a sample, as the low-precision check runs it: the seconds of the op's run at a low
    dtype, of the float64 reference's, and of the reference's with every step rounded."""

    low: float
    reference: float
    emulated: float


def _forward_ad(spec: OpSpec) -> bool:
    return spec.gradcheck.check_forward_ad and spec.supports_forward_ad


def _lowprec_runs(
    spec: OpSpec, case: CaseId, calls: list[Any], ops: list[Probe], warm_up: bool = False
) -> list[_LowprecRuns]:
    """Each run timed once per call (opcheck.engine.lowprec): the op at the dtype (its forward and
    backward from the call's probe in `ops`, which the other checks share), its float64 reference,
    and the reference rounded to the dtype; each run a forward, a backward and, with forward AD, a
    JVP. `warm_up`: the spec's first, timed twice (a kernel's first launch, the first rounded run
    pay a warm-up the test does not)."""
    from opcheck.engine.lowprec.numbers import RoundedTo, upcast
    from opcheck.runtime.devices import reference_device
    from opcheck.spec.oppath import resolve_op

    forward_ad = _forward_ad(spec)
    reference = resolve_op(spec.reference, imports=spec.imports) if spec.reference else None
    ref_device = reference_device(case.device)
    found = []
    for k, (call, op) in enumerate(zip(calls, ops)):
        ref_call = call.map_tensors(lambda t: upcast(t, ref_device))
        if reference is not None:
            ref_call = replace(ref_call, op=reference)
        at_least = 2 if warm_up and k == 0 else 1
        low = op.forward + (op.backward or 0.0)
        if forward_ad:
            low += _run_seconds(call.as_function(), call.gradcheck_inputs(), forward_ad, at_least, plain=False)
        ref = _run_seconds(ref_call.as_function(), ref_call.gradcheck_inputs(), forward_ad, at_least)
        emulated = ref
        with contextlib.suppress(Exception), RoundedTo(getattr(torch, case.dtype)):
            emulated = _run_seconds(ref_call.as_function(), ref_call.gradcheck_inputs(), forward_ad, at_least)
        found.append(_LowprecRuns(low, ref, emulated))
    return found


def _lowprec_cost(spec: OpSpec, case: CaseId, runs: list[_LowprecRuns]) -> LowprecCost:
    """The low-precision check's runs at the case's dtype: the op at the dtype, its float64 reference,
    the reference with every step rounded (once per rounding dtype), and the reference at PERTURBED
    perturbed points."""
    dtype = getattr(torch, case.dtype)
    rounded = len(dict.fromkeys((dtype, torch.complex64 if dtype.is_complex else torch.float32)))
    total = sum(r.low + (1 + PERTURBED) * r.reference + rounded * r.emulated for r in runs)
    op_run = max((r.low for r in runs), default=0.0)
    count = len(runs) * (2 + PERTURBED + rounded)
    calls = Calls(forward=count, backward=count, jvp=count if _forward_ad(spec) else 0)
    return LowprecCost(total, calls, len(runs), op_run)


def _run_seconds(
    fn: Callable[..., Any], inputs: Sequence[Any], forward_ad: bool, at_least: int = 1, plain: bool = True
) -> float:
    """Seconds of one run of the low-precision check: a forward, a backward, a JVP (the best of two);
    without `plain`, the JVP alone."""
    import torch.autograd.forward_ad as fwAD

    diff = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]

    def run() -> None:
        xs = [x.detach().requires_grad_() for x in diff]
        if plain:
            out = fn(*xs)
            outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
            pairs = [o for o in outs if o.requires_grad]
            if pairs and xs:
                torch.autograd.grad(pairs, xs, [torch.ones_like(o) for o in pairs], allow_unused=True)
        if forward_ad and xs:
            with contextlib.suppress(Exception), fwAD.dual_level():
                fn(*[fwAD.make_dual(x.detach(), torch.ones_like(x)) for x in xs])

    _, seconds = timed(run, 2, at_least=at_least)  # a second run only where the first was quick, or warmed up
    return seconds
