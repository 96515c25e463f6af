"""A dry run of the engine on a probed function's stand-in (opcheck.runtime.cost.standin) makes the
evaluations the engine makes on the function itself: the same plain, vmapped, backward, batched
backward, JVP and batched JVP calls and the same path, passing and failing. Counts only; the sizes
are those whose evaluations no timing decides (a batch schedule's growth, the fused projections'
choice between backward's rows and the columns' differences)."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import opcheck
from opcheck.engine import route
from opcheck.engine.second_order import first_derivative
from opcheck.runtime.cost.plan import Kind
from opcheck.runtime.cost.probe import Probe
from opcheck.runtime.cost.standin import _forward_kind, dry_run, on_meta, stand_in
from tests import broken_ops

# Kernel-like Functions (tests/broken_ops.py): sin with a vmap rule, x*x without one; neither has
# forward AD. The wrong ones' backward is off by 2x.
SIN = broken_ops.SIN.function("StandInSin", vmap=True)
WRONG_SIN = broken_ops.SIN.function("StandInWrongSin", bug=broken_ops.scaled(2.0), vmap=True)
SQUARE = broken_ops.SQUARE.function("StandInSquare")
WRONG_SQUARE = broken_ops.SQUARE.function("StandInWrongSquare", bug=broken_ops.scaled(2.0))
EXP = broken_ops.EXP.function("StandInExp", vmap=True)
WRONG_EXP = broken_ops.EXP.function("StandInWrongExp", bug=broken_ops.scaled(2.0), vmap=True)


def _alias_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.ops.aten.alias.default(grad) * torch.cos(x)  # aten::alias has no batching rule


# sin whose forward batches (a vmap rule) and whose backward does not, as a custom op's can
SIN_UNBATCHED_BACKWARD = broken_ops.function(
    "StandInSinUnbatchedBackward", torch.sin, _alias_backward, setup=broken_ops.save_inputs, vmap=True
)
# the identity whose backward and JVP double: what comes after it has a gradient off by 2x
DOUBLED = broken_ops.function(
    "StandInDoubled", torch.clone, lambda ctx, grad: 2 * grad, jvp=lambda ctx, tangent: 2 * tangent, vmap=True
)
C = complex(1.0, 2.0)
SQUARE_MATRIX = torch.eye(3, dtype=torch.complex128) * 2 + 0.1
Z = "complex"  # a shape's tag: a complex128 input


def _x(*shape, seed=0):
    dtype = torch.complex128 if shape[:1] == (Z,) else torch.float64
    shape = shape[1:] if shape[:1] == (Z,) else shape
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


PASSING = {
    "sin, 12": (torch.sin, [(3, 4)]),
    "sin, 2": (torch.sin, [(2,)]),
    "matmul": (torch.matmul, [(3, 4), (4, 2)]),
    "sum": (torch.sum, [(3, 4)]),
    "softmax": (lambda t: torch.softmax(t, -1), [(4, 5)]),
    "mul": (torch.mul, [(3, 4), (3, 4)]),
    "no vmap, 2": (SQUARE.apply, [(2,)]),
    "no vmap, 12 (grouped)": (SQUARE.apply, [(3, 4)]),
    "no vmap, 40 (grouped)": (SQUARE.apply, [(40,)]),
    "complex input": (torch.exp, [(Z, 3, 4)]),
    "complex inputs, complex and real": (torch.mul, [(Z, 3, 4), (3, 4)]),
    "complex output": (lambda t: t * C, [(3, 4)]),
    "conjugate of a complex input": (lambda t: (2 * t).conj(), [(Z, 3, 4)]),
    "conjugate output (its parts do not batch)": (lambda t: (t * C).conj(), [(3, 4)]),
    "complex input, conjugate output": (lambda t: (t * C).conj(), [(Z, 3, 4)]),
    "solve from the right (a conjugate output)": (
        lambda b: torch.linalg.solve(SQUARE_MATRIX, b, left=False),
        [(Z, 2, 3)],
    ),
    "values and indices": (lambda t: torch.cummax(t, 0), [(3, 4)]),
    # torch.linalg.solve broadcasting a batch: its vmapped forward raises where its JVPs batch at one point
    "solve, a broadcast batch": (
        lambda a, b: torch.linalg.solve(a + 4 * torch.eye(3, dtype=a.dtype), b),
        [(2, 1, 3, 3), (4, 3, 2)],
    ),
    "a batched forward, no batched backward": (SIN_UNBATCHED_BACKWARD.apply, [(3, 4)]),
}
# torch's batched forward-AD check raises on these (an internal assert on a conjugate view's
# tangent), in torch.autograd.gradcheck as here: no passing check to compare with
NO_BATCHED_FORWARD_AD = {
    "conjugate of a complex input",
    "conjugate output (its parts do not batch)",
    "complex input, conjugate output",
}
FAILING = {  # (the function as it is, the wrong one, shapes)
    "sin, 12": (SIN.apply, WRONG_SIN.apply, [(3, 4)]),
    "sin, 2": (SIN.apply, WRONG_SIN.apply, [(2,)]),
    "no vmap, 2": (SQUARE.apply, WRONG_SQUARE.apply, [(2,)]),
    "no vmap, 12": (SQUARE.apply, WRONG_SQUARE.apply, [(3, 4)]),
    "no vmap, 40": (SQUARE.apply, WRONG_SQUARE.apply, [(40,)]),
    "complex input": (EXP.apply, WRONG_EXP.apply, [(Z, 3, 4)]),
    "conjugate output": (lambda t: (t * C).conj(), lambda t: (DOUBLED.apply(t) * C).conj(), [(3, 4)]),
    "complex input, conjugate output": (lambda t: (t * C).conj(), lambda t: (DOUBLED.apply(t) * C).conj(), [(Z, 3)]),
}
MODES = {
    "auto": dict(fast_mode="auto"),
    "full": dict(fast_mode=False),
    "fast": dict(fast_mode=True),
    "auto, forward AD": dict(fast_mode="auto", check_forward_ad=True),
    # the runtime's forward_ad test: forward AD alone, and its batched check (the legacy vmap)
    "forward AD alone, batched": dict(
        fast_mode="auto", check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True
    ),
}


def _inputs(shapes):
    return tuple(_x(*s, seed=k).requires_grad_() for k, s in enumerate(shapes))


def _made(fn, shapes, flags):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = opcheck.gradcheck_report(fn, _inputs(shapes), **flags)
    s = r.stats
    counts = (s.calls, s.batched_calls, s.vjp_calls, s.batched_vjp_calls, s.jvp_calls, s.batched_jvp_calls)
    return r.passed, counts, s.auto_paths


def _forward_ad(fn) -> bool:
    return fn not in (SQUARE.apply, SIN_UNBATCHED_BACKWARD.apply)


PASSING_CASES = [
    (n, m)
    for n in PASSING
    for m in MODES
    if (_forward_ad(PASSING[n][0]) or "forward AD" not in m) and not (n in NO_BATCHED_FORWARD_AD and "batched" in m)
]
"""(name, mode): every passing case in every mode it has (forward AD where the function has it)."""


@pytest.mark.parametrize("name, mode", PASSING_CASES)
def test_a_dry_run_on_the_stand_in_makes_the_evaluations_of_a_passing_check(name, mode):
    fn, shapes = PASSING[name]
    flags = MODES[mode]
    made = _made(fn, shapes, flags)
    assert made[0], made
    standin = stand_in(Probe(fn, _inputs(shapes)))
    assert standin is not None
    assert _made(standin, shapes, flags) == made


@pytest.mark.parametrize(
    "name, mode",
    [(n, m) for n in FAILING for m in ("auto", "full", "fast", "forward AD") if m != "forward AD" or "conj" in n],
)
def test_a_dry_run_on_a_wrong_stand_in_makes_the_evaluations_of_a_failing_check(name, mode):
    right, wrong, shapes = FAILING[name]
    flags = (
        MODES[mode] if mode != "forward AD" else {**MODES["auto"], "check_forward_ad": True, "check_backward_ad": False}
    )
    made = _made(wrong, shapes, flags)
    assert not made[0], made
    standin = stand_in(Probe(right, _inputs(shapes)), wrong=2.0)
    assert standin is not None
    assert _made(standin, shapes, flags) == made


@pytest.mark.parametrize("mode", ["auto", "full", "fast"])
@pytest.mark.parametrize(
    "fn",
    [lambda t: t.argmax(), lambda t: (t.sum(), 2), lambda t: (t.argmax(), t.sin()), lambda t: (t.sin(), t.argmax())],
    ids=["no output requires grad", "an output that is not a tensor", "an index output first", "an index output"],
)
def test_a_dry_run_of_outputs_without_a_gradient_makes_the_calls_of_its_check(fn, mode):
    """The outputs that do not require grad are the probed ones, as constants: the check calls a
    function without an output that requires grad as often, and raises on the stand-in's outputs
    where it raises on the probed ones (an output that is not a tensor; an index output before a
    float one, where torch's full check raises too)."""
    x = _x(3, 4).requires_grad_()
    calls, counted = _counted(fn)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = opcheck.gradcheck_report(counted, (x,), **MODES[mode]).passed
    except (AttributeError, IndexError):
        made = None
    run = dry_run(Probe(fn, (x,)), MODES[mode])
    assert (None if run.crashed else run.report.passed) == made
    assert run.forward_side == calls["forward"] > 0


@pytest.mark.parametrize("mode", ["auto", "full", "fast"])
def test_a_dry_run_raises_what_is_not_the_probed_function_s_crash(mode):
    """An exception other than a RuntimeError counts as the check crashing as it does on the probed
    function only where the probed outputs explain it (one without a gradient); elsewhere it is a
    mistake of the stand-in or the arguments, and the dry run raises it instead of pricing a crash."""
    x = (_x(3, 4).requires_grad_(),)
    with pytest.raises(TypeError):
        dry_run(Probe(torch.sin, x), dict(MODES[mode], atol="loose"))
    run = dry_run(Probe(lambda t: (t.sum(), 2), x), dict(MODES[mode], atol="loose"))
    assert run.crashed and run.report is None


def _sparse(layout, z=(), masked_out=0.5):
    dense = _x(*z, 6, 5)
    dense[dense.abs() < masked_out] = 0
    return {"coo": dense.to_sparse(), "csr": dense.to_sparse_csr()}[layout].requires_grad_()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("mode", ["auto", "full", "fast"])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_dry_run_of_a_sparse_input_makes_the_calls_of_its_check(layout, dtype, mode, masked):
    """The engine's own dense stand-ins rebuild the input for the stand-in as for the op: the same
    loops over the positions the numerical side moves (all, or with masked=True the specified
    ones), and the same backward passes; a complex input's gradient from its two parts."""
    z = (Z,) if dtype == "complex128" else ()
    w = _x(*z, 5, 3, seed=1)
    x = _sparse(layout, z)

    def op(t):  # a gradient at every position (torch.mm), or masked to the input's pattern
        return torch.sparse.mm(t, w) if masked else torch.mm(t, w)

    calls, counted = _counted(op)
    flags = dict(MODES[mode], masked=masked, check_batched_grad=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = opcheck.gradcheck_report(counted, (x,), **flags)
    run = dry_run(Probe(op, (x,), masked=masked), flags)
    assert run.report.passed == report.passed is True
    assert run.forward_side == calls["forward"] > 0
    made, dry = report.stats, run.report.stats
    assert (dry.vjp_calls, dry.batched_vjp_calls) == (made.vjp_calls, made.batched_vjp_calls)
    wrong = dry_run(Probe(op, (x,), masked=masked), flags, wrong=2.0)
    assert not wrong.report.passed


@pytest.mark.parametrize("mode", ["auto", "full"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_second_order_dry_run_of_a_sparse_input_makes_the_calls_of_gradgradcheck(layout, mode):
    """torch.mm's gradient for a sparse input is dense, as the stand-in's, in its first derivative
    too (differentiated in the sparse input: to_dense's gradient would be sparse, which the
    engine's comparisons cannot read)."""
    x, w = _sparse(layout), _x(5, 3, seed=1).requires_grad_()
    calls, counted = _counted(torch.mm)
    flags = SECOND_ORDER_MODES[mode]
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        report = opcheck.gradgradcheck_report(counted, (x, w), **flags)
    run = dry_run(Probe(torch.mm, (x, w)), flags, second=_first_derivative_probe(torch.mm, (x, w)))
    assert run.report.passed == report.passed is True
    assert run.forward_side == calls["forward"] > 0
    made, dry = report.stats, run.report.stats
    assert (dry.vjp_calls, dry.batched_vjp_calls) == (made.vjp_calls, made.batched_vjp_calls)


def _counted(fn):
    """fn, and a Counter of its calls ("forward")."""
    calls = Counter[str]()

    def counted(*args):
        calls["forward"] += 1
        return fn(*args)

    return calls, counted


def _backward_of_the_wrong_shape(ctx, grad):
    return grad.sum(0)  # the input's gradient without its first dimension: autograd raises


WRONG_SHAPE = broken_ops.function("StandInWrongShape", torch.sin, _backward_of_the_wrong_shape, vmap=True)


@pytest.mark.parametrize("mode", ["auto", "full", "fast"])
def test_a_dry_run_crashes_where_the_probed_backward_raises_after_the_same_calls(mode):
    x = _inputs([(3, 4)])
    calls, counted = _counted(WRONG_SHAPE.apply)

    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opcheck.gradcheck_report(counted, x, **MODES[mode])
    run = dry_run(Probe(WRONG_SHAPE.apply, x), MODES[mode])
    assert run is not None and run.crashed and run.report is None
    assert run.forward_side == calls["forward"] > 0


@pytest.mark.parametrize("mode", ["auto", "full", "fast"])
@pytest.mark.parametrize("fn", [SIN.apply, SQUARE.apply], ids=["vmap", "no vmap"])
def test_a_dry_run_counts_the_calls_the_check_makes_of_the_function(fn, mode):
    x = _inputs([(3, 4)])
    calls, counted = _counted(fn)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert opcheck.gradcheck_report(counted, x, **MODES[mode]).passed
    run = dry_run(Probe(fn, x), MODES[mode])
    assert run is not None and not run.crashed and run.report.passed
    assert run.forward_side == calls["forward"] > 0 and run.backward_side > 0


FORWARD_SIDE = (Kind.FORWARD, Kind.JVP, Kind.VMAP, Kind.VMAP_JVP, Kind.VMAP_TANGENTS)


def _by_kind_and_rows(fn):
    """fn, and a Counter of its calls by (kind, rows) as a dry run records the stand-in's (a
    batched attempt that raises as one row)."""
    seen = Counter()

    def recorded(*args):
        kind, rows = _forward_kind([a for a in args if isinstance(a, torch.Tensor)])
        try:
            out = fn(*args)
        except Exception:
            seen[(kind, 1)] += 1
            raise
        seen[(kind, rows)] += 1
        return out

    return seen, recorded


@pytest.mark.parametrize("mode", ["auto", "full", "fast", "auto, forward AD"])
@pytest.mark.parametrize("name", ["sin, 12", "matmul", "softmax", "no vmap, 12 (grouped)", "no vmap, 40 (grouped)"])
def test_a_dry_runs_evaluations_by_kind_and_rows_are_the_checks(name, mode):
    """The forward-side evaluations (plain, vmapped, forward-mode; a batch by its rows) of the
    stand-in are those of the function itself, which prices them."""
    fn, shapes = PASSING[name]
    if "forward AD" in mode and not _forward_ad(fn):
        pytest.skip("no forward AD")
    seen, recorded = _by_kind_and_rows(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert opcheck.gradcheck_report(recorded, _inputs(shapes), **MODES[mode]).passed
    run = dry_run(Probe(fn, _inputs(shapes)), MODES[mode])
    assert run.report.passed
    forward_side = Counter({key: n for key, n in run.evaluations.items() if key[0] in FORWARD_SIDE})
    assert forward_side == seen, (forward_side, seen)


@pytest.mark.parametrize("per_row, loops", [(1.0, True), (1e-9, False)])
def test_a_dry_runs_timed_choices_follow_the_probed_prices(per_row, loops):
    # a failing full check's finite differences: batches timed against a plain call (the engine's
    # adaptive rule), by the virtual clock the stand-in's evaluations advance at the probe's prices
    x = _inputs([(16, 16)])
    probe = Probe(torch.sin, x)
    probe.vmap.at = lambda rows, measure=True: per_row * rows  # a vmapped forward of 1 s a row, or of nothing
    run = dry_run(probe, MODES["full"], wrong=2.0)
    assert run is not None and not run.report.passed
    plain = run.evaluations[(Kind.FORWARD, 1)]
    batched = sum(n for (kind, rows), n in run.evaluations.items() if kind == Kind.VMAP and rows > 1)
    if loops:  # the loop takes over after the pilot batch: two calls per column of the 256
        assert plain >= 2 * 256 and batched <= 4, run.evaluations
    else:
        assert plain < 10 and batched < 10, run.evaluations


@pytest.mark.parametrize("mode", ["forward AD alone, batched", "auto, forward AD", "full"])
def test_a_dry_run_times_none_of_the_probes_batches_inside_the_check(mode):
    """A batch of the probe's timed inside the check's vmap is a batch of batches, and inside its
    forward-AD level or backward runs otherwise than alone: each is timed before or after the check,
    with no transform, forward-AD level or backward of the check's around it."""
    from torch._C._functorch import peek_interpreter_stack

    probe = Probe(torch.sin, _inputs([(12, 16)]))
    inside = []
    for batched in (probe.vmap, probe.vmap_tangents, probe.vmap_jvp, probe.batched_backward):
        run = batched._run

        def watched(rows, run=run):
            level = torch.autograd.forward_ad._current_level
            inside.append(peek_interpreter_stack() is not None or level >= 0 or torch._C._current_graph_task_id() >= 0)
            return run(rows)

        batched._run = watched
    made = dry_run(probe, MODES[mode])
    assert made is not None and made.report.passed
    assert inside and not any(inside), inside  # larger batches were timed, none inside the check
    again = dry_run(probe, MODES[mode])
    assert again.evaluations == made.evaluations


def _first_derivative_probe(fn, x):
    """gradgradcheck's first derivative of fn at x, probed as the estimate probes it."""
    first = first_derivative(fn, x, None, False)
    return Probe(first.func, first.inputs)


ONCE = broken_ops.SIN.function("StandInOnceDifferentiableSin", vmap=True, once_differentiable=True)


SECOND_ORDER_MODES = {
    "auto": dict(fast_mode="auto"),
    "full": dict(fast_mode=False),
    # the runtime's fwgrad_bwgrad test: forward AD through the first derivative alone
    "forward over backward": dict(
        fast_mode="auto", check_fwd_over_rev=True, check_rev_over_rev=False, check_undefined_grad=False
    ),
}
SECOND_ORDER = {
    "sin": (torch.sin, [(3, 4)]),
    "sin, complex": (torch.sin, [(Z, 3, 4)]),
    "no double backward": (ONCE.apply, [(3, 4)]),
    # the first derivative's columns cannot be batched: grouped finite differences by its column
    # groups (two: x's and v's), where a first derivative constant in x had one
    "no vmap": (SQUARE.apply, [(3, 4)]),
    "no vmap, beyond the full check's first size": (SQUARE.apply, [(6, 8)]),
    "a backward without a batching rule": (SIN_UNBATCHED_BACKWARD.apply, [(3, 4)]),
    "broadcast solve": (
        lambda a, b: torch.linalg.solve(a + 4 * torch.eye(3, dtype=a.dtype), b),
        [(2, 1, 3, 3), (4, 3, 2)],
    ),
}


@pytest.mark.parametrize("mode", list(SECOND_ORDER_MODES))
@pytest.mark.parametrize("name", list(SECOND_ORDER))
def test_a_second_order_dry_run_makes_the_calls_of_gradgradcheck(name, mode):
    """The calls and the engine's backward passes, where the first derivative (the stand-in's
    backward, of y + y²/2 for maps y) batches, groups its columns and takes forward AD as the op's."""
    fn, shapes = SECOND_ORDER[name]
    if mode == "forward over backward" and not _forward_ad(fn):
        pytest.skip("no forward AD to check through the first derivative")
    x = _inputs(shapes)
    calls, counted = _counted(fn)
    flags = SECOND_ORDER_MODES[mode]
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        try:
            report = opcheck.gradgradcheck_report(counted, x, **flags)
        except RuntimeError:
            report = None  # the double backward raised through the check
    run = dry_run(Probe(fn, x), flags, second=_first_derivative_probe(fn, x))
    assert run is not None
    assert (None if run.crashed else run.report.passed) == (None if report is None else report.passed)
    assert run.forward_side == calls["forward"] > 0
    if report is not None and report.passed:  # (a failure's localization reads values)
        made, dry = report.stats, run.report.stats
        assert (dry.vjp_calls, dry.batched_vjp_calls) == (made.vjp_calls, made.batched_vjp_calls)
        assert dry.auto_paths == made.auto_paths


def _larger(name, shapes):
    """The case's shapes, of more elements than fast_mode="auto" runs the full check first on."""
    if name.startswith("solve from the right"):
        return [(Z, 24, 3)]  # the matrix stays 3x3
    if name.startswith("solve, a broadcast batch"):
        return [(8, 1, 3, 3), (16, 3, 2)]
    larger = []
    for shape in shapes:
        tag, dims = (shape[:1], shape[1:]) if shape[:1] == (Z,) else ((), shape)
        # a vector: just past the full check's first size (n + m over it), however long it was
        scale = [max(4, -(-(route.FULL_CHECK_ELEMENTS + 1) // d)) if len(dims) == 1 else 4 for d in dims]
        larger.append(tag + tuple(d * k for d, k in zip(dims, scale)))
    return larger


@pytest.mark.parametrize("name, mode", PASSING_CASES)
def test_a_dry_run_on_meta_tensors_makes_the_evaluations_of_one_on_real_tensors(name, mode):
    fn, shapes = PASSING[name]
    probe = Probe(fn, _inputs(_larger(name, shapes)))
    assert on_meta(probe)  # beyond the full check's first size, a passing check runs on meta tensors
    real = dry_run(probe, MODES[mode], meta=False)
    meta = dry_run(probe, MODES[mode])
    assert real is not None and meta is not None and real.report.passed and meta.report.passed
    assert meta.evaluations == real.evaluations
    assert meta.report.stats.auto_paths == real.report.stats.auto_paths


class _LargestComputed(TorchDispatchMode):
    """The most elements of any new tensor (not a view of its arguments) made off the meta device."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view (a detached input): nothing computed
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("fn", [SIN.apply, SQUARE.apply], ids=["vmap", "no vmap"])
def test_a_dry_run_of_a_large_check_computes_nothing_of_its_size(fn):
    probe = Probe(fn, _inputs([(512, 512)]))
    warm = dry_run(probe, MODES["auto"])  # the probe measures the prices it had not measured yet
    computed = _LargestComputed()
    with computed:  # below the dry run's own mode: it sees what that mode lets through
        run = dry_run(probe, MODES["auto"])
    assert run is not None and run.report.passed and run.evaluations == warm.evaluations
    assert computed.largest < 512  # at most a scalar read, never an input's or a Jacobian's size
    on_real = _LargestComputed()
    with on_real:
        real = dry_run(probe, MODES["auto"], meta=False)
    assert real.evaluations == run.evaluations and on_real.largest >= 512 * 512


def test_a_dry_run_mirrors_a_backward_whose_own_derivative_is_wrong():
    # the projections' VJP of the VJP, a source of J·U, disagrees with finite differences on a
    # backward that is differentiable only once, and the engine takes the next source: the
    # stand-in's backward is differentiated as the probe found the op's (before, it took the VJP of
    # the VJP); such a dry run stays on real tensors, where that disagreement shows
    shapes = [(12, 16)]
    probe = Probe(ONCE.apply, _inputs(shapes))
    assert probe.double_backward == "wrong" and not on_meta(probe)
    made = _made(ONCE.apply, shapes, MODES["auto"])
    assert made[0] and made[2] == ["projected (J·U from VJP rows, fused)"], made
    assert _made(stand_in(probe), shapes, MODES["auto"]) == made
    run = dry_run(probe, MODES["auto"])
    assert run is not None and run.report.stats.auto_paths == made[2]


def _cos_times(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x)


def _doubled_jvp(ctx, tangent):
    (x,) = ctx.saved_tensors
    return 2 * tangent * torch.cos(x)


def _save_for_both(ctx, inputs, output):
    ctx.save_for_backward(*inputs)
    ctx.save_for_forward(*inputs)


# sin whose backward is right and whose forward AD is twice what it should be
WRONG_JVP_SIN = broken_ops.function(
    "StandInWrongJvpSin", torch.sin, _cos_times, setup=_save_for_both, jvp=_doubled_jvp, vmap=True
)


def test_a_dry_run_mirrors_forward_ad_that_disagrees_with_finite_differences():
    # fast_mode="auto" checks backward alone here, yet the projections try forward AD first as a
    # source of J·U: it disagrees, and the engine takes the next source. The stand-in's JVP is
    # wrong where the probe's disagreed (before, it had none, and took the next source at once);
    # such a dry run stays on real tensors, where the disagreement shows
    shapes = [(12, 16)]
    probe = Probe(WRONG_JVP_SIN.apply, _inputs(shapes))
    assert probe.jvp is not None and not probe.jvp_right and not on_meta(probe)
    made = _made(WRONG_JVP_SIN.apply, shapes, MODES["auto"])
    assert made[0], made
    assert _made(stand_in(probe), shapes, MODES["auto"]) == made
    run = dry_run(probe, MODES["auto"])
    assert run is not None and run.report.stats.fallbacks[:1] == [
        "projected: J·U from forward AD disagrees with finite differences"
    ]
