"""The cost estimate (opcheck.runtime.cost): the calls its plans count (the engine's own check of
a stand-in of the op, standin.dry_run) are the calls the engine makes, counted by the op itself,
on the full Jacobian, the projections, the step-by-step and fast checks and a kernel with a
backward alone; and the estimates of generated tests (skips, second order, advice). Nothing here
judges a time: only counts, paths and the arithmetic of the estimate."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch._C._functorch import get_unwrapped, is_batchedtensor, is_functorch_wrapped_tensor, is_legacy_batchedtensor

import opcheck.engine as engine
from opcheck.engine import route
from opcheck.runtime.checks import engine_call
from opcheck.runtime.context import Settings
from opcheck.runtime.cost.estimate import (
    Calls,
    Estimate,
    engine_kwargs,
    estimate,
    estimate_spec,
    format_seconds,
    machine_factor,
)
from opcheck.runtime.cost.plan import Kind, Plan
from opcheck.runtime.cost.probe import SMALL_BATCH, Batched, Probe
from opcheck.runtime.cost.standin import dry_run
from opcheck.runtime.policy import Policy, paths_taken
from opcheck.runtime.report import Case
from opcheck.runtime.samples import build_calls
from opcheck.runtime.tolerances import resolve_tolerances
from opcheck.spec.case import CaseId, cases_of
from opcheck.spec.model import GradcheckFlags, GradgradcheckFlags, Location, OpSpec, Rule, Sample, TensorArg, Where
from tests.clocks import Spans

pytestmark = pytest.mark.filterwarnings("ignore")

COUNTS: Counter[str] = Counter()


def _batched(t: torch.Tensor) -> bool:
    while True:
        if is_batchedtensor(t) or is_legacy_batchedtensor(t):
            return True
        if not is_functorch_wrapped_tensor(t):
            return False
        t = get_unwrapped(t)


class CountingSin(torch.autograd.Function):
    """sin with a vmap rule, forward AD and a differentiable backward, counting its calls: forward
    (every evaluation, plain or vmapped, a JVP's too), jvp, backward (plain or batched)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        COUNTS["batched" if _batched(x) else "forward"] += 1
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.x = inputs[0]

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        COUNTS["batched" if _batched(g) else "backward"] += 1
        return g * torch.cos(x)

    @staticmethod
    def jvp(ctx, t):
        COUNTS["batched jvp" if _batched(t) else "jvp"] += 1
        return t * torch.cos(ctx.x)


class CountingStatSin(CountingSin):
    """(mean of x, sin x), counting: the mean a float output that does not require grad (as
    native_layer_norm's mean and rstd)."""

    @staticmethod
    def forward(x):
        COUNTS["batched" if _batched(x) else "forward"] += 1
        return x.mean(), torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[0])
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g_stat, g):
        return CountingSin.backward(ctx, g)


class KernelCube(torch.autograd.Function):
    """x³ whose forward and backward run outside torch (as a C++, CUDA or Triton kernel does): no
    vmap rule, no forward AD, no double backward. A call under torch.func's transforms (vmap, or
    its jvp under vmap) raises as it enters the op, before forward runs: `apply` counts it."""

    @classmethod
    def apply(cls, x):
        if torch._C._functorch.maybe_current_level() is not None:
            COUNTS["batched"] += 1
        return super().apply(x)

    @staticmethod
    def forward(ctx, x):
        COUNTS["forward"] += 1
        ctx.save_for_backward(x)
        return torch.from_numpy(x.detach().numpy() ** 3)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        COUNTS["batched" if _batched(g) else "backward"] += 1  # a batched cotangent: it raises below
        return torch.from_numpy(3 * x.numpy() ** 2 * g.numpy())


class _NoVmap(torch.autograd.Function):
    """A Function without a vmap rule: a call under torch.func's transforms raises as it enters,
    and `apply` counts it."""

    @classmethod
    def apply(cls, x):
        if torch._C._functorch.maybe_current_level() is not None:
            COUNTS["batched"] += 1
        return super().apply(x)


class CountingSinNoVmap(_NoVmap):
    """sin with forward AD and a differentiable backward but no vmap rule (as an aten op without a
    batching rule): its JVPs do not batch, its backward does (the legacy batched backward)."""

    @staticmethod
    def forward(ctx, x):
        COUNTS["forward"] += 1
        ctx.save_for_backward(x)
        ctx.x = x
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        COUNTS["batched" if _batched(g) else "backward"] += 1
        return g * torch.cos(x)

    @staticmethod
    def jvp(ctx, t):
        COUNTS["jvp"] += 1
        return t * torch.cos(ctx.x)


class CountingRowScanNoVmap(_NoVmap):
    """cumsum along rows with no vmap rule, its backward the reverse scan (which batches): a
    block-diagonal Jacobian whose columns fall in as many groups as a row has elements."""

    @staticmethod
    def forward(ctx, x):
        COUNTS["forward"] += 1
        return x.cumsum(-1)

    @staticmethod
    def backward(ctx, g):
        COUNTS["batched" if _batched(g) else "backward"] += 1
        return g.flip(-1).cumsum(-1).flip(-1)


class CountingScan(torch.autograd.Function):
    """cumsum with a backward alone (the reverse scan, no derivative of its own), vmappable, whose
    backward the legacy vmap runs one row at a time (no batching rule for cumsum there)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        COUNTS["batched" if _batched(x) else "forward"] += 1
        return x.cumsum(-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        COUNTS["batched" if _batched(g) else "backward"] += 1
        return g.flip(-1).cumsum(-1).flip(-1)


def _counted() -> tuple[int, int, int, int]:
    """What the op saw, as Calls counts it: (forward, backward, jvp, batched); a JVP runs the forward too."""
    return (
        COUNTS["forward"] - COUNTS["jvp"],
        COUNTS["backward"],
        COUNTS["jvp"],
        COUNTS["batched"],
    )


def _plan(probe: Probe, fails: bool = False, second: Probe | None = None, **kwargs) -> Plan:
    """The estimate's plan of gradcheck_report(**kwargs) on the probed function (estimate.plans_of's):
    the engine's check of its stand-in, counted; with `fails`, of a wrong gradient; with `second`,
    the probe of its first derivative, of gradgradcheck_report."""
    return dry_run(probe, kwargs, wrong=2.0 if fails else 1.0, second=second).plan(probe)


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()


CASES = {
    # full Jacobian, fused: the call, one vmapped evaluation of every column, two plain VJPs and
    # one batched backward of every row, the undefined-grad_output VJP
    "full Jacobian": (CountingSin.apply, (3, 4), dict(fast_mode="auto", check_batched_grad=True)),
    "full Jacobian, forward AD": (
        CountingSin.apply,
        (3, 4),
        dict(fast_mode="auto", check_forward_ad=True, check_backward_ad=False),
    ),
    "projections": (CountingSin.apply, (16, 16), dict(fast_mode="auto", check_batched_grad=True)),
    "projections, forward AD": (
        CountingSin.apply,
        (16, 16),
        dict(fast_mode="auto", check_forward_ad=True, check_backward_ad=False),
    ),
    # fast_mode=False: the full check's fused pass, as auto's for a small Jacobian
    "full mode": (CountingSin.apply, (3, 4), dict(fast_mode=False, check_batched_grad=True)),
    # ... and with a kernel that cannot be vmapped, step by step after one vmap attempt
    "full mode, step by step": (KernelCube.apply, (3, 4), dict(fast_mode=False)),
    "fast mode": (CountingSin.apply, (3, 4), dict(fast_mode=True, check_batched_grad=True)),
    # a kernel with a backward alone: nothing batches, J·U comes from a backward per output row
    "backward-only kernel": (KernelCube.apply, (10, 10), dict(fast_mode="auto")),
    "backward-only kernel, small": (KernelCube.apply, (3, 4), dict(fast_mode="auto")),
    # forward AD whose JVPs do not batch while backward does: J·U from the VJP of the VJP, not a
    # JVP per direction (route.unbatched_jvps_as_source)
    "projections, unbatched forward AD": (CountingSinNoVmap.apply, (16, 16), dict(fast_mode="auto")),
    # no vmap rule, backward alone, backward batches: the differences by groups of columns sharing
    # no row (one group for sin's diagonal, one per row element for a scan along rows), or by the
    # loop where that costs fewer calls (route.grouped_differences)
    "grouped differences": (CountingSinNoVmap.apply, (4, 5), dict(fast_mode="auto")),
    "grouped differences, block diagonal": (CountingRowScanNoVmap.apply, (3, 4), dict(fast_mode="auto")),
    "grouped differences, the loop cheaper": (CountingRowScanNoVmap.apply, (2, 6), dict(fast_mode="auto")),
    # a row or two (route.plain_backward_rows): plain VJPs, the first row twice, and a zero one;
    # fewer than FUSED_MIN_COLUMNS columns: their differences loop
    "full Jacobian, one row": (CountingSin.apply, (1,), dict(fast_mode="auto")),
    "full Jacobian, two rows": (CountingSin.apply, (2,), dict(fast_mode="auto")),
    "full Jacobian, three rows": (CountingSin.apply, (3,), dict(fast_mode="auto")),
    "full Jacobian, two rows, batched-gradient check": (
        CountingSin.apply,
        (2,),
        dict(fast_mode="auto", check_batched_grad=True),
    ),
    "backward-only kernel, two rows": (KernelCube.apply, (2,), dict(fast_mode="auto")),
    "full mode, one row": (CountingSin.apply, (1,), dict(fast_mode=False)),
    "full Jacobian, no row": (CountingSin.apply, (0,), dict(fast_mode="auto")),
    # a float output that does not require grad: its differences computed, and left aside
    "full Jacobian, an output without grad": (CountingStatSin.apply, (3, 4), dict(fast_mode="auto")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_planned_calls_are_the_calls_the_op_sees(name):
    fn, shape, kwargs = CASES[name]
    x = _x(*shape)
    plan = _plan(Probe(fn, (x,)), **kwargs)
    COUNTS.clear()
    report = engine.gradcheck_report(fn, (x,), **kwargs)
    assert report.passed, report.message
    assert Calls.of(plan).astuple()[:4] == _counted(), (plan.evals, plan.path, report.stats)


class WrongSin(CountingSin):
    """CountingSin whose backward is 10% off."""

    @staticmethod
    def backward(ctx, g):
        return CountingSin.backward(ctx, g) * 1.1


class WrongKernelCube(KernelCube):
    """KernelCube whose backward is 10% off."""

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return KernelCube.backward.__wrapped__(ctx, g) * 1.1


FAILING = {
    # (the wrong function, the right one the probe times, shape): the fused pass falls back, the
    # step-by-step full check names the entries; fast mode recomputes the failing block in full
    "sin": (WrongSin.apply, CountingSin.apply, (3, 4)),
    "backward-only kernel, small": (WrongKernelCube.apply, KernelCube.apply, (3, 4)),
    "backward-only kernel": (WrongKernelCube.apply, KernelCube.apply, (16, 16)),
    # the fused pass's columns by plain calls (fewer than FUSED_MIN_COLUMNS; a kernel that cannot be
    # vmapped): the step-by-step full check reads them instead of making them again
    "sin, two columns": (WrongSin.apply, CountingSin.apply, (2,)),
    "backward-only kernel, two columns": (WrongKernelCube.apply, KernelCube.apply, (2,)),
}


@pytest.mark.parametrize("fast_mode", ["auto", False, True])
@pytest.mark.parametrize("name", list(FAILING))
def test_a_failing_checks_planned_calls_are_the_calls_the_op_sees(name, fast_mode):
    wrong, right, shape = FAILING[name]
    x = _x(*shape)
    plan = _plan(Probe(right, (x,)), fails=True, fast_mode=fast_mode)
    COUNTS.clear()
    report = engine.gradcheck_report(wrong, (x,), fast_mode=fast_mode)
    assert not report.passed
    assert Calls.of(plan).astuple()[:4] == _counted(), (plan.evals, plan.path, report.stats)
    assert "side checks" not in plan.steps  # the call ends at the comparison that fails


class UnbatchedBackwardSin(CountingSin):
    """CountingSin whose backward has no batching rule (as a custom op's registered backward that
    calls a kernel of its own): its forward vmaps, a batched cotangent raises. Differentiable."""

    @staticmethod
    def backward(ctx, g):
        if _batched(g):
            COUNTS["batched"] += 1
            raise RuntimeError("no batching rule for this backward")
        return CountingSin.backward(ctx, g)


class ComplexCountingSin(CountingSin):
    """CountingSin for complex inputs (the conjugate Wirtinger convention torch's backward uses)."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        COUNTS["batched" if _batched(g) else "backward"] += 1
        return g * torch.cos(x).conj()


FORWARD_SIDE = (Kind.FORWARD, Kind.JVP, Kind.VMAP, Kind.VMAP_JVP, Kind.VMAP_TANGENTS)
"""The plan's kinds of evaluation that call the op itself (a batched one once); the first
derivative's backward passes run the op's backward and double backward, inside autograd."""

SECOND_ORDER = {
    # gradgradcheck's function batches through its vmap form (torch.func's vjp)
    "batched": (CountingSin.apply, _x, (3, 4)),
    # ... and with complex inputs, through their real views, which keep that form
    "complex": (
        ComplexCountingSin.apply,
        lambda *s: torch.randn(*s, dtype=torch.complex128, generator=torch.Generator().manual_seed(0)).requires_grad_(),
        (3, 4),
    ),
    # the vmap form's attempt runs the op's forward, then its backward raises: the loops after it
    "backward without a batching rule": (UnbatchedBackwardSin.apply, _x, (3, 4)),
    "backward without a batching rule, projections": (UnbatchedBackwardSin.apply, _x, (8, 10)),
}


@pytest.mark.parametrize("name", list(SECOND_ORDER))
def test_a_second_order_checks_planned_calls_are_the_calls_the_op_sees(name):
    """gradgradcheck: the op's call that draws the grad_outputs, then the plan of the first
    derivative's check, batched attempts that raise included (each runs the op once)."""
    from opcheck.engine.second_order import first_derivative

    kernel, make, shape = SECOND_ORDER[name]
    x = make(*shape)

    def fn(x):  # every call of the op Python sees: plain, forward-mode or vmapped (once a batch)
        COUNTS["op"] += 1
        return kernel(x)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        first = first_derivative(fn, (x,), None, False)
    plan = _plan(Probe(fn, (x,)), second=Probe(first.func, first.inputs), fast_mode="auto")
    planned = sum(n for (kind, _), n in plan.evals.items() if kind in FORWARD_SIDE)  # the draw's call too
    COUNTS.clear()
    torch.manual_seed(0)
    report = engine.gradgradcheck_report(fn, (x,), fast_mode="auto")
    assert report.passed, report.message
    assert planned == COUNTS["op"], (plan.evals, plan.path, report.stats)


class WrongShapeKernelCube(KernelCube):
    """KernelCube whose backward returns a gradient of the wrong shape: autograd raises in every
    plain backward (as ScatterAddBackward0 does when src is larger than index)."""

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return KernelCube.backward.__wrapped__(ctx, g)[..., :-1]


@pytest.mark.parametrize("fast_mode", ["auto", False, True])
def test_a_crashing_checks_planned_calls_end_where_the_engine_lets_the_backward_raise(fast_mode):
    """The fused passes fall back from the raising backward; the step-by-step check's (or fast
    mode's) first plain backward raises, and the call ends there."""
    x = _x(3, 4)
    plan = _plan(Probe(WrongShapeKernelCube.apply, (x,)), fails=True, fast_mode=fast_mode)
    COUNTS.clear()
    with pytest.raises(RuntimeError, match="invalid gradient"):
        engine.gradcheck_report(WrongShapeKernelCube.apply, (x,), fast_mode=fast_mode)
    assert plan.crashed and "side checks" not in plan.steps
    assert Calls.of(plan).astuple()[:4] == _counted(), (plan.evals, plan.path)


ROUTES = {
    # the full check first nowhere: the small Jacobian takes the projections' pass
    "no full check first": ("full Jacobian", "FULL_CHECK_ELEMENTS", 0),
    # ... and up to 1024 elements: the 16x16 input takes the full check's pass
    "a larger full check first": ("projections", "FULL_CHECK_ELEMENTS", 1024),
    # a kernel's unbatched columns looped over up to 4 per input: its 12 take the projections
    "shorter loops": ("backward-only kernel, small", "LOOP_COLUMNS_PER_INPUT", 4),
}


@pytest.mark.parametrize("name", list(ROUTES))
def test_the_engine_and_the_estimate_take_one_route(name, monkeypatch):
    """Both follow opcheck.engine.route: a decision moved there moves the engine's evaluations and
    the plan's alike (neither decides it again)."""
    case, constant, value = ROUTES[name]
    fn, shape, kwargs = CASES[case]
    x = _x(*shape)
    before = _plan(Probe(fn, (x,)), **kwargs).path
    monkeypatch.setattr(route, constant, value)
    plan = _plan(Probe(fn, (x,)), **kwargs)
    assert plan.path != before, plan.path
    COUNTS.clear()
    report = engine.gradcheck_report(fn, (x,), **kwargs)
    assert report.passed, report.message
    assert Calls.of(plan).astuple()[:4] == _counted(), (plan.evals, plan.path, report.stats)


def test_a_backward_only_kernel_loops_over_its_rows():
    x = _x(10, 10)
    plan = _plan(Probe(KernelCube.apply, (x,)), fast_mode="auto")
    calls = Calls.of(plan)
    # one backward per output element; batched, only the tries that raise: the fused pass's, the
    # differences', the JVPs' and the backward's
    assert calls.batched <= 4 and calls.backward > 100
    assert plan.path == ["auto: projections (J·U from VJP rows)"]
    assert Calls.of(_plan(Probe(KernelCube.apply, (x,)), fast_mode=True)).backward < 10


class _PerRow:
    """A probe's batched evaluation at `seconds` a row."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def at(self, rows: int, measure: bool = True) -> float:
        return self.seconds * rows


def test_a_backward_alone_takes_the_cheaper_of_its_rows_and_every_columns_differences():
    # fused_projected: backward's m rows against the 2n rows of every column's differences, each
    # priced per row (the engine times its two batched calls; here its clock is pinned, and the
    # plan's probe priced, the same way both times).
    from opcheck.engine.batching import batching_clock

    x = _x(10, 12)
    kwargs = dict(fast_mode="auto", check_batched_grad=True)
    for forward_row, backward_row, path in [
        (1e-6, 1.0, "auto: projections (JᵀV against finite-difference columns, fused)"),
        (1.0, 1e-6, "auto: projections (J·U from VJP rows, fused)"),
    ]:
        probe = Probe(CountingScan.apply, (x,))
        probe.vmap, probe.batched_backward = _PerRow(forward_row), _PerRow(backward_row)
        plan = _plan(probe, **kwargs)
        assert plan.path == [path], plan.path
        COUNTS.clear()
        with batching_clock(Spans(17 * forward_row, 10 * backward_row)):
            report = engine.gradcheck_report(CountingScan.apply, (x,), **kwargs)
        assert report.passed, report.message
        # (CountingScan has no forward AD: the JVP the engine tries is a call of forward that it sees)
        forward, backward, jvp, batched = Calls.of(plan).astuple()[:4]
        seen = _counted()
        assert (forward + jvp, backward, batched) == (seen[0] + seen[2], seen[1], seen[3]), (plan.evals, report.stats)


def test_the_paths_follow_the_engines_sizes_and_budget():
    def path(probe: Probe, **kwargs) -> list[str]:
        return _plan(probe, **{"fast_mode": "auto", **kwargs}).path

    small, large = Probe(torch.sin, (_x(3, 4),)), Probe(torch.sin, (_x(40, 40),))
    assert path(small) == ["auto: full Jacobian"]
    assert path(large) == ["auto: projections (J·U from forward AD, fused)"]
    assert path(small, fast_mode=False) == ["full Jacobian"]
    complex_ = Probe(torch.sin, (torch.randn(3, 4, dtype=torch.complex128, requires_grad=True),))
    # the fused passes see complex inputs through torch.view_as_real, but not a conjugate view
    assert path(complex_) == ["auto: full Jacobian"]
    conj = Probe(torch.sin, (torch.randn(3, 4, dtype=torch.complex128).conj().requires_grad_(),))
    assert path(conj) == ["auto: full Jacobian"]
    kernel = Probe(KernelCube.apply, (_x(12, 12),))
    assert path(kernel, jacobian_budget=10) == ["auto: projections (J·U from VJP rows)"]
    assert path(kernel, fast_mode=False) == ["full Jacobian"]
    # forward AD alone: the full check first up to 32 input elements only (route.Sizes.full_first)
    forward_only = dict(check_backward_ad=False, check_forward_ad=True)
    assert path(Probe(torch.sin, (_x(4, 8),)), **forward_only) == ["auto: full Jacobian"]
    assert path(Probe(torch.sin, (_x(6, 8),)), **forward_only) == ["auto: projections (J·U from forward AD, fused)"]
    assert path(Probe(torch.sin, (_x(6, 8),))) == ["auto: full Jacobian"]


def test_a_probe_learns_what_batches():
    sin, kernel = Probe(CountingSin.apply, (_x(3, 4),)), Probe(KernelCube.apply, (_x(3, 4),))
    assert sin.vmap is not None and sin.vmap_jvp is not None and sin.batched_backward is not None
    assert sin.jvp is not None and sin.jvp_right and sin.double_backward == "ok"
    assert kernel.vmap is None and kernel.vmap_tangents is None and kernel.jvp is None and not kernel.jvp_right
    assert kernel.double_backward == "wrong"  # once_differentiable: a graph, but no derivative through it
    assert (sin.n, sin.m, sin.n_inputs, sin.n_outputs) == (12, 12, 1, 1)


def test_a_batched_evaluation_is_priced_between_its_timed_sizes():
    b = Batched(lambda rows: None, None, small=1.0)
    b._times[16] = 2.3  # as if timed: 1.0 s at SMALL_BATCH rows, 2.3 s at 16
    per_row = (2.3 - 1.0) / (16 - SMALL_BATCH)
    assert b.at(1) == 1.0 and b.at(SMALL_BATCH) == 1.0
    assert b.at(9) == pytest.approx(1.0 + per_row * (9 - SMALL_BATCH))
    assert b.at(16) == pytest.approx(2.3)


def test_calls_add_up_and_describe_themselves():
    plan = Plan()
    plan.add(Kind.FORWARD, 2, each=1.0)
    plan.add(Kind.VMAP, rows=17, each=3.0)
    plan.add(Kind.BATCHED_BACKWARD, 2, rows=5, each=0.5)
    plan.add(Kind.DOUBLE_BACKWARD, rows=8, each=0.25)
    calls = Calls.of(plan)
    assert calls == Calls(forward=2, batched=3, rows=27, double_backward=1)
    assert plan.seconds == 2 * 1.0 + 3.0 + 2 * 0.5 + 0.25
    assert (calls + calls).astuple() == (4, 0, 0, 6, 54, 2)
    assert calls.describe() == "2 fwd, 0 bwd, 0 jvp, 3 batched (27 rows), 1 double bwd"
    assert [format_seconds(s) for s in (250, 1.25, 0.045, 0.0008)] == ["250 s", "1.2 s", "45 ms", "0.8 ms"]


# ------------------------------------------------------------------------------ generated tests
SOURCE = "op_specs/cost.yaml"


def _spec(**changes) -> OpSpec:
    fields = dict(
        name="sin",
        op="torch.sin",
        source=SOURCE,
        sha256="0",
        samples=(
            Sample("small", args=(TensorArg(shape=(3, 4)),), location=Location(SOURCE, 5, 5)),
            Sample("large", args=(TensorArg(shape=(24, 24)),), location=Location(SOURCE, 6, 5)),
        ),
        dtypes=("float64",),
        devices=("cpu", "cuda"),
        gradcheck=GradcheckFlags(check_forward_ad=True),
        gradgradcheck=GradgradcheckFlags(check_fwd_over_rev=True),
        location=Location(SOURCE, 1, 1),
    )
    fields.update(changes)
    return OpSpec(**fields)


def _by_name(estimates: list[Estimate]) -> dict[str, Estimate]:
    return {e.case.name: e for e in estimates}


def test_every_test_of_a_spec_is_estimated_or_says_why_not(monkeypatch):
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cuda")
    skip = Rule(Where(check=("gradgradcheck",), sample=("large",)), reason="too slow", location=Location(SOURCE, 9, 5))
    spec = _spec(skips=(skip,))
    found = _by_name(estimate_spec(spec, Settings()))
    assert set(found) == {case.name for case in cases_of(spec)}
    assert found["test_gradgradcheck[cpu-float64-large]"].skipped == "skipped by the spec: too slow"
    assert found["test_gradgradcheck[cpu-float64-large]"].not_estimated == "spec"
    assert "not available" in (found["test_gradcheck[cuda-float64-small]"].skipped or "")
    assert found["test_gradcheck[cuda-float64-small]"].not_estimated == "unavailable"
    done = [e for e in found.values() if e.skipped is None]
    assert {e.case.check for e in done} == {"gradcheck", "forward_ad", "gradgradcheck", "fwgrad_bwgrad"}
    for e in done:
        assert e.seconds > e.evaluations > 0 and e.calls.total > 0 and e.path, e
    gradgrad = found["test_gradgradcheck[cpu-float64-small]"]
    assert gradgrad.path == ("auto: full Jacobian",)  # on the first derivative: 12 + 12 in, 12 out
    # a first-order check's path is the engine's on a stand-in, in the words of the test's policy row
    assert found["test_gradcheck[cpu-float64-small]"].path == ("auto: full Jacobian",)
    large = found["test_gradcheck[cpu-float64-large]"]
    assert large.path == ("auto: projections (J·U from forward AD, fused)",)
    made = Case.of(spec, "gradcheck", "cpu", "float64", "large")
    tol = resolve_tolerances(spec, "gradcheck", "cpu", "float64", "large")
    (call,) = build_calls(spec, spec.sample("large"), "cpu", "float64", large.case.seed())
    _, kwargs = engine_call(made, tol, Policy("auto", "default"))
    report = engine.gradcheck_report(call.as_function(), call.gradcheck_inputs(), **kwargs)
    assert large.path == tuple(f"auto: {words}" for words in paths_taken("auto", report))
    assert _by_name(estimate_spec(spec, Settings(), devices=["cpu"])).keys() == {
        case.name for case in cases_of(spec) if case.device == "cpu"
    }


def test_an_expensive_test_says_what_would_make_it_cheaper():
    spec = _spec(op="test_cost:KernelCube.apply", name="kernel", gradcheck=GradcheckFlags())
    case = CaseId("kernel", "gradcheck", "cpu", "float64", "large")
    cheap = estimate(spec, case, Settings())
    assert cheap.advice == () and cheap.calls.backward > 500  # a backward per output element
    costly = estimate(spec, case, Settings(), threshold=cheap.seconds / 10)
    text = "\n".join(costly.advice)
    assert "the engine loops" in text and "no vmap rule" in text and "no forward AD" in text
    assert "`gradcheck: {fast_mode: true}`: ~" in text and "a smaller sample" in text
    fast = estimate(spec, case, Settings(policy="fast"))
    assert fast.path == ("fast mode (random projections)",)
    assert fast.calls.total < 20


def test_the_flags_are_the_runtimes():
    spec = _spec(gradcheck=GradcheckFlags(check_forward_ad=True, check_batched_grad=False))
    estimated = CaseId("sin", "gradcheck", "cpu", "float64", "small")
    for check, backward, forward in (
        ("gradcheck", "check_backward_ad", "check_forward_ad"),
        ("forward_ad", "check_forward_ad", "check_backward_ad"),
        ("gradgradcheck", "check_rev_over_rev", "check_fwd_over_rev"),
        ("fwgrad_bwgrad", "check_fwd_over_rev", "check_rev_over_rev"),
    ):
        case = Case.of(spec, check, "cpu", "float64", "small")
        tol = resolve_tolerances(spec, check, "cpu", "float64", "small")
        _, kwargs = engine_call(case, tol, Policy("auto", "", budget=1000))
        assert kwargs[backward] is True and kwargs.get(forward, False) is False, (check, kwargs)
        assert (kwargs["fast_mode"], kwargs["jacobian_budget"]) == ("auto", 1000)
        assert not kwargs.get("check_batched_grad")
        # ... and the estimate's dry runs are called with them
        assert engine_kwargs(spec, replace(estimated, check=check), Settings(budget=1000)) == dict(kwargs)


def test_the_machine_factor_is_a_bounded_ratio():
    assert 0.25 <= machine_factor() <= 8.0


def test_a_slow_op_on_the_cpu_is_told_of_another_device_only_one_this_machine_has(monkeypatch):
    from opcheck.runtime import devices
    from opcheck.runtime.cost.estimate import _slow_op

    spec = _spec(devices=("cpu", "cuda", "mps"))
    cpu, cuda = (CaseId("k", "lowprec", device, "float32", "big") for device in ("cpu", "cuda"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(devices, "unavailable_reason", lambda device: None if device in ("cpu", "mps") else "no")
    said = _slow_op(spec, cpu, 0.25, "the op's run at float32")
    assert said == (
        "another device: the op's run at float32 takes 250 ms on the cpu (Triton runs its kernels in the "
        "interpreter there); leave cpu out of `devices:`, or run with `--opcheck-device mps`"
    )
    assert _slow_op(spec, cpu, 0.001, "one forward") is None and _slow_op(spec, cuda, 0.25, "one forward") is None
    monkeypatch.setattr(devices, "unavailable_reason", lambda device: None if device == "cpu" else "no")
    said = _slow_op(spec, cpu, 0.25, "the op's run at float32")
    assert said is not None and said.startswith("a smaller sample: the op's run at float32 takes 250 ms on the cpu")
    assert "cuda" not in said and "mps" not in said and "device:" not in said


def test_the_estimate_decides_skips_and_expected_failures_as_the_generated_marks_do():
    # One implementation (opcheck.spec.case.deciding_rules) for both: the marks pytest evaluates
    # (tests/codegen/test_parametrize.py runs them: b and c skip, a runs) and `opcheck list`.
    from opcheck.spec.loader import load_spec_text
    from tests.codegen.test_parametrize import TORCH_CONDITIONS

    (spec,) = load_spec_text(TORCH_CONDITIONS, source="op_specs/demo.yaml")
    found = estimate_spec(spec, Settings())
    assert {e.case.sample for e in found if e.not_estimated == "spec"} == {"b", "c"}
    assert not any("expected to fail" in " ".join(e.path) for e in found)
    holds = TORCH_CONDITIONS.replace(
        '{sample: a, torch: ">=999.0"}\n    reason: never expected', "{sample: a}\n    reason: never expected"
    )
    (spec,) = load_spec_text(holds, source="op_specs/demo.yaml")
    found = estimate_spec(spec, Settings())
    assert {e.case.sample for e in found if "expected to fail" in " ".join(e.path)} == {"a"}
    # ... and prices an expected failure as one: the comparison that fails, then the step-by-step
    # one that names the entries, and no side check after them
    failing = [e for e in found if e.not_estimated is None and e.case.check == "gradcheck"]
    assert [e.case.sample for e in failing] == ["a"], failing
    assert "side checks" not in dict(failing[0].counts) and "comparison" in dict(failing[0].counts), failing
