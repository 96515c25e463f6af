"""The engine's plumbing: frozen flags and context, context-scoped switches, one central difference."""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import threading
from pathlib import Path

import pytest
import torch

import opcheck
from opcheck.engine import aux_checks
from opcheck.engine.batching import (
    Differences,
    EvalStats,
    Evaluator,
    adaptive_clock,
    batching_clock,
    batching_enabled,
    vmap_batching,
)
from opcheck.engine.context import CheckContext
from opcheck.engine.flags import DEFAULT_ATOL, DEFAULT_EPS, DEFAULT_JACOBIAN_BUDGET, DEFAULT_RTOL, CheckFlags

BATCHING = Path(opcheck.__file__).parent / "engine" / "batching"


def _x(n: int) -> torch.Tensor:
    return torch.linspace(0.1, 1.0, n, dtype=torch.float64).requires_grad_()


# ------------------------------------------------------------------------------------ flags
def test_flags_are_built_from_the_arguments_by_name():
    flags = CheckFlags.from_arguments(
        {"func": torch.sin, "inputs": (), "raise_exception": False, "atol": 0.5, "jacobian_budget": None}
    )
    assert (flags.eps, flags.atol, flags.rtol) == (DEFAULT_EPS, 0.5, DEFAULT_RTOL)
    assert flags.jacobian_budget == DEFAULT_JACOBIAN_BUDGET
    assert CheckFlags.from_arguments({"jacobian_budget": 7}).jacobian_budget == 7


def test_the_defaults_are_torchs():
    import inspect

    for ours, theirs in (
        (opcheck.gradcheck, torch.autograd.gradcheck),
        (opcheck.gradgradcheck, torch.autograd.gradgradcheck),
    ):
        mine, torchs = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        for name in ("eps", "atol", "rtol", "nondet_tol"):
            assert mine[name].default == torchs[name].default
    assert (DEFAULT_EPS, DEFAULT_ATOL, DEFAULT_RTOL) == (1e-6, 1e-5, 1e-3)


def test_flags_and_context_are_frozen():
    flags = CheckFlags()
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.atol = 1.0  # type: ignore[misc]
    ctx = CheckContext(flags, Evaluator())
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.backward_path = "VJP of VJP"  # type: ignore[misc]
    assert dataclasses.replace(ctx, backward_path="VJP of VJP").numerical_cache is ctx.numerical_cache


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (dict(check_forward_ad=False, check_backward_ad=False), "at least one of check_forward_ad"),
        (dict(check_batched_grad=True, check_backward_ad=False, check_forward_ad=True), "check_batched_grad=True"),
        (dict(check_batched_forward_grad=True), "check_batched_forward_grad=True"),
        (dict(fast_mode="slow"), "fast_mode must be"),
        (dict(jacobian_budget=-1), "jacobian_budget must be"),
        (dict(jacobian_budget=True), "jacobian_budget must be"),
    ],
)
def test_flags_are_validated_once_with_torchs_words(flags, error):
    with pytest.raises((AssertionError, ValueError), match=error):
        CheckFlags(**flags)
    with pytest.raises((AssertionError, ValueError), match=error):
        opcheck.gradcheck(torch.sin, (_x(3),), **flags)


# ---------------------------------------------------------------------------- context variables
def _in_a_thread(f):
    box = []
    t = threading.Thread(target=lambda: box.append(f()))
    t.start()
    t.join()
    return box[0]


def test_vmap_batching_is_scoped_to_the_context():
    assert batching_enabled()
    with vmap_batching(False):
        assert not batching_enabled()
        assert contextvars.copy_context().run(batching_enabled) is False  # a copy of this context
        assert _in_a_thread(batching_enabled) is True  # another thread starts from the default
        with vmap_batching(True):
            assert batching_enabled()
        assert not batching_enabled()
    assert batching_enabled()


def test_batching_clock_is_scoped_to_the_context():
    def clock():
        return 0.0

    outer = adaptive_clock()
    with batching_clock(clock):
        assert adaptive_clock() is clock
        assert _in_a_thread(adaptive_clock) is outer
    assert adaptive_clock() is outer


def test_nested_reports_each_collect_their_own_stats():
    inner = []

    def reports_inside(x):
        if not inner:
            inner.append(opcheck.gradcheck_report(torch.cos, (_x(40),)))
        return x.sin()

    with vmap_batching(False):
        outer = opcheck.gradcheck_report(reports_inside, (_x(3),))
    assert outer.passed and inner[0].passed
    # The loop's two calls per column: 3 columns here, 40 in the report made inside.
    assert (outer.stats.calls, inner[0].stats.calls) == (6, 80)


# ----------------------------------------------------------------------- central differences
def test_one_central_difference_serves_columns_and_directions():
    x = _x(4)
    inputs = (x,)
    diffs = Differences(Evaluator(), lambda a: (a.exp(),), inputs, 1e-6)
    column = diffs.column(0, 2)[0]
    along = diffs.along(x.data[2], 1e-6)[0]  # the same element, as an entry moved by eps
    torch.testing.assert_close(column, along, rtol=0, atol=0)
    direction = torch.zeros(4, dtype=torch.float64)
    direction[2] = 1e-6
    torch.testing.assert_close(diffs.along(x.data, direction)[0], column, rtol=0, atol=0)
    torch.testing.assert_close(column, torch.eye(4, dtype=torch.float64)[2] * x.detach().exp(), rtol=1e-8, atol=1e-8)


def test_a_central_difference_restores_the_input_when_the_function_raises():
    x = _x(4)
    before = x.detach().clone()
    calls = []

    def fails_at_the_second_point(a):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("no")
        return (a * 2,)

    diffs = Differences(Evaluator(), fails_at_the_second_point, (x,), 1e-3)
    with pytest.raises(RuntimeError, match="no"):
        diffs.column(0, 1)
    assert torch.equal(x.detach(), before)


def test_the_stats_of_a_differences_count_plain_calls():
    ev = Evaluator()
    Differences(ev, lambda a: (a.sin(),), (_x(3),), 1e-6).columns(0, 1)
    assert ev.stats == EvalStats(calls=6)


# ------------------------------------------------------------------------------------ layout
def test_no_library_function_is_collected_as_a_test():
    assert not [name for name in vars(aux_checks) if name.startswith("test")]


def test_the_batching_package_imports_one_way():
    # Each room imports only the rooms above it in the package's list (its docstring's order).
    order = "settings schedule agreement evaluator finite_differences fd_columns vjp_rows jvp_columns".split()
    for k, name in enumerate(order):
        tree = ast.parse((BATCHING / f"{name}.py").read_text())
        imported = {
            node.module.rsplit(".", 1)[-1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opcheck.engine.batching.")
        }
        imported |= {
            a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "opcheck.engine.batching"
            for a in node.names
        }
        assert imported <= set(order[:k]), (name, imported - set(order[:k]))
    assert sorted(p.stem for p in BATCHING.glob("*.py")) == sorted(["__init__", *order])


def test_columns_are_stacked_in_place_and_as_torch_stack_when_shapes_change():
    from opcheck.engine.batching.finite_differences import stack_columns

    cols = [[torch.full((3,), float(k)), torch.full((2,), -float(k))] for k in range(4)]
    stacked = stack_columns(iter(cols), 4)
    for got, want in zip(stacked, [torch.stack(per) for per in zip(*cols)]):
        assert torch.equal(got, want)
    assert stack_columns(iter([]), 0) == []
    changed = [*cols[:2], [torch.zeros(4), torch.zeros(2)], *cols[3:]]
    with pytest.raises(RuntimeError) as ours:
        stack_columns(iter(changed), 4)
    with pytest.raises(RuntimeError) as torchs:
        torch.stack([c[0] for c in changed])
    assert str(ours.value) == str(torchs.value)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_a_complex32_output_gets_torchs_second_order_verdict(dtype):
    # torch.equal has no complex32 kernel: the reentrancy check's fast path must not be the verdict.
    x = torch.randn(4, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()

    def first_line(check):
        torch.manual_seed(0)
        with pytest.raises(Exception) as info:
            check(torch.Tensor.chalf, (x,))
        return type(info.value).__name__, str(info.value).splitlines()[0]

    theirs = first_line(torch.autograd.gradgradcheck)
    assert theirs[0] == "GradcheckError"
    assert first_line(opcheck.gradgradcheck) == theirs


def test_vmap_rows_is_torch_func_vmap_on_tensors_of_one_batch():
    from opcheck.engine import _util
    from opcheck.engine._util import vmap_rows

    assert _util._FLAT_VMAP is not None  # torch.func.vmap's core, found in every torch in range
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)

    def f(a, b):
        return (a * b).sum(), a.sin()

    got, want = vmap_rows(f, (x, y)), torch.func.vmap(f)(x, y)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    with pytest.raises(RuntimeError, match="random operation"):  # randomness="error", as torch.func.vmap's default
        vmap_rows(lambda a: a + torch.rand(()), (x,))
    same = vmap_rows(lambda a: a * 0 + torch.rand(()), (x,), "same")
    assert torch.equal(same[0], same[1])
    # what it does not take, torch.func.vmap takes, with its own words
    with pytest.raises(ValueError, match="same size in the mapped dimension"):
        vmap_rows(f, (x, y[:3]))
    with pytest.raises(ValueError, match="in_dim=0 for an input but the input is of type"):
        vmap_rows(lambda a, s: a * s, (x, 2.0))


@pytest.mark.parametrize(
    "f",
    [
        lambda a: a.sin(),  # one tensor
        lambda a: (a.cos(), a * 2),  # a tuple of tensors
        lambda a: a.max(dim=-1),  # a structseq (torch.return_types.max): its type kept
        lambda a: [a.exp(), a],  # a list
        lambda a: {"y": a.tanh()},  # a dict
        lambda a: (torch.ones(2, dtype=a.dtype), a),  # an output that does not depend on the input
    ],
    ids=["tensor", "tuple", "structseq", "list", "dict", "unbatched_output"],
)
def test_vmap_rows_returns_what_torch_func_vmap_returns(f):
    from opcheck.engine._util import vmap_rows

    x = torch.randn(5, 3, dtype=torch.float64)
    got, want = vmap_rows(f, (x,)), torch.func.vmap(f)(x)
    assert type(got) is type(want)
    got_leaves, want_leaves = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves) and all(torch.equal(g, w) for g, w in zip(got_leaves, want_leaves))


def test_vmap_rows_says_what_torch_func_vmap_says_of_an_output_and_leaves_no_level_behind():
    from opcheck.engine._util import vmap_rows

    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="must only return Tensors, got type <class 'float'>"):
        vmap_rows(lambda a: (a, 1.0), (x,))
    with pytest.raises(ZeroDivisionError):
        vmap_rows(lambda a: 1 / 0, (x,))
    assert torch._C._functorch.maybe_current_level() is None  # every vmap level it entered, it left
    assert not torch._C._functorch.is_batchedtensor(vmap_rows(lambda a: a * 2, (x,)))


def test_batched_grad_is_torch_s_is_grads_batched():
    from opcheck.engine._util import batched_grad

    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    unused = torch.randn(2, dtype=torch.float64, requires_grad=True)
    outputs = (x.sin(), (w @ x).tanh())
    rows = (torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64))
    got = batched_grad(outputs, (x, w, unused), rows)
    want = torch.autograd.grad(
        outputs, (x, w, unused), rows, retain_graph=True, allow_unused=True, is_grads_batched=True
    )
    assert got[2] is None and want[2] is None
    assert all(torch.equal(g, v) for g, v in zip(got[:2], want[:2])) and got[1].shape == (7, 3, 5)
    assert not torch._C._functorch.is_batchedtensor(got[0])
    # what torch refuses, it refuses with its own words; the legacy vmap's level is left either way
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        batched_grad(outputs[:1], (x,), (torch.randn(7, 4, dtype=torch.float64),))
    alone = torch.autograd.grad(outputs[:1], (x,), rows[:1], retain_graph=True, is_grads_batched=True)
    assert torch.equal(batched_grad(outputs[:1], (x,), rows[:1])[0], alone[0])


class _Logged(torch.Tensor):
    """A tensor subclass that records the torch functions called on it."""

    seen: list[object] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_autograd_grad_is_torch_autograd_grad(monkeypatch):
    from opcheck.engine._util import autograd_grad

    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    unused = torch.randn(2, dtype=torch.float64, requires_grad=True)
    outputs = (x.sin(), (w @ x).tanh())
    cotangents = (torch.randn(5, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
    want = torch.autograd.grad(outputs, (x, w, unused), cotangents, retain_graph=True, allow_unused=True)
    second = torch.autograd.grad(outputs, (x,), cotangents, create_graph=True)[0].sum()
    want_second = torch.autograd.grad(second, (x, w), retain_graph=True)

    real = torch.autograd.grad
    with monkeypatch.context() as patched:  # plain tensors never reach torch.autograd.grad's wrapper
        patched.setattr(torch.autograd, "grad", lambda *a, **k: pytest.fail("torch.autograd.grad was called"))
        got = autograd_grad(outputs, (x, w, unused), cotangents, retain_graph=True)
        assert got[2] is None and all(torch.equal(g, v) for g, v in zip(got[:2], want[:2]))
        first = autograd_grad(outputs, (x,), cotangents, create_graph=True)[0]  # the graph is retained
        assert first.requires_grad and torch.equal(first.detach(), want[0])
        got_second = autograd_grad((first.sum(),), (x, w), (torch.ones((), dtype=torch.float64),), retain_graph=True)
        assert all(torch.equal(g, v) for g, v in zip(got_second, want_second))
        autograd_grad(outputs, (x,), cotangents)  # retain_graph defaults to create_graph, as torch's
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        autograd_grad(outputs, (x,), cotangents)

    # what torch refuses, it refuses with its own words
    y = x.sin()
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        autograd_grad((y,), (x,), (torch.ones(4, dtype=torch.float64),), retain_graph=True)
    with pytest.raises(RuntimeError, match="For complex Tensors"):
        autograd_grad((y,), (x,), (torch.ones(5, dtype=torch.complex128),), retain_graph=True)
    with pytest.raises(RuntimeError, match="cannot be empty"):
        autograd_grad((y,), (), (torch.ones(5, dtype=torch.float64),), retain_graph=True)
    # a tensor subclass's __torch_function__ sees torch.autograd.grad, as it would without opcheck
    logged = x.detach().as_subclass(_Logged).requires_grad_()
    _Logged.seen.clear()
    got_logged = autograd_grad((logged.sin(),), (logged,), (cotangents[0],))
    assert real in _Logged.seen
    assert torch.allclose(got_logged[0].as_subclass(torch.Tensor), x.detach().cos() * cotangents[0])


def test_the_first_cotangent_is_the_batched_checks_first_draw():
    o = torch.empty(2, 3, dtype=torch.float32)
    first = aux_checks.first_cotangent(o, 1)
    drawn = aux_checks.randn_like(o, torch.Generator().manual_seed(aux_checks.SEED + 1))
    assert torch.equal(first, drawn) and first.dtype == torch.float32
    assert aux_checks.first_cotangent(torch.empty(2, 3), 1) is first  # kept for the next call
    assert not torch.equal(aux_checks.first_cotangent(o, 0), first)
