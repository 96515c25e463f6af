"""The probes of one spec's samples, as its tests build them: the function each check differentiates
(the op, or gradgradcheck's first derivative), shared by the checks of the same function, and the
runs of the low-precision check, timed."""

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
    lowprec_found: dict[tuple[str, str, str], LowprecCost] = field(default_factory=dict)

    def calls(self, case: CaseId) -> list[Any]:
        """The sample's calls (opcheck.runtime.call.Call) as the test builds them."""
        from opcheck.runtime.samples import build_calls

        calls = build_calls(self.spec, self.spec.sample(case.sample), case.device, case.dtype, case.seed())
        return [replace(c, clone_inputs=True) for c in calls] if self.spec.clone_inputs else calls

    def for_check(self, case: CaseId, second_order: bool) -> list[tuple[Probe, Probe | None]]:
        """Per call of the sample, the probe of the function checked and, for a second-order check,
        the probe of the op itself."""
        key = (case.device, case.dtype, case.sample, second_order)
        if key not in self.found:
            found: list[tuple[Probe, Probe | None]] = []
            for call in self.calls(case):
                fn, inputs = call.as_function(), call.gradcheck_inputs()
                op = Probe(fn, inputs, masked=self.spec.gradcheck.masked)
                found.append((_first_derivative(fn, inputs, case, self.spec), op) if second_order else (op, None))
            self.found[key] = found
        return self.found[key]

    def first_order(self, case: CaseId) -> list[Probe]:
        return [p for p, _ in self.for_check(case, second_order=False)]

    def lowprec(self, case: CaseId) -> LowprecCost:
        key = (case.device, case.dtype, case.sample)
        if key not in self.lowprec_found:
            self.lowprec_found[key] = _lowprec_cost(self.spec, case, self.calls(case))
        return self.lowprec_found[key]


def _first_derivative(fn: Callable[..., Any], inputs: tuple[Any, ...], case: CaseId, spec: OpSpec) -> Probe:
    """The probe of gradgradcheck's function (inputs and grad_outputs → the input gradients)."""
    from opcheck.engine.second_order import first_derivative

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed())
        first = first_derivative(fn, inputs, None, spec.gradgradcheck.gen_non_contig_grad_outputs)
    return Probe(first.func, first.inputs)


def _lowprec_cost(spec: OpSpec, case: CaseId, calls: list[Any]) -> LowprecCost:
    """The low-precision check's runs (opcheck.engine.lowprec): the op at the dtype, its float64
    reference, the reference with every step rounded (once per rounding dtype), and the reference at
    four perturbed points; each run a forward, a backward and, with forward AD, a JVP."""
    from opcheck.engine.lowprec.numbers import RoundedTo, upcast
    from opcheck.runtime.devices import reference_device
    from opcheck.spec.oppath import resolve_op

    dtype = getattr(torch, case.dtype)
    forward_ad = spec.gradcheck.check_forward_ad and spec.supports_forward_ad
    reference = resolve_op(spec.reference, imports=spec.imports) if spec.reference else None
    ref_device = reference_device(case.device)
    roundings = list(dict.fromkeys((dtype, torch.complex64 if dtype.is_complex else torch.float32)))
    perturbed = 4  # opcheck.engine.lowprec's DEFAULT_PERTURBATIONS
    total, op_run = 0.0, 0.0
    for call in calls:
        ref_call = call.map_tensors(lambda t: upcast(t, ref_device))
        if reference is not None:
            ref_call = replace(ref_call, op=reference)
        low = _run_seconds(call.as_function(), call.gradcheck_inputs(), forward_ad)
        ref = _run_seconds(ref_call.as_function(), ref_call.gradcheck_inputs(), forward_ad)
        emulated = ref
        with contextlib.suppress(Exception), RoundedTo(roundings[0]):
            emulated = _run_seconds(ref_call.as_function(), ref_call.gradcheck_inputs(), forward_ad)
        total += low + (1 + perturbed) * ref + len(roundings) * emulated
        op_run = max(op_run, low)
    runs = len(calls) * (2 + perturbed + len(roundings))
    return LowprecCost(total, Calls(forward=runs, backward=runs, jvp=runs if forward_ad else 0), len(calls), op_run)


def _run_seconds(fn: Callable[..., Any], inputs: Sequence[Any], forward_ad: bool) -> float:
    """Seconds of one run of the low-precision check: a forward, a backward, a JVP (the best of two)."""
    import torch.autograd.forward_ad as fwAD

    diff = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]

    def run() -> None:
        xs = [x.detach().requires_grad_() for x in diff]
        out = fn(*xs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        pairs = [o for o in outs if o.requires_grad]
        if pairs and xs:
            torch.autograd.grad(pairs, xs, [torch.ones_like(o) for o in pairs], allow_unused=True)
        if forward_ad and xs:
            with contextlib.suppress(Exception), fwAD.dual_level():
                fn(*[fwAD.make_dual(x.detach(), torch.ones_like(x)) for x in xs])

    _, seconds = timed(run, 2)
    return seconds
