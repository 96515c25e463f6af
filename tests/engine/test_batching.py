"""Batched evaluation: used where it can be, abandoned where it can't, never changing a verdict."""

from __future__ import annotations

import subprocess
import sys

import corpus
import pytest
import torch

import opcheck
import opcheck.engine.batching as batching
from opcheck.engine import api, route
from opcheck.engine._util import as_tuple
from opcheck.engine.batching import Evaluator, adaptive_clock, batching_clock
from opcheck.engine.context import CheckContext
from opcheck.engine.evaluation.analytical import analytical_jvp_jacobian, analytical_vjp_jacobian
from opcheck.engine.evaluation.numerical import numerical_jacobian
from opcheck.engine.flags import CheckFlags


class _Ticks:
    """A clock that advances one second at every reading.

    Every span the adaptive rule measures lasts one second, so a batched call of b columns costs
    1/b s per column against 1 s for a plain column: batching is never judged slower than the loop.
    """

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class _Spans:
    """A clock under which each batched call lasts `batched` seconds and each plain call `plain`.

    The adaptive rule reads the clock in pairs, around a batched call and then around the plain
    call that probes it, so the first span of every two is a batched call's. That holds as long as
    no batched call raises (one that does has no plain call after it): the tests that count on
    the numbers check functions that batch.
    """

    def __init__(self, batched: float, plain: float):
        self.now, self.readings = 0.0, 0
        self._steps = (0.0, batched, 0.0, plain)  # added before each of the four readings of a decision

    def __call__(self) -> float:
        self.now += self._steps[self.readings % 4]
        self.readings += 1
        return self.now


@pytest.fixture(autouse=True)
def _the_full_check_step_by_step(monkeypatch):
    # These tests hold the batching of the step-by-step full check, which fast_mode=False runs where
    # the full check's fused pass does not pass the call (test_full_mode.py holds the fused pass).
    monkeypatch.setattr(route, "full_mode_fused", lambda sizes: False)


@pytest.fixture(autouse=True)
def _batching_never_looks_slower():
    # What is batched must not depend on how loaded the machine is; the tests of the other
    # decision pin their own clock inside.
    with batching_clock(_Ticks()):
        yield


def _x(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()


def _flattened(fn):
    """fn with nested tuple outputs (torch.max with dim) flattened into one tuple of tensors."""

    def wrapped(*args):
        out = as_tuple(fn(*args))
        return tuple(t for o in out for t in (o if isinstance(o, tuple) else (o,)))

    return wrapped


def _ctx(batch: bool, budget: int = batching.DEFAULT_MEMORY_BUDGET) -> CheckContext:
    return CheckContext(CheckFlags(), Evaluator(batch=batch, memory_budget=budget, adaptive=False))


FUNCS = {
    "matmul_sin": (lambda a, b: (a @ b).sin(), lambda: (_x(3, 4, seed=1), _x(4, 2, seed=2))),
    "softmax_noncontig": (lambda a: torch.softmax(a, 0), lambda: (_x(5, 3, seed=3).detach().t().requires_grad_(),)),
    "complex_in": (
        lambda z: (z * z.conj()).real * z.abs(),
        lambda: (_x(8, seed=4).to(torch.complex128).detach().requires_grad_(),),
    ),
    "multi_out": (lambda a: (a.exp(), a.max(dim=0)), lambda: (_x(3, 3, seed=5),)),
    # backward returns a view of its grad_output: the one-hot rows' buffer, reused chunk after chunk
    "transpose_view": (lambda a: a.t(), lambda: (_x(4, 3, seed=6),)),
}


def test_one_hot_rows_reuse_one_buffer_and_move_only_the_ones():
    rows = batching.OneHotRows(7, torch.empty(0, dtype=torch.float32))
    eye = torch.eye(7)
    first = rows.take(3, 0)
    assert first.dtype == torch.float32 and torch.equal(first, eye[0:3])
    second = rows.take(3, 3)
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, eye[3:6])
    last = rows.take(3, 6)  # rows past n stay zero
    assert torch.equal(last, torch.cat([eye[6:7], torch.zeros(2, 7)]))
    grown = rows.take(5, 1)  # a chunk that grows gets a larger buffer
    assert torch.equal(grown, eye[1:6])
    assert torch.equal(rows.take(2, 0), batching.one_hot_rows(2, 7, 0, torch.empty(0)).float())


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("budget", [batching.DEFAULT_MEMORY_BUDGET, 64])  # 64 bytes: one column per chunk
def test_batched_jacobians_equal_the_loop(name, budget):
    fn, make = FUNCS[name]
    inputs = make()
    wrapped = _flattened(fn)
    flat_outputs = wrapped(*inputs)
    batched, loop = _ctx(True, budget), _ctx(False)
    nb = numerical_jacobian(batched, wrapped, inputs, flat_outputs)
    nl = numerical_jacobian(loop, wrapped, inputs, flat_outputs)
    assert batched.evaluator.stats.batched_calls > 0 and loop.evaluator.stats.batched_calls == 0
    assert not batched.evaluator.stats.fallbacks
    for per_b, per_l in zip(nb, nl):
        for b, lo in zip(per_b, per_l):
            torch.testing.assert_close(b, lo, rtol=1e-9, atol=1e-9)
    for o in (t for t in flat_outputs if t.requires_grad):
        ab = analytical_vjp_jacobian(batched, inputs, o, nondet_tol=0.0)
        al = analytical_vjp_jacobian(loop, inputs, o, nondet_tol=0.0)
        for b, lo in zip(ab, al):
            torch.testing.assert_close(b, lo, rtol=1e-12, atol=1e-12)
    if not any(a.is_complex() for a in inputs):
        jb = analytical_jvp_jacobian(batched, wrapped, inputs, flat_outputs)
        jl = analytical_jvp_jacobian(loop, wrapped, inputs, flat_outputs)
        for per_b, per_l in zip(jb, jl):
            for b, lo in zip(per_b, per_l):
                torch.testing.assert_close(b, lo, rtol=1e-12, atol=1e-12)
    if budget == 64:
        assert batched.evaluator.stats.batched_calls > len(inputs)  # really chunked


def test_full_mode_uses_a_few_batched_calls_not_two_per_element():
    x = _x(16, 16)
    report = opcheck.gradcheck_report(torch.tanh, (x,))
    assert report.passed
    # torch's slow mode makes 2 * 256 forward calls and 2 * 256 backward calls here. Beyond 64
    # columns the first batches are a pilot of 8 and larger ones (batching.Schedule); the
    # reentrancy pass repeats the first pass's batches.
    assert report.stats.calls < 10 and report.stats.batched_calls <= 3
    assert report.stats.vjp_calls < 10 and report.stats.batched_vjp_calls <= 6


class _NoVmap(torch.autograd.Function):
    """Correct, but without vmap support: batched evaluation must fall back to the loop."""

    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


def test_function_without_vmap_support_falls_back_once():
    x = _x(8)
    report = opcheck.gradcheck_report(_NoVmap.apply, (x,))
    assert report.passed
    assert report.stats.fallbacks and report.stats.fallbacks[0].startswith("forward:")
    assert report.stats.calls >= 2 * 8  # the loop ran


def test_closure_that_ignores_its_argument_is_caught_by_the_probe():
    # Under vmap the captured tensor does not see the perturbation; the loop (torch's in-place
    # perturbation) does. The probe notices and the loop decides, as in torch.
    x = _x(8)
    fn = lambda _ignored: x.sin()  # noqa: E731
    torch_verdict = torch.autograd.gradcheck(fn, (x,), raise_exception=False)
    report = opcheck.gradcheck_report(fn, (x,))
    assert report.passed == torch_verdict
    assert any("differs from the plain call" in f for f in report.stats.fallbacks)


def test_data_dependent_function_falls_back():
    x = _x(8)

    def fn(a):
        return a * 2 if float(a.sum()) > -100 else a

    report = opcheck.gradcheck_report(fn, (x,))
    assert report.passed and report.stats.fallbacks


@pytest.mark.parametrize(
    "clock",
    [pytest.param(_Ticks, id="kept"), pytest.param(lambda: _Spans(batched=1.0, plain=1e-6), id="judged_slower")],
)
@pytest.mark.parametrize(
    "case", [c for c in corpus.CASES if c.checker == "gradcheck" and c.expected in (True, False)], ids=lambda c: c.id
)
def test_batching_never_changes_a_verdict(case, clock):
    # Under the second clock batching looks slower than the loop, so it is dropped midway and the
    # verdict comes from batched and looped parts mixed.
    flags = dict(case.flags)
    with batching.vmap_batching(False):
        loop = opcheck.gradcheck(case.func, case.make_inputs(), raise_exception=False, **flags)
    with batching_clock(clock()):
        batched = opcheck.gradcheck(case.func, case.make_inputs(), raise_exception=False, **flags)
    assert batched == loop == case.expected


def test_memory_budget_bounds_chunks(monkeypatch):
    monkeypatch.setattr(api, "DEFAULT_MEMORY_BUDGET", 8 * 64)
    report = opcheck.gradcheck_report(torch.sin, (_x(40),))
    assert report.passed
    # 40 columns of (40 + 40) doubles, 2 sides, at most 512 bytes per chunk: one column per chunk.
    assert report.stats.batched_calls >= 40


def test_tiny_inputs_use_the_loop():
    # Below MIN_BATCH_COLUMNS a vmapped call and its probe cost more than the plain calls.
    report = opcheck.gradcheck_report(torch.sin, (_x(batching.MIN_BATCH_COLUMNS - 1),))
    assert report.passed and report.stats.batched_calls == 0 and report.stats.batched_vjp_calls == 0


def test_reentrancy_passes_use_one_path_even_when_batching_is_dropped_midway():
    # The VJP of qr's VJP is batched for the first reentrancy pass, then judged slower than the
    # loop. The second pass must repeat the batched path: batched and looped rows differ in the
    # last bit here, which is no nondeterminism.
    a = _x(4, 3)
    assert torch.autograd.gradgradcheck(torch.linalg.qr, (a,))
    with batching_clock(_Spans(batched=1.0, plain=1e-6)):
        report = opcheck.gradgradcheck_report(torch.linalg.qr, (a,))
    assert report.passed, report.message
    assert [f.split(": ")[0] for f in report.stats.fallbacks] == ["forward", "vjp"]
    assert all("slower than the loop" in f for f in report.stats.fallbacks)
    assert report.stats.batched_vjp_calls == 2 and report.stats.vjp_calls == 1


def test_all_inputs_share_one_vmapped_call():
    # Three inputs of 16 elements: one vmapped forward call for all 48 columns plus one plain probe
    # call, rather than one vmapped call and a probe per input.
    a, b, c = _x(4, 4, seed=1), _x(4, 4, seed=2), _x(4, 4, seed=3)
    report = opcheck.gradcheck_report(lambda x, y, z: x * y.sin() + z, (a, b, c), check_forward_ad=True)
    assert report.passed and not report.stats.fallbacks
    assert report.stats.batched_calls == 1 and report.stats.calls == 1
    assert report.stats.batched_jvp_calls == 1 and report.stats.jvp_calls == 1


@pytest.mark.parametrize("fuse_max", [batching.FUSE_MAX_COLUMNS, 1])  # 1: one call per input
def test_fused_inputs_of_different_sizes_and_dtypes_equal_the_loop(fuse_max, monkeypatch):
    monkeypatch.setattr(batching.settings, "FUSE_MAX_COLUMNS", fuse_max)

    def fn(x, n, y, z):
        return (x.sum() * y.double() + n, z.expand(3, 2) * y.double())

    inputs = (_x(5, seed=1), 7, _x(3, 2, seed=2, dtype=torch.float32), _x(2, seed=3))
    outputs = fn(*inputs)
    batched, loop = _ctx(True, 256), _ctx(False)  # 256 bytes: several chunks, cutting through inputs
    nb = numerical_jacobian(batched, fn, inputs, outputs)
    nl = numerical_jacobian(loop, fn, inputs, outputs)
    jb = analytical_jvp_jacobian(batched, fn, inputs, outputs)
    jl = analytical_jvp_jacobian(loop, fn, inputs, outputs)
    assert batched.evaluator.stats.batched_calls > 1 and batched.evaluator.stats.batched_jvp_calls > 1
    assert not batched.evaluator.stats.fallbacks
    for got, want in ((nb, nl), (jb, jl)):
        for per_b, per_l in zip(got, want):
            for b, lo in zip(per_b, per_l):
                assert b.dtype == lo.dtype
                torch.testing.assert_close(b, lo, rtol=1e-6, atol=1e-6)


def test_inputs_beyond_the_fusion_limit_get_a_call_each():
    # Three inputs of 64 elements (192 columns): a vmapped call and a probe call per input, the
    # other inputs unbatched in it.
    a, b, c = _x(8, 8, seed=1), _x(8, 8, seed=2), _x(8, 8, seed=3)
    assert 3 * 64 > batching.FUSE_MAX_COLUMNS
    report = opcheck.gradcheck_report(lambda x, y, z: x @ y + z, (a, b, c), check_forward_ad=True)
    assert report.passed and not report.stats.fallbacks
    assert report.stats.batched_calls == 3 and report.stats.calls == 3
    assert report.stats.batched_jvp_calls == 3 and report.stats.jvp_calls == 3


def _seeded_dropout(x):
    torch.manual_seed(1234)  # the same mask on every call, as OpInfo's dropout samples arrange
    return torch.nn.functional.dropout(x, 0.5) * x


def test_seeded_random_function_is_batched_with_one_draw_per_batch():
    with torch.random.fork_rng():
        torch_verdict = torch.autograd.gradcheck(_seeded_dropout, (_x(6, 5),), check_forward_ad=True)
        report = opcheck.gradcheck_report(_seeded_dropout, (_x(6, 5),), check_forward_ad=True)
    assert report.passed == torch_verdict is True
    assert not report.stats.fallbacks
    assert report.stats.batched_calls == 1 and report.stats.batched_jvp_calls == 1


def test_unseeded_random_function_falls_back_to_the_loop():
    # A fresh draw per call: the batched rows share one draw, the plain probe call gets another.
    def noisy(x):
        return x * torch.rand_like(x)

    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch_verdict = torch.autograd.gradcheck(noisy, (_x(6, 5),), raise_exception=False)
        torch.manual_seed(0)
        report = opcheck.gradcheck_report(noisy, (_x(6, 5),))
    assert report.passed == torch_verdict is False
    assert any("differs from the plain call" in f for f in report.stats.fallbacks)


def _sin_and_cos(x):
    return x.sin(), x.cos()


def test_batching_that_never_looks_slower_is_kept_for_every_output():
    report = opcheck.gradcheck_report(_sin_and_cos, (_x(4, 4),), check_forward_ad=True)
    assert report.passed and not report.stats.fallbacks
    # Per output: two batched reentrancy passes and one plain probe.
    assert report.stats.batched_vjp_calls == 2 * 2 and report.stats.vjp_calls == 2
    assert report.stats.batched_calls == 1 and report.stats.batched_jvp_calls == 1


def test_batching_judged_slower_than_the_loop_is_dropped_for_the_rest_of_the_call():
    # A batched call lasts 1.6 ms and a plain one 10 us. Forward: 16 columns in one call, each
    # column worth two plain calls. VJP: 16 rows. JVP: 16 columns and the probe's row.
    x = _x(4, 4)
    with batching_clock(_Spans(batched=1.6e-3, plain=1e-5)):
        report = opcheck.gradcheck_report(_sin_and_cos, (x,), check_forward_ad=True)
    assert report.stats.fallbacks == [
        "forward: slower than the loop (100 us vs 20 us per column)",
        "vjp: slower than the loop (100 us vs 10 us per column)",
        "jvp_func: slower than the loop (94 us vs 10 us per column)",
    ]
    # The first output's VJPs stay batched (both reentrancy passes); the second's are looped.
    assert report.stats.batched_vjp_calls == 2 and report.stats.vjp_calls == 1 + 2 * 16
    assert report.passed == torch.autograd.gradcheck(_sin_and_cos, (x,), check_forward_ad=True) is True


def test_every_kind_of_batching_can_be_judged_slower():
    # A complex input: the forward call batches 32 columns (real and imaginary directions), and
    # forward AD checks the real and the imaginary part of the input, through torch.func first
    # and, once that is dropped, through the legacy vmap.
    z = _x(4, 4, dtype=torch.complex128)
    fn = lambda z: z * z  # noqa: E731
    with batching_clock(_Spans(batched=1.6e-3, plain=1e-5)):
        report = opcheck.gradcheck_report(fn, (z,), check_forward_ad=True)
    assert report.stats.fallbacks == [
        "forward: slower than the loop (50 us vs 20 us per column)",
        "vjp: slower than the loop (100 us vs 10 us per column)",
        "jvp_func: slower than the loop (94 us vs 10 us per column)",
        "jvp: slower than the loop (94 us vs 10 us per column)",
    ]
    assert report.passed == torch.autograd.gradcheck(fn, (z,), check_forward_ad=True) is True


def test_batching_clock_is_read_inside_and_restored_after():
    outer, clock = adaptive_clock(), _Ticks()
    with batching_clock(clock):
        assert adaptive_clock() is clock
        assert opcheck.gradcheck(torch.sin, (_x(8),))
    assert adaptive_clock() is outer
    assert clock.now == 8  # two decisions (forward, VJP), each two spans of two readings


class _SpanList:
    """A clock whose spans (two readings each) last the given seconds, in order, then 1 us."""

    def __init__(self, *spans: float):
        self.now, self.readings, self.spans = 0.0, 0, list(spans)

    def __call__(self) -> float:
        if self.readings % 2 == 1:
            k = self.readings // 2
            self.now += self.spans[k] if k < len(self.spans) else 1e-6
        self.readings += 1
        return self.now


def test_a_pilot_batch_decides_before_a_large_batch_runs():
    # 256 columns: a vmapped call of 8 columns (the pilot) that costs 200 us a column against a
    # plain column's 20 us hands the rest to the loop; the other 248 never run batched.
    x = _x(16, 16)
    with batching_clock(_Spans(batched=1.6e-3, plain=1e-5)):
        report = opcheck.gradcheck_report(torch.sin, (x,))
    assert report.passed
    assert report.stats.fallbacks[:2] == [
        "forward: slower than the loop (200 us vs 20 us per column)",
        "vjp: slower than the loop (200 us vs 10 us per column)",
    ]
    assert report.stats.batched_calls == 1 and report.stats.batched_vjp_calls == 1
    assert report.stats.calls == 1 + 2 * 256  # the probe, then every column in the loop


def test_a_batch_that_grows_is_timed_until_it_is_full_size():
    # The pilot's 8 columns cost 10 us each, half a plain column's 20 us, so the next batch is
    # twice as large; it costs 4 ms a column (a batching rule whose cost grows with the batch), and
    # the loop takes over there, before the remaining columns run batched.
    x = _x(16, 16)
    with batching_clock(_SpanList(8e-5, 1e-5, 64e-3)):
        report = opcheck.gradcheck_report(torch.sin, (x,))
    assert report.passed
    assert report.stats.fallbacks[0] == "forward: slower than the loop (4000 us vs 20 us per column)"
    assert report.stats.batched_calls == 2


def test_a_batch_grows_by_the_factor_it_undercuts_the_loop():
    schedule = batching.Schedule(1000, 400)
    sizes = []
    for start, stop, timed in schedule:
        sizes.append((stop - start, timed))
        if timed:
            schedule.measured(1e-6, 4e-6)  # a batched column costs a quarter of a plain one
    assert sizes == [(8, True), (32, True), (128, True), (400, False), (400, False), (32, False)]


def test_without_a_plain_probe_a_batch_grows_while_its_columns_cost_no_more():
    schedule = batching.Schedule(1000, 600)
    sizes = []
    for start, stop, timed in schedule:
        sizes.append((stop - start, timed))
        if timed:  # 10 us a column up to 64 columns, then 30 us: the batch stops growing there
            schedule.measured_alone(1e-5 if stop - start <= 64 else 3e-5)
    assert sizes == [(8, True), (64, True), (512, True), (416, True)]
    schedule = batching.Schedule(1000, 600)
    sizes = []
    for start, stop, _ in schedule:
        sizes.append(stop - start)
        schedule.measured_alone(1e-5 * (stop - start))  # a column's cost grows with the batch
    assert sizes[:3] == [8, 64, 64] and sum(sizes) == 1000


def test_the_fused_pass_takes_its_finite_differences_in_one_call():
    # 120 columns (n + m <= 128: the full check's fused pass, which probes with the call it has and
    # times no plain call): one vmapped call, where a pilot of 8 columns once made it 15.
    x = _x(120)
    report = opcheck.gradcheck_report(lambda t: t.sin().sum(), (x,), fast_mode="auto")
    assert report.passed and report.stats.fused, report.stats.fallbacks
    assert report.stats.batched_calls == 1 and report.stats.calls == 0


def test_no_output_element_needs_no_finite_differences():
    # A 125-element input and an empty output: every column is empty, so no call is made for them.
    x = _x(5, 5, 5)
    report = opcheck.gradcheck_report(lambda t: t[..., :0], (x,), fast_mode=False)
    assert report.passed
    assert report.stats.calls == 0 and report.stats.batched_calls == 0
    report = opcheck.gradcheck_report(lambda t: t[..., :0], (x,), fast_mode="auto")
    assert report.passed and report.stats.calls == 0 and report.stats.batched_calls == 0


def test_batched_central_differences_of_large_values_are_settled_by_plain_calls():
    # prod of 15 values in [-9, 9) is near 1e8: a vmapped evaluation rounds it differently from a
    # plain one by more than some entries' margin to the tolerance, which would change the verdict.
    torch.manual_seed(0)
    x = (torch.rand(3, 5, dtype=torch.float64) * 18 - 9).requires_grad_()
    go = (torch.tensor(0.7, dtype=torch.float64),)

    from torch.autograd.gradcheck import GradcheckError

    def verdict(check):
        try:
            return check(torch.prod, (x,), go)
        except GradcheckError:
            return False

    report = opcheck.gradgradcheck_report(torch.prod, (x,), go)
    assert any(f.startswith("settled ") for f in report.stats.fallbacks), report.stats.fallbacks
    with batching.vmap_batching(False):
        unbatched = verdict(opcheck.gradgradcheck)
    assert report.passed == unbatched == verdict(torch.autograd.gradgradcheck)


def test_exact_batched_differences_of_large_values_are_not_redone():
    # sort's vmapped values equal the plain ones bit for bit: no row is near the tolerance by more
    # than a few ulps, though the outputs are large (each row redone would cost two plain calls).
    x = (_x(300, seed=11) * 100).detach().requires_grad_()
    report = opcheck.gradcheck_report(lambda t: t.sort().values, (x,))
    assert report.passed and report.stats.batched_calls > 0
    assert not any(f.startswith("settled ") for f in report.stats.fallbacks), report.stats.fallbacks


def test_the_reentrancy_pass_repeats_the_first_passs_batches(monkeypatch):
    # Kernels for other batch sizes may round otherwise (baddbmm's complex backward in OpInfo):
    # the second pass must use the first one's batches, the pilot's included.
    sizes = []
    vjp = Evaluator.vjp

    def recording(self, output, diff_inputs, grad_output, batched=False):
        if batched:
            sizes.append(grad_output.shape[0])
        return vjp(self, output, diff_inputs, grad_output, batched)

    monkeypatch.setattr(Evaluator, "vjp", recording)
    assert opcheck.gradcheck(torch.sin, (_x(16, 16),))
    half = len(sizes) // 2
    assert len(sizes) == 2 * half and sizes[:half] == sizes[half:] and sizes[0] == batching.PILOT_COLUMNS
    assert sum(sizes[:half]) == 256


@pytest.mark.parametrize("batch", [True, False])
@pytest.mark.parametrize("legacy_first", [False, True])
def test_jacobians_of_outputs_that_carry_a_graph_hold_none(batch, legacy_first):
    # The second-order checks' functions return outputs that require grad. A column copied into a
    # Jacobian with its graph would keep every chunk's graph alive until the call ends (gigabytes
    # for a vmapped conv_transpose3d double backward).
    w = _x(40, seed=7)
    x = _x(40, seed=8)

    def fn(a):
        return (a.sin() * w,)

    outputs = fn(x)
    assert outputs[0].requires_grad
    ctx = _ctx(batch, budget=64)  # one column per chunk
    ctx.evaluator.legacy_jvp_first = legacy_first
    blocks = [
        *(b for per in numerical_jacobian(ctx, fn, (x,), outputs) for b in per),
        *(b for per in analytical_jvp_jacobian(ctx, fn, (x,), outputs) for b in per),
    ]
    stats = ctx.evaluator.stats
    assert (stats.batched_calls > 1 and stats.batched_jvp_calls > 1) == batch and not stats.fallbacks
    assert blocks and not any(b.requires_grad for b in blocks)


@pytest.mark.parametrize("fwd_over_rev", [False, True])
def test_complex_second_order_checks_batch_like_real_ones(fwd_over_rev):
    # The complex parts' wrappers keep the first derivative's vmap form (torch.func.vjp).
    z = _x(6, 5, seed=9).to(torch.complex128).detach().requires_grad_()
    kwargs = dict(check_fwd_over_rev=fwd_over_rev, check_rev_over_rev=not fwd_over_rev, check_undefined_grad=False)
    report = opcheck.gradgradcheck_report(torch.sinh, (z,), **kwargs)
    assert report.passed and not report.stats.fallbacks, report.stats.fallbacks
    assert report.stats.batched_calls > 0
    assert (report.stats.batched_jvp_calls > 0) == fwd_over_rev
    with batching.vmap_batching(False):
        assert opcheck.gradgradcheck(torch.sinh, (z,), **kwargs)


def test_a_zero_second_derivative_is_batched():
    # sgn's double backward is a zero tensor, which is immutable: its difference is made out of place.
    zero = torch._efficientzerotensor(3, dtype=torch.float64)
    assert torch.equal(batching.difference_quotient(zero, zero, 1e-6), torch.zeros(3, dtype=torch.float64))
    report = opcheck.gradgradcheck_report(torch.sgn, (_x(5, 4, seed=10),))
    assert report.passed and not report.stats.fallbacks, report.stats.fallbacks
    assert report.stats.batched_calls > 0


def test_torch_func_is_warmed_before_a_batch_is_timed():
    # The first torch.func.vjp of a process imports ~800 modules (1.5 s): charged to a pilot batch,
    # batching looked slower than the loop. After a second-order check starts, a vjp imports nothing;
    # after a check of forward AD has timed its first batch of JVP columns, a jvp imports nothing.
    script = """
import sys, torch
import opcheck
from opcheck.engine.second_order import first_derivative
x = torch.randn(3, dtype=torch.float64, requires_grad=True)
opcheck.gradcheck(torch.sin, (x,), fast_mode=False, check_forward_ad=True)  # JVP columns' pilot: warms jvp
first_derivative(torch.sin, (x,), None, False)  # a second-order check's: warms vjp
before = set(sys.modules)
torch.func.vmap(lambda a: torch.func.vjp(torch.sin, a)[1](a)[0])(torch.zeros(2, 3))
torch.func.vmap(lambda a: torch.func.jvp(torch.sin, (a,), (a,))[1])(torch.zeros(2, 3))
print(sorted(set(sys.modules) - before))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_a_check_without_forward_ad_does_not_load_its_machinery():
    # torch's forward AD loads its decompositions on first use (0.1-0.2 s, torch.func.jvp and
    # make_dual alike): a process whose checks never use forward AD, as torch's fast mode with
    # check_forward_ad=False, never pays for them.
    script = """
import sys, torch
import opcheck
x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
assert opcheck.gradcheck(torch.sin, (x,))
assert opcheck.gradcheck(torch.sin, (x,), fast_mode=False)
print("torch._decomp.decompositions_for_jvp" in sys.modules)
opcheck.gradcheck(torch.sin, (x,), check_forward_ad=True)
print("torch._decomp.decompositions_for_jvp" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("accelerator", [False, True])
def test_the_default_clock_does_not_charge_a_batched_call_its_time_off_the_cpu(accelerator, monkeypatch):
    # On a loaded machine the batched call of a decision loses the CPU midway (wall seconds long,
    # CPU seconds short): by the default clock it still undercuts the loop, except where the
    # process uses an accelerator, whose work the host's CPU time does not see.
    from types import SimpleNamespace

    from opcheck.engine.batching import evaluator, settings

    wall, cpu = _Spans(batched=1.0, plain=1e-6), _Spans(batched=1e-7, plain=1e-6)
    monkeypatch.setattr(evaluator, "time", SimpleNamespace(perf_counter=wall))
    monkeypatch.setattr(settings, "time", SimpleNamespace(process_time=cpu, thread_time=None))
    monkeypatch.setattr(settings, "_process_cpu_timer_armed", lambda: False)
    monkeypatch.setattr(settings, "accelerator_in_use", lambda: accelerator)
    with batching_clock(None):
        report = opcheck.gradcheck_report(torch.sin, (_x(40),))  # one batch of each kind, no pilot
    assert report.passed and wall.readings and cpu.readings == (0 if accelerator else wall.readings)
    slower = [f for f in report.stats.fallbacks if "slower than the loop" in f]
    assert bool(slower) is accelerator, report.stats.fallbacks


def test_cost_seconds_is_the_smaller_clock_where_the_cpu_clock_counts():
    from opcheck.engine.batching import settings

    assert settings.cost_seconds(wall=2.0, cpu=0.5) == 0.5  # off the CPU for 1.5 s
    assert settings.cost_seconds(wall=0.5, cpu=2.0) == 0.5  # four threads of a parallel kernel
    assert settings.cost_seconds(wall=2.0, cpu=None) == 2.0


@pytest.mark.parametrize(
    ("accelerator", "platform", "armed", "threads", "clock"),
    [
        (False, "linux", False, 4, "process_time"),
        (False, "darwin", False, 1, "process_time"),
        (False, "linux", True, 1, "thread_time"),  # the process's clock reads in ticks
        (False, "linux", True, 2, None),  # the thread's would leave out the other threads
        (True, "linux", False, 1, None),  # a device's work is on no host clock
        (False, "win32", False, 1, None),  # 15.6 ms ticks
    ],
)
def test_the_cpu_clock_is_one_that_resolves_a_call(accelerator, platform, armed, threads, clock, monkeypatch):
    import time

    from opcheck.engine.batching import settings

    monkeypatch.setattr(settings, "accelerator_in_use", lambda: accelerator)
    monkeypatch.setattr(settings.sys, "platform", platform)
    monkeypatch.setattr(settings, "_process_cpu_timer_armed", lambda: armed)
    monkeypatch.setattr(settings.torch, "get_num_threads", lambda: threads)
    assert settings.cpu_clock() is (getattr(time, clock) if clock else None)


def test_an_armed_cpu_timer_of_the_process_is_seen():
    # In a child process: a real ITIMER_PROF (a harness's time limit, as bench_opdb's), armed and
    # disarmed; the detection is what decides, no clock is read here.
    script = """
import signal, time, torch
from opcheck.engine.batching import settings
torch.set_num_threads(1)
seen = [settings.cpu_clock() is time.process_time]
signal.signal(signal.SIGPROF, lambda *a: None)
for which in (signal.ITIMER_PROF, signal.ITIMER_VIRTUAL):
    signal.setitimer(which, 300)
    seen.append(settings.cpu_clock() is time.thread_time)
    signal.setitimer(which, 0)
seen.append(settings.cpu_clock() is time.process_time)
print(seen)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[True, True, True, True]"
