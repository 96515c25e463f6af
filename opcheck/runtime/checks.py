"""run_check: one generated test = one (spec, check kind, device, dtype, sample).

Check kinds and the engine call each makes (flags from the spec, tolerances from tolerances.py,
fast_mode from policy.py: True, False, or "auto" with the run's jacobian_budget; every call gets
`gradcheck.masked`, which only matters for sparse inputs):

- gradcheck: gradcheck(check_backward_ad=True, check_forward_ad=False, check_batched_grad, ...)
- forward_ad: gradcheck(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad)
- gradgradcheck: gradgradcheck(rev over rev, gradgradcheck.check_batched_grad, gen_non_contig_grad_outputs)
- fwgrad_bwgrad: gradgradcheck(check_fwd_over_rev=True, check_rev_over_rev=False,
  check_undefined_grad=False, check_batched_grad=False)
- gradgrad_unsupported / forward_ad_unsupported: the check above, whose outcome is one of
  UnsupportedCase: it raises (anything), or its derivative is all zero where finite differences are
  not (forward AD: the outputs carry no tangent, as a torch.library custom op's do), or it disagrees
  with finite differences otherwise; each passes and the test's report says which held. Only a
  derivative that passes the check fails the test
- library_opcheck: torch.library.opcheck on torch.ops.* overloads and torch.library custom ops
- compile: compiled.py (the op under torch.compile against eager)
- lowprec: lowprec.py

A failing finite-difference check whose numerical Jacobian changes when eps is halved sat next
to a kink (|x| at 0, max at a tie): the sample is re-drawn with a seed derived from the id and the
attempt, at most MAX_REDRAWS times, and a pass after a re-draw is announced (stdout, a warning,
and the report's user_properties), never silent.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import torch

import opcheck.engine as engine
from opcheck.engine._util import load_forward_ad_decompositions
from opcheck.engine.errors import GradcheckError
from opcheck.engine.margins import recording_margins
from opcheck.engine.reporting.float32 import float32_evidence
from opcheck.failure_facts import facts_of, hint_lines
from opcheck.runtime.budget import within_time_budget
from opcheck.runtime.context import Settings, current_item, current_settings
from opcheck.runtime.declared import Tolerance as DeclaredTolerance
from opcheck.runtime.declared import UnsupportedCase, UnsupportedOutcome, forward_ad_outcome, gradgrad_outcome
from opcheck.runtime.devices import seed_global, unavailable_reason, unsupported_dtype_reason
from opcheck.runtime.gaps import fill_gaps, gaps_note, lowprec_gaps_note, nan_gaps, nonfinite
from opcheck.runtime.input_names import gradcheck_input_names, with_spec_names
from opcheck.runtime.lowprec import compare_lowprec, resolve_parts
from opcheck.runtime.makers import SampleError
from opcheck.runtime.margins import announce_margin
from opcheck.runtime.outcomes import CheckFailure, CheckSkipped
from opcheck.runtime.policy import Policy, choose_policy, jacobian_entries
from opcheck.runtime.precision import describe as describe_precision
from opcheck.runtime.precision import reduced_precision
from opcheck.runtime.report import Case, format_failure, write_heatmap
from opcheck.runtime.samples import SampleCall, build_calls, is_random
from opcheck.runtime.tolerances import Tolerances, resolve_lowprec_criterion, resolve_tolerances
from opcheck.spec.model import (
    CHECKS,
    COMPILE,
    FORWARD_AD,
    FORWARD_AD_UNSUPPORTED,
    FWGRAD_BWGRAD,
    GRADCHECK,
    GRADGRAD_UNSUPPORTED,
    GRADGRADCHECK,
    LIBRARY_OPCHECK,
    LOWPREC,
    Check,
    OpSpec,
)
from opcheck.spec.opinfo_db import OpInfoUnavailable
from opcheck.spec.oppath import OpPathError, resolve_op
from opcheck.spec.requires import not_installed_reason

MAX_REDRAWS = 3


class CheckFailed(GradcheckError):
    """A gradient check failed; `check`, `path`, `mismatch` are the engine's, the message is complete."""


class LowPrecisionMismatch(CheckFailure):
    """The low-precision run disagrees with the float64 reference beyond the dtype's tolerances."""


class UnsupportedButWorks(CheckFailure):
    """The spec declares a derivative unsupported, yet it works."""


class LibraryOpcheckFailed(CheckFailure):
    """torch.library.opcheck reported failures."""


class CheckCrashed(CheckFailure):
    """The op, the sample or the check raised something other than a verdict; the cause is chained."""


class OpcheckRedrawWarning(UserWarning):
    """A sample was re-drawn because an earlier draw landed next to a kink."""


class OpcheckGapsWarning(UserWarning):
    """An op read the memory between a strided input's elements, though what it read there did not
    reach the result (the check passed with 0 there)."""


def run_check(spec: OpSpec, check: str, device: str, dtype: str, sample: str) -> None:
    """Run one generated test: pass, raise CheckSkipped with a reason, or raise a failure that says it all."""
    __tracebackhide__ = True
    if check not in CHECKS:
        raise ValueError(f"unknown check {check!r}; expected one of {', '.join(CHECKS)}")
    reason = not_installed_reason(spec) or unavailable_reason(device) or unsupported_dtype_reason(device, dtype)
    if reason:
        raise CheckSkipped(reason)
    case = Case.of(spec, check, device, dtype, sample)
    load_forward_ad_decompositions()  # before every test: a worker's first takes the way its later ones do
    # torch warns once that sparse invariant checks are off unless a program opts in or out; a
    # test opts in: a backward that builds an invalid sparse gradient then raises, never crashes.
    with within_time_budget(case), torch.sparse.check_sparse_tensor_invariants(enable=True):
        RUNNERS[check](case, current_settings())


# ------------------------------------------------------------------------------------ helpers
def _calls(case: Case) -> list[SampleCall]:
    """The calls of this draw of the case's sample (its seed: the case's id and attempt)."""
    __tracebackhide__ = True
    try:
        calls = build_calls(case.spec, case.sample, case.device, case.dtype, case.seed)
        return [replace(c, clone_inputs=True) for c in calls] if case.spec.clone_inputs else calls
    except CheckSkipped:  # `opinfo:` without expecttest: a skip, not the sample's fault
        raise
    except OpPathError as e:
        cause = e.__cause__
        if isinstance(cause, OpInfoUnavailable) and cause.needs_expecttest:  # `op: opinfo:`, likewise
            raise CheckSkipped(f"op {case.spec.op}: {cause}") from None
        raise CheckCrashed(_build_failure(case, e)) from None
    except (SampleError, LookupError) as e:  # the spec's mistake: the message says it all
        raise CheckCrashed(_build_failure(case, e)) from None
    except Exception as e:  # e.g. a `generator:` function that raises: keep its traceback
        raise CheckCrashed(_build_failure(case, e)) from e


def _build_failure(case: Case, e: Exception) -> str:
    return format_failure(
        case,
        headline=f"opcheck could not build sample {case.sample.name!r} for {case.spec.op}",
        body=f"{type(e).__name__}: {e}",
    )


def _crash(
    case: Case,
    call: SampleCall | None,
    e: BaseException,
    what: str,
    tol: Tolerances | None = None,
    policy: Policy | None = None,
    tolerances: str | None = None,
) -> CheckCrashed:
    hints = tuple(h for h in (_crash_hint(e), _triton_hint(e)) if h)
    text = "\n".join([f"{type(e).__name__}: {e}".strip(), *hint_lines(hints)])
    return CheckCrashed(
        format_failure(
            case,
            headline=f"opcheck {case.check}: {what} raised {type(e).__name__} for {case.spec.op} on "
            f"{case.device}/{case.dtype}, sample {case.sample.name!r}",
            body=text,
            call=call,
            path=Check.parse(case.check).path,
            tolerances=tolerances or (tol.describe() if tol else None),
            policy=policy.describe() if policy else None,
        ),
        facts_of(e).adding(hints=hints),
    )


def _crash_hint(e: BaseException) -> str:
    """Name the usual cause of a crash inside a custom backward, when the exception shows it ("": none)."""
    message = str(e)
    if isinstance(e, (TypeError, AttributeError)) and "NoneType" in message:
        return (
            "a backward received None: with several outputs, the grad_output of an output "
            "that did not contribute is undefined. autograd.Function passes zeros for it unless "
            "ctx.set_materialize_grads(False) is set; with that setting, backward must handle None."
        )
    return ""


def _triton_hint(e: BaseException) -> str:
    """What to do about a Triton kernel compiled for a GPU that met CPU tensors (opcheck.triton)."""
    if "triton" not in sys.modules:  # no kernel ran: nothing of triton's is imported for the hint
        return ""
    from opcheck.triton.launches import hint

    return hint(e)


def _entries(check: str, fn, inputs) -> int:
    __tracebackhide__ = True
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    out_numels = [o.numel() for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())]
    return jacobian_entries(check, [x.numel() for x in inputs], out_numels)


def engine_call(case: Case, tol: Tolerances, policy: Policy):
    """The engine function for this check kind and the keyword arguments it gets."""
    f, g = case.spec.gradcheck, case.spec.gradgradcheck
    common = dict(tol.engine_kwargs(), check_grad_dtypes=f.check_grad_dtypes, masked=f.masked, **policy.engine_kwargs())
    check = case.check
    if check == GRADCHECK:
        return engine.gradcheck_report, dict(
            common,
            check_undefined_grad=f.check_undefined_grad,
            check_batched_grad=f.check_batched_grad,
            check_batched_forward_grad=False,
            check_forward_ad=False,
            check_backward_ad=True,
        )
    if check in (FORWARD_AD, FORWARD_AD_UNSUPPORTED):
        return engine.gradcheck_report, dict(
            common,
            check_undefined_grad=f.check_undefined_grad,
            check_batched_grad=False,
            check_batched_forward_grad=f.check_batched_forward_grad and check == FORWARD_AD,
            check_forward_ad=True,
            check_backward_ad=False,
        )
    if check in (GRADGRADCHECK, GRADGRAD_UNSUPPORTED):
        return _seeded(engine.gradgradcheck_report, case), dict(
            common,
            gen_non_contig_grad_outputs=g.gen_non_contig_grad_outputs,
            check_undefined_grad=f.check_undefined_grad,
            check_batched_grad=g.check_batched_grad and check == GRADGRADCHECK,
            check_fwd_over_rev=False,
            check_rev_over_rev=True,
        )
    if check == FWGRAD_BWGRAD:
        return _seeded(engine.gradgradcheck_report, case), dict(
            common,
            gen_non_contig_grad_outputs=g.gen_non_contig_grad_outputs,
            check_undefined_grad=False,
            check_batched_grad=False,
            check_fwd_over_rev=True,
            check_rev_over_rev=False,
        )
    raise ValueError(f"{check} does not call the gradient engine")


def _seeded(check_fn, case: Case):
    """check_fn with the global generator seeded from the test's seed, and restored after.

    gradgradcheck draws its random grad_outputs from the global generator, as torch's does, so
    that a seeded caller checks the same function with either; a test's id reproduces them.
    """

    def run(*args, **kwargs):
        if case.device == "cpu":
            fork = torch.random.fork_rng(devices=[])
        elif case.device.startswith("cuda"):
            fork = torch.random.fork_rng(devices=[torch.cuda.current_device()])
        else:
            fork = torch.random.fork_rng(device_type=case.device.split(":")[0])
        with fork:
            seed_global(case.device, case.seed)
            return check_fn(*args, **kwargs)

    run.__name__ = check_fn.__name__
    return run


@dataclass(frozen=True)
class _Outcome:
    """A call that failed the check: the engine's report and its error, and whether it looks like a kink."""

    call: SampleCall
    report: engine.GradcheckReport
    error: GradcheckError
    policy: Policy
    kink: str | None  # why the failure looks like a kink, or None
    float32: str | None = None  # why the op seems to compute in float32 (then no kink is looked for)
    gaps: str | None = None  # what NaN in a strided input's gaps showed (gaps.gaps_note)


def _run_engine(case: Case, call: SampleCall, tol: Tolerances, settings: Settings) -> _Outcome | None:
    __tracebackhide__ = True
    fn, inputs = call.as_function(), call.gradcheck_inputs()
    if not inputs:
        raise CheckCrashed(
            format_failure(
                case,
                headline=f"opcheck {case.check}: sample {case.sample.name!r} has no tensor that requires grad",
                body="gradcheck differentiates with respect to the sample's floating-point tensors; this sample has "
                "none (integer dtypes or requires_grad: false everywhere)",
                call=call,
            )
        )
    policy = None
    try:
        policy = choose_policy(case.spec.gradcheck.fast_mode, settings, lambda: _entries(case.check, fn, inputs))
        check_fn, kwargs = engine_call(case, tol, policy)
        report = check_fn(fn, inputs, **kwargs)
    except Exception as e:
        raise _crash(case, call, e, "the check", tol, policy) from e
    if report.error is None:  # passed
        return None
    gaps_seen = None
    filled = nan_gaps(call.args, call.kwargs)
    mismatch = report.mismatch
    if filled and mismatch is not None and nonfinite(mismatch.analytical, mismatch.numerical):
        # the NaN the sample maker put between the elements, not the op's own: the verdict is that
        # of the check with 0 there
        fill_gaps(filled)
        report = check_fn(fn, inputs, **kwargs)
        gaps_seen = gaps_note([name for name, _ in filled], rerun_failed=report.error is not None)
        if report.error is None:
            warnings.warn(OpcheckGapsWarning(gaps_seen), stacklevel=2)
            return None
    float32 = float32_evidence(fn, inputs)
    if float32 is not None:  # float32 rounding, not a kink: eps/2 and re-draws would only repeat it
        return _Outcome(call, report, report.error, policy, None, float32=float32, gaps=gaps_seen)
    kink = _kink_evidence(check_fn, fn, inputs, kwargs, report) if report.mismatch is not None else None
    return _Outcome(call, report, report.error, policy, kink, gaps=gaps_seen)


def _block_key(m):
    return (m.check, m.path, m.output_idx, m.input_idx, m.part)


def _kink_evidence(check_fn, fn, inputs, kwargs, report) -> str | None:
    """Why this failure looks like a kink (the numerical Jacobian depends on eps), or None."""
    eps = kwargs["eps"]
    try:
        half = check_fn(fn, inputs, **dict(kwargs, eps=eps / 2))
    except Exception:
        return None
    m = report.mismatch
    if half.passed:
        return f"the check fails with eps={eps:g} but passes with eps={eps / 2:g}"
    if half.mismatch is None or _block_key(half.mismatch) != _block_key(m):
        return f"with eps={eps / 2:g} the failure moves away from d {m.output_name} / d {m.input_name}"
    a = m.analytical.detach().cpu()
    n1, n2 = m.numerical.detach().cpu(), half.mismatch.numerical.detach().cpu()
    dtype = torch.promote_types(torch.promote_types(a.dtype, n1.dtype), n2.dtype)
    a, n1, n2 = a.to(dtype), n1.to(dtype), n2.to(dtype)
    atol, rtol = m.atol, m.rtol
    bad = ~((a - n1).abs() <= atol + rtol * n1.abs())
    moved = (n1 - n2).abs() > atol + rtol * n2.abs()
    if bool((bad & moved).any()):
        worst = float((n1 - n2).abs()[bad & moved].max())
        return (
            f"the numerical derivative at the mismatched entries changes by up to {worst:.4g} between "
            f"eps={eps:g} and eps={eps / 2:g}"
        )
    return None


def _announce_redraws(case: Case, history: list[str]) -> None:
    text = (
        f"opcheck: {case.spec.name} {case.id.name}: passed after {len(history)} re-draw(s) of sample "
        f"{case.sample.name!r}; earlier draws landed next to a non-differentiable point:\n"
        + "\n".join(f"  {h}" for h in history)
        + f"\n  passing draw: seed {case.seed} (re-draw {case.attempt})"
    )
    print(text)
    item = current_item.get()
    if item is not None:
        item.user_properties.append(("opcheck_redraws", text))
    warnings.warn(OpcheckRedrawWarning(text), stacklevel=4)  # at the generated test's line


def _announce_parts(note: str) -> None:
    """A low-precision test that leaves parts out says so in its report (and on stdout)."""
    _announce_lowprec(note, "opcheck_lowprec_parts", "opcheck lowprec parts")


def _announce_lowprec(text: str, prop: str, section: str) -> None:
    """`text` on stdout, in the test's user properties (`prop`) and as a report section."""
    print(f"opcheck lowprec: {text}")
    item = current_item.get()
    if item is not None:
        item.user_properties.append((prop, text))
        if item.add_report_section is not None:
            item.add_report_section("call", section, text)


LOWPREC_FINDINGS = {
    "inputs": "the op wrote into an input",
    "grad_outputs": "the op wrote into its grad_output or tangent",
    "reference": "the reference does not compute in float64",
}
"""Low-precision failures that are not about values: the headline of each."""


def _announce_lowprec_finding(finding: str) -> None:
    """What a passing low-precision test found all the same (a declared write into grad_output, a
    float32 reference at float16) shows in its report (and on stdout)."""
    _announce_lowprec(finding, "opcheck_lowprec_finding", "opcheck lowprec")


# ------------------------------------------------------------------------------------ runners
def _gradient_check(case: Case, settings: Settings) -> None:
    __tracebackhide__ = True
    tol = resolve_tolerances(case.spec, case.check, case.device, case.dtype, case.sample.name)
    redraws = MAX_REDRAWS if is_random(case.sample) else 0
    history: list[str] = []
    for attempt in range(redraws + 1):
        drawn = case.redraw(attempt)
        with recording_margins() as margins:  # the passing draw's comparisons alone
            failure = _first_failure(drawn, tol, settings)
        if failure is None:
            if history:
                _announce_redraws(drawn, history)
            announce_margin(margins.worst)
            return
        if failure.kink is None or attempt == redraws:
            noted = _float32_note(_kink_note(drawn, failure.kink, history, redraws), failure.float32)
            noted = noted.with_note(failure.gaps) if failure.gaps else noted
            raise _gradient_failure(noted, failure, tol, settings)
        history.append(f"seed {drawn.seed}" + (f" (re-draw {attempt})" if attempt else "") + f": {failure.kink}")


def _kink_note(case: Case, kink: str | None, history: list[str], redraws: int) -> Case:
    """The case with a note on why a failure that looks like a kink stands (none for any other failure)."""
    if kink is None:
        return case
    if redraws:
        return case.with_note(
            f"every one of {redraws + 1} draws landed next to a non-differentiable point "
            "(earlier: " + "; ".join(history) + f"; last: {kink}); keep the values "
            "away from the kink with `avoid:` in the sample"
        )
    return case.with_note(
        f"this looks like a kink ({kink}), but the sample has explicit values, so it cannot be re-drawn"
    )


def _float32_note(case: Case, evidence: str | None) -> Case:
    """The case with a note on what to write for an op that computes in float32 (none otherwise)."""
    if evidence is None:
        return case
    return case.with_note(
        f"the op seems to compute in float32: {evidence}, so its float64 finite differences carry float32 "
        "rounding (this is not a kink, and re-drawing the sample cannot help); test it with `dtypes: []`, "
        "`lowprec_dtypes: [float32, bfloat16, float16]` and a float64 `reference:` (the same math in plain "
        "torch), which checks its outputs and gradients at those dtypes against float64"
    )


def _first_failure(case: Case, tol: Tolerances, settings: Settings) -> _Outcome | None:
    """The first of the draw's calls that fails the check, or None when every one passes."""
    __tracebackhide__ = True
    for call in _calls(case):
        failure = _run_engine(case, call, tol, settings)
        if failure is not None:
            return failure
    return None


def _gradient_failure(case: Case, failure: _Outcome, tol: Tolerances, settings: Settings) -> CheckFailed:
    err = failure.error
    plot = None
    if settings.plot_dir:
        if failure.report.mismatch is not None:
            try:
                plot = write_heatmap(failure.report.mismatch, case, settings.plot_dir)
            except Exception as e:  # a broken plot must not hide the failure
                plot = f"not written: {type(e).__name__}: {e}"
        else:
            plot = f"not written: this failure ({err.check or 'check'}) has no Jacobian block to plot"
    path = err.path or Check.parse(case.check).path
    if err.check:
        path = f"{path} ({err.check})"
    message = format_failure(
        case,
        headline=f"opcheck {case.check} failed for {case.spec.op} on {case.device}/{case.dtype}, "
        f"sample {case.sample.name!r}",
        body="engine report:\n" + with_spec_names(str(err), err.facts.inputs, _input_names(failure.call)),
        call=failure.call,
        path=path,
        tolerances=tol.describe(),
        policy=failure.policy.describe(failure.report),
        plot=plot,
    )
    return CheckFailed(message, check=err.check, path=err.path, mismatch=err.mismatch, facts=err.facts)


def _input_names(call: SampleCall) -> list[str]:
    """The spec's name of each input the engine numbers (opcheck.runtime.input_names)."""
    return gradcheck_input_names(call.args, call.kwargs)


def unsupported_outcome(run: Callable[[], engine.GradcheckReport], path: str = "JVP") -> UnsupportedOutcome:
    """Run the engine's check of a derivative declared unsupported and say which UnsupportedCase held.

    For samples with sparse or other non-strided inputs, whose directions the engine draws; strided
    samples take opcheck.runtime.declared's few calls instead. ALL_ZERO: the failed block's
    analytical derivative is zero within atol while its numerical one is not.
    """
    try:
        report = run()
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        return UnsupportedOutcome(UnsupportedCase.RAISED, f"{type(e).__name__}: {first}" if first else type(e).__name__)
    if report.passed:
        return UnsupportedOutcome(UnsupportedCase.WORKS, f"the {path} agrees with finite differences")
    m = report.mismatch
    if m is not None and m.analytical.numel() and m.numerical.numel():
        a_max, n_max = float(m.analytical.abs().max()), float(m.numerical.abs().max())
        if a_max <= m.atol < n_max:
            tangent = " (the outputs carry no tangent, or a zero one)" if path == "JVP" else ""
            return UnsupportedOutcome(
                UnsupportedCase.ALL_ZERO,
                f"the {path} of {m.output_name} with respect to {m.input_name} is all zero{tangent} while "
                f"finite differences reach {n_max:.4g}",
            )
    first = (report.message.strip().splitlines() or [""])[0]
    return UnsupportedOutcome(
        UnsupportedCase.WRONG, f"the {path} is present but fails the check ({report.check or 'check'}): {first}"
    )


def _announce_unsupported(case: Case, outcomes: list[UnsupportedOutcome]) -> None:
    """A passing *_unsupported test says how the derivative failed (its report and stdout)."""
    text = "; ".join(sorted({f"{o.case.value}: {o.detail}" for o in outcomes}))
    print(f"opcheck {case.check}: {text}")
    item = current_item.get()
    if item is not None:
        item.user_properties.append(("opcheck_unsupported", text))
        if item.add_report_section is not None:
            item.add_report_section("call", f"opcheck {case.check}", text)


def _expect_unsupported(case: Case, settings: Settings) -> None:
    __tracebackhide__ = True
    flag = "supports_gradgrad" if case.check == GRADGRAD_UNSUPPORTED else "supports_forward_ad"
    what = "the second derivative (VJP of VJP)" if case.check == GRADGRAD_UNSUPPORTED else "forward-mode AD (JVP)"
    absent = "came out all zero" if case.check == GRADGRAD_UNSUPPORTED else "left the outputs without a tangent"
    tol = resolve_tolerances(case.spec, case.check, case.device, case.dtype, case.sample.name)
    outcomes = []
    empty: list[str] = []
    for call in _calls(case):
        fn, inputs = call.as_function(), call.gradcheck_inputs()
        if inputs and (why := _shows_no_derivative(fn, inputs)):
            empty.append(why)  # an empty derivative neither works nor fails: nothing to declare on
            continue
        if not inputs:
            raise CheckCrashed(
                format_failure(
                    case,
                    headline=f"opcheck {case.check}: sample {case.sample.name!r} has no tensor that requires "
                    "grad, so it cannot show that the derivative is unsupported",
                    body="",
                    call=call,
                )
            )
        outcome, how = _declared_outcome(case, tol, fn, inputs)
        if outcome.case is not UnsupportedCase.WORKS:
            outcomes.append(outcome)
            continue
        raise UnsupportedButWorks(
            format_failure(
                case,
                headline=f"the spec declares `{flag}: false`, but {what} of {case.spec.op} works: remove "
                f"`{flag}: false` from {case.spec.source} so that the derivative is checked instead",
                body=f"On this sample {what} neither raised nor {absent}, and it agrees with finite "
                f"differences ({how}).",
                call=call,
                path=Check.parse(case.check).path,
                tolerances=tol.describe(),
                policy=how,
            )
        )
    if empty and not outcomes:
        raise CheckSkipped(
            f"sample {case.sample.name!r} cannot show whether {what} is supported: " + "; ".join(sorted(set(empty)))
        )
    _announce_unsupported(case, outcomes)


def _declared_outcome(case: Case, tol: Tolerances, fn: Callable, inputs: tuple) -> tuple[UnsupportedOutcome, str]:
    """Which case held for the declared-unsupported derivative, and how it was decided.

    Strided inputs: one derivative along a random direction against central differences, in a few
    calls (opcheck.runtime.declared). Sparse and other layouts: the engine's fast mode, which draws
    directions that keep their structure.
    """
    __tracebackhide__ = True
    if all(x.layout == torch.strided for x in inputs):
        probe = forward_ad_outcome if case.check == FORWARD_AD_UNSUPPORTED else gradgrad_outcome
        generator = torch.Generator().manual_seed(case.seed)
        how = "one random direction against central differences"
        return probe(fn, inputs, DeclaredTolerance(tol.eps, tol.atol, tol.rtol), generator), how
    policy = Policy(True, "only whether the derivative raises, is zero or passes matters")
    check_fn, kwargs = engine_call(case, tol, policy)
    outcome = unsupported_outcome(functools.partial(check_fn, fn, inputs, **kwargs), Check.parse(case.check).path)
    return outcome, f"{check_fn.__name__}, {policy.describe()}"


def _shows_no_derivative(fn: Callable, inputs: tuple) -> str | None:
    """Why a call has no derivative entry to check (no input or no output element), or None."""
    __tracebackhide__ = True
    if sum(x.numel() for x in inputs) == 0:
        return "its inputs that require grad have no elements"
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    floats = [o for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())]
    if sum(o.numel() for o in floats) == 0:
        return "its outputs have no elements"
    return None


def _lowprec(case: Case, settings: Settings) -> None:
    __tracebackhide__ = True
    resolved = resolve_lowprec_criterion(case.spec, case.device, case.dtype, case.sample.name)
    forward = case.spec.gradcheck.check_forward_ad and case.spec.supports_forward_ad
    reference = resolve_op(case.spec.reference, imports=case.spec.imports) if case.spec.reference else None
    parts = resolve_parts(case.spec, case.device, case.dtype, case.sample.name)
    note = parts.note()
    if note is not None:
        _announce_parts(note)
        case = case.with_note(note)
    switches = case.spec.reduced_precision
    for call in _calls(case):

        def compare(call: SampleCall = call) -> Any:
            try:
                with reduced_precision(switches):
                    return compare_lowprec(
                        call,
                        case.id,
                        attempt=case.attempt,
                        criterion=resolved.criterion,
                        check_forward_ad=forward,
                        reference_op=reference,
                        parts=parts.parts,
                        writes_grad_outputs=case.spec.writes_grad_outputs,
                        on_finding=_announce_lowprec_finding,
                    )
            except Exception as e:
                raise _crash(case, call, e, "the low-precision run", tolerances=resolved.describe(case.dtype)) from e

        diff, gaps = compare(), None
        filled = nan_gaps(call.args, call.kwargs) if diff is not None else []
        if filled:  # the sample maker's NaN between the elements may be what differs: 0 there decides
            fill_gaps(filled)
            first, diff = diff, compare()
            gaps = lowprec_gaps_note([n for n, _ in filled], first.what, rerun_failed=diff is not None)
            if diff is None:
                warnings.warn(OpcheckGapsWarning(gaps), stacklevel=2)
                continue
        if diff is not None:
            against = f"reference {case.spec.reference}" if case.spec.reference else "run"
            headline = (
                f"opcheck lowprec failed for {case.spec.op} on {case.device}/{case.dtype}, sample "
                f"{case.sample.name!r}: "
                + LOWPREC_FINDINGS.get(diff.path, f"{diff.what} differs from the float64 {against}")
            )
            raise LowPrecisionMismatch(
                format_failure(
                    case.with_note(gaps) if gaps else case,
                    headline=headline,
                    body=diff.text,
                    call=call,
                    path=f"{diff.path} at {case.dtype} against the float64 reference"
                    if diff.path not in LOWPREC_FINDINGS
                    else None,
                    tolerances=resolved.describe(case.dtype),
                    precision=describe_precision(switches),
                ),
                diff.facts,
            )


def _lowprec_margined(case: Case, settings: Settings) -> None:
    """The low-precision test, whose pass reports its worst part's margin (opcheck.runtime.margins)."""
    __tracebackhide__ = True
    with recording_margins() as margins:
        _lowprec(case, settings)
    announce_margin(margins.worst)


def _library_opcheck(case: Case, settings: Settings) -> None:
    __tracebackhide__ = True
    op = resolve_op(case.spec.op, imports=case.spec.imports)
    kinds = [torch._ops.OpOverload, torch._ops.OpOverloadPacket]
    custom = getattr(getattr(torch, "_library", None), "custom_ops", None)
    if custom is not None:
        kinds.append(custom.CustomOpDef)
    if not isinstance(op, tuple(kinds)):
        raise CheckSkipped(
            f"library_opcheck applies to torch.ops.* operators and torch.library custom ops; "
            f"{case.spec.op} is a {type(op).__name__}"
        )
    for call in _calls(case):
        try:
            results = torch.library.opcheck(cast(Any, op), tuple(call.args), dict(call.kwargs), raise_exception=False)
        except Exception as e:
            raise _crash(case, call, e, "torch.library.opcheck") from e
        failed = {name: r for name, r in results.items() if r != "SUCCESS"}
        if failed:
            body = "\n".join(f"{name}: FAILED: {type(r).__name__}: {r}" for name, r in failed.items())
            body += "\n" + "\n".join(f"{name}: passed" for name in results if name not in failed)
            raise LibraryOpcheckFailed(
                format_failure(
                    case,
                    headline=f"torch.library.opcheck failed for {case.spec.op} on {case.device}/{case.dtype}, "
                    f"sample {case.sample.name!r}: {', '.join(failed)}",
                    body=body,
                    call=call,
                    path="torch.library.opcheck",
                )
            )


def _compile(case: Case, settings: Settings) -> None:
    __tracebackhide__ = True
    from opcheck.runtime.compiled import run_compile  # torch._dynamo loads with the first compile test

    run_compile(case, settings)


RUNNERS: dict[str, Callable[[Case, Settings], None]] = {
    GRADCHECK: _gradient_check,
    FORWARD_AD: _gradient_check,
    GRADGRADCHECK: _gradient_check,
    FWGRAD_BWGRAD: _gradient_check,
    GRADGRAD_UNSUPPORTED: _expect_unsupported,
    FORWARD_AD_UNSUPPORTED: _expect_unsupported,
    LOWPREC: _lowprec_margined,
    LIBRARY_OPCHECK: _library_opcheck,
    COMPILE: _compile,
}
