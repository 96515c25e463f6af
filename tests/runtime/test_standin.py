"""A dry run of the engine on a probed function's stand-in (opcheck.runtime.cost.standin) makes the
evaluations the engine makes on the function itself: the same plain, vmapped, backward, batched
backward, JVP and batched JVP calls and the same path, passing and failing. Counts only; the sizes
are those whose evaluations no timing decides (a batch schedule's growth, the fused projections'
choice between backward's rows and the columns' differences)."""

from __future__ import annotations

import warnings

import pytest
import torch

import opcheck
from opcheck.runtime.cost.probe import Probe
from opcheck.runtime.cost.standin import stand_in
from tests import broken_ops

# Kernel-like Functions (tests/broken_ops.py): sin with a vmap rule, x*x without one; neither has
# forward AD. The wrong ones' backward is off by 2x.
SIN = broken_ops.SIN.function("StandInSin", vmap=True)
WRONG_SIN = broken_ops.SIN.function("StandInWrongSin", bug=broken_ops.scaled(2.0), vmap=True)
SQUARE = broken_ops.SQUARE.function("StandInSquare")
WRONG_SQUARE = broken_ops.SQUARE.function("StandInWrongSquare", bug=broken_ops.scaled(2.0))


def _x(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


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
}
FAILING = {  # (the function as it is, the wrong one, shapes)
    "sin, 12": (SIN.apply, WRONG_SIN.apply, [(3, 4)]),
    "sin, 2": (SIN.apply, WRONG_SIN.apply, [(2,)]),
    "no vmap, 2": (SQUARE.apply, WRONG_SQUARE.apply, [(2,)]),
    "no vmap, 12": (SQUARE.apply, WRONG_SQUARE.apply, [(3, 4)]),
    "no vmap, 40": (SQUARE.apply, WRONG_SQUARE.apply, [(40,)]),
}
MODES = {
    "auto": dict(fast_mode="auto"),
    "full": dict(fast_mode=False),
    "fast": dict(fast_mode=True),
    "auto, forward AD": dict(fast_mode="auto", check_forward_ad=True),
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
    return fn != SQUARE.apply


@pytest.mark.parametrize(
    "name, mode",
    [(n, m) for n in PASSING for m in MODES if _forward_ad(PASSING[n][0]) or not MODES[m].get("check_forward_ad")],
)
def test_a_dry_run_on_the_stand_in_makes_the_evaluations_of_a_passing_check(name, mode):
    fn, shapes = PASSING[name]
    flags = MODES[mode]
    made = _made(fn, shapes, flags)
    assert made[0], made
    standin = stand_in(Probe(fn, _inputs(shapes)))
    assert standin is not None
    assert _made(standin, shapes, flags) == made


@pytest.mark.parametrize("mode", ["auto", "full", "fast"])
@pytest.mark.parametrize("name", list(FAILING))
def test_a_dry_run_on_a_wrong_stand_in_makes_the_evaluations_of_a_failing_check(name, mode):
    right, wrong, shapes = FAILING[name]
    made = _made(wrong, shapes, MODES[mode])
    assert not made[0], made
    standin = stand_in(Probe(right, _inputs(shapes)), wrong=2.0)
    assert standin is not None
    assert _made(standin, shapes, MODES[mode]) == made


def test_no_stand_in_for_complex_inputs_or_outputs():
    z = torch.randn(3, dtype=torch.complex128).requires_grad_()
    assert stand_in(Probe(torch.sin, (z,))) is None
    x = _x(3).requires_grad_()
    assert stand_in(Probe(lambda t: t * (1 + 1j), (x,))) is None
