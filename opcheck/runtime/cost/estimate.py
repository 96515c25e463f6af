"""A generated test's cost before it runs: the calls of the op it will make, and its seconds.

`estimate(spec, case)` builds the test's sample as the test does (same device, dtype and seed),
probes the function the check differentiates (probe.py: a forward and a backward timed, the best of
three for a quick call and once for one of probe.REPEAT_UNDER seconds or more, and, where the plan
needs them, one call of each batched evaluation the engine may use: which of its paths the op
takes; samples.py probes each sample once for every dtype and check that shares it), plans the
engine call the runtime makes, with the runtime's own flags, tolerances and policy
(checks.engine_call) by running the engine's own check on a stand-in of the function and counting
what it evaluates (standin.dry_run), and prices each
evaluation at the probe's times, plus what surrounds the evaluations (building the sample,
the engine's bookkeeping and comparisons: FIXED, PER_EVALUATION, PER_STEP, measured on the catalog
and scaled to this machine by `machine_factor`).

What the estimate assumes: the check passes (a failing one stops early; one that looks like a kink
re-draws its sample, up to four runs), torch runs on one thread as the generated tests do, and the
process is warm (its first test also pays imports, and a first large buffer its first touch).
benchmarks/bench_cost.py compares the estimates with measured times on the catalog.

A probe calls the op a few times per sample whatever its test costs (tests/runtime/test_cost_calls.py
counts them): a test that would take minutes is known in a few of its op's calls. Advice never names
a device this machine does not have (`_slow_op`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch

from opcheck.runtime.context import Settings
from opcheck.runtime.cost.plan import TIMED, Calls, Kind, Plan
from opcheck.runtime.cost.probe import Probe, timed, unit_seconds
from opcheck.runtime.cost.samples import SampleProbes
from opcheck.runtime.cost.standin import dry_run
from opcheck.runtime.threads import torch_threads
from opcheck.spec.case import CaseId, cases_of, deciding_rules
from opcheck.spec.model import (
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
    CompileBackend,
    CompileCase,
    CompileFlags,
    OpSpec,
)

__all__ = [
    "THRESHOLD",
    "Calls",
    "Estimate",
    "estimate",
    "estimate_spec",
    "expected_failure",
    "format_seconds",
    "machine_factor",
    "plans_of",
]

THRESHOLD = 1.0
"""Seconds beyond which `opcheck list --cost` marks a test and says what would make it cheaper."""

# What a test costs besides the evaluations of its function (building the sample, resolving its
# tolerances, the engine's setup, comparisons and bookkeeping), in seconds on the machine that
# measured them: the project's 2-core x86, torch 2.13, one thread (machine_factor scales them).
# Fitted to the catalog's measured times by `python benchmarks/bench_cost.py --fit`: per test by
# check kind; per evaluation by kind (the work around each call: one-hot rows, differences,
# comparisons); per stage of the engine's check (a kind of batching given up, a timed choice).
FIXED: dict[str, float] = {
    GRADCHECK: 140e-6,
    FORWARD_AD: 0.0,
    GRADGRADCHECK: 4e-6,
    FWGRAD_BWGRAD: 120e-6,
    FORWARD_AD_UNSUPPORTED: 220e-6,
    GRADGRAD_UNSUPPORTED: 24e-6,
    LOWPREC: 1.5e-3,
    LIBRARY_OPCHECK: 32e-3,
}
PER_EVALUATION = {
    Kind.FORWARD: 8.4e-6,
    Kind.BACKWARD: 7.5e-6,
    Kind.JVP: 100e-6,
    Kind.VMAP: 32e-6,
    Kind.VMAP_JVP: 400e-6,
    Kind.VMAP_TANGENTS: 0.0,
    Kind.BATCHED_BACKWARD: 0.0,
    Kind.DOUBLE_BACKWARD: 46e-6,
}
PER_STEP = {"fused pass": 0.0, "comparison": 230e-6, "failed batch": 0.0, TIMED: 75e-6}
LIBRARY_OPCHECK_RUNS = 6
"""torch.library.opcheck's tests run the op about this many times (forward and backward) besides FIXED."""
# What torch.compile spends on one new graph of a small op (dynamo's trace, AOTAutograd's forward
# and backward graphs, and inductor's kernels), in a process already warm: measured on the project's
# 2-core x86, torch 2.13, one thread, by compiling `(sin(x) * w + k).sum(-1)` at 8x16 float64 with
# a new constant k after each torch._dynamo.reset() and timing its first forward and backward:
# aot_eager 0.07 s per graph (the FX graph cache cold or warm alike); inductor 1.0 s with a cold
# TORCHINDUCTOR_CACHE_DIR (0.05 s from a warm one: an estimate assumes the cold cache of a fresh
# CI machine). A process's first compile pays about 0.8 s more (aot_eager), 10 s (inductor, cold),
# which no one test is charged.
COMPILE_SECONDS_PER_GRAPH = {"aot_eager": 0.07, "inductor": 1.0}
COMPILE_RUNS = 2
"""A comparison under torch.compile runs the op eagerly and compiled, each a forward and a backward."""
STATE = CompileCase.BACKWARD_STATE
STATE_GRAPHS = 3
"""The backward_state case: dynamo traces the op without grad and with it, then compiles it once."""
STATE_RUNS = 6
"""Its runs of the op: one in each trace, one that finds the custom ops called, one compiled with
the values as they are, then one eagerly and one compiled with the values changed."""
REFERENCE_SECONDS = 2.76e-4
"""What machine_factor's workload took on the machine that measured FIXED."""


@dataclass(frozen=True)
class Estimate:
    """One generated test's predicted calls and seconds, what the engine will do, and, when it is
    expensive, what would make it cheaper."""

    case: CaseId
    calls: Calls = Calls()
    seconds: float = 0.0
    path: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()
    skipped: str | None = None  # why there is no estimate: the test is skipped, or the probe raised
    # which: "unavailable" (the device), "requires" (a module), "dtype", "spec" (a skip rule), "probe"
    not_estimated: str | None = None
    evaluations: float = 0.0  # of `seconds`, the evaluations of the op at the probe's times
    counts: tuple[tuple[str, int], ...] = ()  # evaluations by kind and step-by-step comparisons (for fitting)
    plans: tuple[Plan, ...] = ()  # a gradient check's: one per engine call (plans_of), as priced

    def over(self, threshold: float) -> bool:
        return self.skipped is None and self.seconds > threshold


# ------------------------------------------------------------------------------ calibration
@functools.cache
def machine_factor() -> float:
    """How much slower this machine runs a small fixed workload than the one that measured FIXED
    (what a test of a small op is made of: small tensors, forwards, backwards, vmapped calls; the
    best of several runs on one thread)."""
    x = torch.linspace(-1, 1, 16, dtype=torch.float64).requires_grad_()

    def work() -> None:
        for _ in range(5):
            y = torch.sin(x) * x
            torch.autograd.grad(y, x, torch.ones_like(y))
            torch.func.vmap(torch.sin)(x.detach().reshape(4, 4))

    with one_thread():
        work()
        _, seconds = timed(work, repeats=7)
    return max(0.25, min(8.0, seconds / REFERENCE_SECONDS))


def one_thread(threads: int | None = 1) -> contextlib.AbstractContextManager[None]:
    """torch's intra-op threads as the generated tests set them (the plugin's default: one; None:
    torch's own setting, left alone)."""
    return torch_threads(threads)


# ------------------------------------------------------------------------------ estimates
def estimate_spec(
    spec: OpSpec,
    settings: Settings | None = None,
    devices: Iterable[str] | None = None,
    threshold: float = THRESHOLD,
) -> list[Estimate]:
    """An estimate for every generated test of the spec on these device types (default: all; a test
    on an unavailable device, or one a rule skips, is an estimate whose `skipped` says why); those
    over `threshold` seconds come with advice."""
    settings = settings or Settings.from_env()
    wanted = set(devices) if devices is not None else None
    probes = SampleProbes(spec)
    return [
        estimate(spec, case, settings, probes, threshold)
        for case in cases_of(spec)
        if wanted is None or case.device in wanted
    ]


def estimate(
    spec: OpSpec,
    case: CaseId,
    settings: Settings | None = None,
    probes: SampleProbes | None = None,
    threshold: float = THRESHOLD,
) -> Estimate:
    """The estimate of one generated test (`case`, one of `cases_of(spec)`), with advice when it is
    over `threshold` seconds; `probes` shares the probes of a spec's samples between its checks."""
    from opcheck.engine._util import load_forward_ad_decompositions
    from opcheck.runtime.devices import unavailable_reason, unsupported_dtype_reason
    from opcheck.spec.requires import not_installed_reason

    settings = settings or Settings.from_env()
    for kind, reason in (
        ("requires", not_installed_reason(spec)),
        ("unavailable", unavailable_reason(case.device)),
        ("dtype", unsupported_dtype_reason(case.device, case.dtype)),
        ("spec", _skip_reason(spec, case)),
    ):
        if reason:
            return Estimate(case, skipped=reason, not_estimated=kind)
    # As in a test run, where the first forward-AD test loads torch's forward-AD decompositions for
    # the rest of the process: some ops' forward AD is slower with them.
    load_forward_ad_decompositions()
    probes = probes or SampleProbes(spec)
    try:
        # torch's threads as the plugin sets them around a generated test: settings.threads, else one
        with one_thread(settings.threads or 1), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _estimate(spec, case, settings, probes, threshold)
    except Exception as e:  # the test will say what is wrong; nothing to estimate
        first = (str(e).strip().splitlines() or [""])[0]
        return Estimate(case, skipped=f"the probe raised {type(e).__name__}: {first}", not_estimated="probe")


def _skip_reason(spec: OpSpec, case: CaseId) -> str | None:
    rule = deciding_rules(spec, case).skip()
    return f"skipped by the spec: {rule.reason}" if rule is not None else None


def expected_failure(spec: OpSpec, case: CaseId) -> bool:
    """Whether the spec expects this test to fail (as its generated xfail mark says)."""
    return deciding_rules(spec, case).expected_failure() is not None


def _estimate(spec: OpSpec, case: CaseId, settings: Settings, probes: SampleProbes, threshold: float) -> Estimate:
    factor, check = machine_factor(), case.check
    fails = expected_failure(spec, case)
    notes: tuple[str, ...] = (
        ("expected to fail: the comparison that fails, then the one that names the entries",) if fails else ()
    )
    if check == COMPILE:
        return _compile_estimate(spec, case, probes, factor, notes, threshold)
    fixed = FIXED[check] * factor
    if check == LOWPREC:
        low = probes.lowprec(case)
        path = ("low precision: the op at the dtype, the float64 reference, its rounded baselines",)
        # FIXED[LOWPREC] is per call of the sample (an OpInfo sample has several): the parts judged
        total = fixed * max(1, low.sample_calls) + low.seconds
        slow = _slow_op(spec, case, low.op_run, f"the op's run at {case.dtype}") if total > threshold else None
        advice = (slow,) if slow else ()
        return Estimate(case, low.calls, total, path + notes, advice=advice, evaluations=low.seconds)
    if check == LIBRARY_OPCHECK:
        seconds = sum(LIBRARY_OPCHECK_RUNS * (p.forward + (p.backward or 0.0)) for p in probes.timing(case))
        return Estimate(case, Calls(), fixed + seconds, ("torch.library.opcheck",) + notes, evaluations=seconds)
    plans = plans_of(spec, case, settings, probes, fails=fails)
    evaluations = sum(plan.seconds for plan in plans)
    seconds = fixed + sum(_priced(plan, factor) for plan in plans)
    counts = Counter[str]()
    for plan in plans:
        for (kind, _), count in plan.evals.items():
            counts[kind.name] += count
        counts.update(plan.steps)
    est = Estimate(
        case,
        sum((Calls.of(plan) for plan in plans), Calls()),
        seconds,
        tuple(dict.fromkeys(text for plan in plans for text in plan.path)) + notes,
        evaluations=evaluations,
        counts=tuple(sorted(counts.items())),
        plans=tuple(plans),
    )
    if seconds <= threshold:
        return est
    return replace(est, advice=tuple(_advice(spec, case, settings, probes, est)))


def _compile_estimate(
    spec: OpSpec, case: CaseId, probes: SampleProbes, factor: float, notes: tuple[str, ...], threshold: float
) -> Estimate:
    """opcheck.runtime.compiled: under each backend, every comparison the sample makes (the sample as
    written, then each case it can make) compiles a graph and runs the op eagerly and compiled; the
    dynamic case runs a second sample too. The backward_state case runs once, under aot_eager: two
    traces to find what the backward reads, a compile, and three runs of each."""
    from opcheck.runtime.compiled import STATE_BACKEND, comparisons
    from opcheck.runtime.report import Case

    backends = (spec.compile or CompileFlags()).backends
    made = Case.of(spec, case.check, case.device, case.dtype, case.sample)
    graphs, runs, evaluations = 0, 0, 0.0
    state_graphs, state_runs, state_evaluations = 0, 0, 0.0
    for call, p in zip(probes.calls(case), probes.timing(case)):
        planned, _ = comparisons(made, call)
        per_backend = [which for which, _ in planned if which is not STATE]
        each = sum(2 if which is CompileCase.DYNAMIC else 1 for which in per_backend)
        graphs += len(per_backend)
        runs += COMPILE_RUNS * each
        evaluations += COMPILE_RUNS * each * (p.forward + (p.backward or 0.0))
        if len(per_backend) < len(planned):
            state_graphs += STATE_GRAPHS
            state_runs += STATE_RUNS
            state_evaluations += STATE_RUNS * (p.forward + (p.backward or 0.0))
    state = state_graphs * COMPILE_SECONDS_PER_GRAPH[STATE_BACKEND] * factor + state_evaluations

    def priced(under: tuple[str, ...]) -> float:
        return sum(graphs * COMPILE_SECONDS_PER_GRAPH[b] * factor + evaluations for b in under) + state

    seconds = priced(backends)
    path: tuple[str, ...] = (
        f"torch.compile ({', '.join(backends)}) against eager",
        f"torch.compile: {graphs} graph(s) per backend",
    )
    if state_graphs:
        path += (f"torch.compile: {state_graphs} graph(s) for the Python numbers the backward reads",)
    runs_in_all = runs * len(backends) + state_runs
    calls = Calls(forward=runs_in_all, backward=runs_in_all)
    advice: tuple[str, ...] = ()
    inductor = CompileBackend.INDUCTOR.value
    if seconds > threshold and inductor in backends:
        rest = tuple(b for b in backends if b != inductor) or (CompileBackend.AOT_EAGER.value,)
        advice = (
            f"`compile: {{backends: [{', '.join(rest)}]}}`: ~{format_seconds(priced(rest))} (inductor compiles "
            f"each new graph, about {COMPILE_SECONDS_PER_GRAPH[inductor]:g} s with a cold "
            "TORCHINDUCTOR_CACHE_DIR)",
        )
    evaluated = len(backends) * evaluations + state_evaluations
    return Estimate(case, calls, seconds, path + notes, advice=advice, evaluations=evaluated)


def plans_of(
    spec: OpSpec,
    case: CaseId,
    settings: Settings,
    probes: SampleProbes,
    fails: bool = False,
    **overrides: Any,
) -> list[Plan]:
    """The plans of the test's engine calls, one per call of its sample (and, before a second-order
    check, the op's call that draws its grad_outputs); with `fails`, of a test expected to fail (a
    wrong gradient); `overrides` replace the runtime's keyword arguments to the engine (fast_mode).

    Each is the engine's own check of the function's stand-in (standin.dry_run), counted; a
    second-order check's draw of its grad_outputs is a call of the stand-in."""
    if Check.parse(case.check).declared:
        return [_declared_plan(case.check, p) for p in probes.first_order(case)]
    second_order = Check.parse(case.check).second_order
    kwargs = {**engine_kwargs(spec, case, settings), **overrides}
    plans = []
    for p, op in probes.for_check(case, second_order=second_order):
        # (a second-order check's stand-in is the op's, with its first derivative's probe)
        fn, first = (op, p) if op is not None else (p, None)
        plan = dry_run(fn, kwargs, wrong=2.0 if fails else 1.0, second=first).plan(fn)
        if plan.crashed and kwargs.get("fast_mode") == "auto":  # the crash's report counts the Jacobian's entries
            plan.add(Kind.FORWARD, each=fn.forward)
        plans.append(plan)
    return plans


def _priced(plan: Plan, factor: float) -> float:
    overhead = sum(count * PER_EVALUATION[kind] for (kind, _), count in plan.evals.items())
    overhead += sum(count * PER_STEP.get(step, 0.0) for step, count in plan.steps.items())
    return plan.seconds + overhead * factor


def _declared_plan(check: str, p: Probe) -> Plan:
    """opcheck.runtime.declared: a call to see there is a derivative, then three (forward AD: a JVP
    and two forwards), or four forwards, four backward passes and a double backward."""
    plan = Plan(path=["declared unsupported: one random direction against central differences"])
    evals = {Kind.FORWARD: 3, Kind.JVP: 1}
    if check == GRADGRAD_UNSUPPORTED:
        evals = {Kind.FORWARD: 4, Kind.BACKWARD: 4, Kind.DOUBLE_BACKWARD: 1}
    for kind, count in evals.items():
        plan.add(kind, count, each=unit_seconds(p, kind))
    return plan


def engine_kwargs(spec: OpSpec, case: CaseId, settings: Settings) -> dict[str, Any]:
    """The keyword arguments the runtime passes the engine for this test (checks.engine_call)."""
    from opcheck.runtime.checks import engine_call
    from opcheck.runtime.policy import choose_policy
    from opcheck.runtime.report import Case
    from opcheck.runtime.tolerances import resolve_tolerances

    tol = resolve_tolerances(spec, case.check, case.device, case.dtype, case.sample)
    policy = choose_policy(spec.gradcheck.fast_mode, settings)
    _, kwargs = engine_call(Case.of(spec, case.check, case.device, case.dtype, case.sample), tol, policy)
    return dict(kwargs)


# ------------------------------------------------------------------------------ advice
def _advice(spec: OpSpec, case: CaseId, settings: Settings, probes: SampleProbes, est: Estimate) -> list[str]:
    """What would make an expensive test cheaper, each with what it would cost where that is known."""
    if Check.parse(case.check).declared:
        return []
    advice = []
    found = probes.for_check(case, second_order=Check.parse(case.check).second_order)
    missing = sorted({what for p, _ in found for what in _missing(p)})
    loops = est.calls.forward + est.calls.backward + est.calls.jvp > 64
    if loops and missing:
        advice.append(f"the engine loops, a call per Jacobian row or column: the op has {', '.join(missing)}")
    fast = plans_of(spec, case, settings, probes, fast_mode=True)
    seconds = FIXED[case.check] * machine_factor() + sum(_priced(plan, machine_factor()) for plan in fast)
    if engine_kwargs(spec, case, settings).get("fast_mode") is not True and seconds < est.seconds / 2:
        advice.append(
            f"`gradcheck: {{fast_mode: true}}`: ~{format_seconds(seconds)} (torch's fast mode, one random "
            "projection per input and output, misses single wrong entries); it is per spec, so give this "
            "sample a spec of its own (a family member) to keep the others on auto"
        )
    biggest = max((p for p, _ in found), key=lambda p: p.n * p.m, default=None)
    if biggest is not None and loops:
        rows, columns = biggest.m, sum(biggest.columns)
        advice.append(
            f"a smaller sample: the loops run once per output element ({rows} here) or input element ({columns})"
        )
    slow = _slow_op(spec, case, max((p.forward for p, _ in found), default=0.0), "one forward")
    if slow and not (slow.startswith("a smaller sample") and any(a.startswith("a smaller sample") for a in advice)):
        advice.append(slow)
    return advice


def _slow_op(spec: OpSpec, case: CaseId, seconds: float, what: str) -> str | None:
    """Advice where one evaluation of the op takes more than 5 ms on the cpu: another device the spec
    lists and this machine has (never one it lacks), else a smaller sample."""
    from opcheck.runtime.devices import unavailable_reason

    if case.device != "cpu" or seconds <= 5e-3:
        return None
    why = " (Triton runs its kernels in the interpreter there)" if os.environ.get("TRITON_INTERPRET") == "1" else ""
    here = [d for d in spec.devices if d != "cpu" and unavailable_reason(d) is None]
    if here:
        return (
            f"another device: {what} takes {format_seconds(seconds)} on the cpu{why}; leave cpu out of `devices:`, "
            f"or run with `--opcheck-device {here[0]}`"
        )
    return f"a smaller sample: {what} takes {format_seconds(seconds)} on the cpu{why}, the only listed device here"


def _missing(p: Probe) -> list[str]:
    """What the op lacks that the engine's batched paths need."""
    out = []
    if p.vmap is None:
        out.append("no vmap rule")
    if p.batched_backward is None:
        out.append("no batched backward")
    if p.jvp is None or not p.jvp_right:
        out.append("no forward AD")
    if p.double_backward != "ok":
        out.append("no double backward")
    return out


def format_seconds(s: float) -> str:
    """Seconds as `opcheck list --cost` prints them: 12 s, 1.3 s, 45 ms, 0.8 ms."""
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.1f} s"
    if s >= 0.01:
        return f"{s * 1e3:.0f} ms"
    return f"{s * 1e3:.1f} ms"
