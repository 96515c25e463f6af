"""fast_mode="auto"'s route (opcheck.engine.route): which pass goes first, where a fallback hands the
call, when the step-by-step check starts with the full Jacobian, and the fused passes' footprint.
tests/runtime/test_cost.py holds the engine and the cost estimate to the same route."""

from __future__ import annotations

import pytest

from opcheck.engine import route
from opcheck.engine.route import Pass, Sizes, Stepwise, after_fallback, fused_elements, fused_order, stepwise_full_first

BUDGET = 2**20


def sizes(n: int, m: int, inputs: int = 1, budget: int = BUDGET, backward: bool = True) -> Sizes:
    return Sizes(n, m, inputs, budget, backward)


@pytest.mark.parametrize(
    "given, order",
    [
        (sizes(64, 64), (Pass.FULL,)),  # n + m at FULL_CHECK_ELEMENTS: the full check is cheap
        (sizes(64, 65), (Pass.PROJECTED, Pass.FULL)),  # beyond it, within the budget
        (sizes(2048, 1024), (Pass.PROJECTED,)),  # beyond the budget: no full check
        (sizes(8, 8, budget=63), (Pass.PROJECTED,)),  # a small Jacobian, but over a tiny budget
        (sizes(32, 64, backward=False), (Pass.FULL,)),  # forward AD alone, up to FORWARD_FULL_COLUMNS
        (sizes(33, 64, backward=False), (Pass.PROJECTED, Pass.FULL)),
        (sizes(33, 64, backward=True), (Pass.FULL,)),
    ],
)
def test_the_full_check_goes_first_only_where_it_is_cheap(given, order):
    assert fused_order(given) == order


def test_the_sizes_follow_the_constants():
    assert route.FULL_CHECK_ELEMENTS == 128 and route.FORWARD_FULL_COLUMNS == 32
    assert sizes(1, 127).full_first and not sizes(1, 128).full_first
    assert sizes(10, 5, inputs=3).loop_columns == 3 * route.LOOP_COLUMNS_PER_INPUT
    assert sizes(10, 5, budget=50).within_budget and not sizes(10, 6, budget=59).within_budget


@pytest.mark.parametrize(
    "attempt, loops, projections, complex_inputs, start",
    [
        (Pass.FULL, False, False, False, None),  # the next pass (or the step-by-step check as it is)
        (Pass.FULL, False, False, True, None),
        (Pass.FULL, True, False, False, None),
        (Pass.FULL, True, True, False, Stepwise(projections_first=True, unbatched_columns=True)),
        (Pass.PROJECTED, False, False, False, None),
        (Pass.PROJECTED, True, False, False, Stepwise(projections_first=True)),
        (Pass.PROJECTED, False, False, True, Stepwise(projections_first=True)),
        (Pass.PROJECTED, True, True, False, Stepwise(projections_first=True, unbatched_columns=True)),
    ],
)
def test_a_fallback_hands_the_call_on(attempt, loops, projections, complex_inputs, start):
    assert after_fallback(attempt, loops=loops, projections=projections, complex_inputs=complex_inputs) == start


@pytest.mark.parametrize(
    "given, start, full",
    [
        (sizes(200, 200), Stepwise(), True),  # within the budget, nothing against it
        (sizes(2048, 1024), Stepwise(), False),  # beyond the budget: the projections alone
        (sizes(200, 200), Stepwise(projections_first=True), False),  # the full check costs more
        (sizes(20, 20), Stepwise(projections_first=True), True),  # small: the full check still
        (sizes(16, 20), Stepwise(projections_first=True, unbatched_columns=True), True),  # loops over 16
        (sizes(17, 20), Stepwise(projections_first=True, unbatched_columns=True), False),  # would loop past 16
        (sizes(17, 20, inputs=2), Stepwise(projections_first=True, unbatched_columns=True), True),
    ],
)
def test_the_step_by_step_check_starts_with_the_full_jacobian_unless_the_projections_cost_less(given, start, full):
    assert stepwise_full_first(given, start) is full


def test_a_fused_pass_footprint_is_its_largest_batch_of_rows():
    # the full check's pass: m + outputs + 1 backward rows, 2n + 1 forward rows, each of n + m elements
    assert fused_elements(sizes(10, 5), outputs=1, projected=False) == max(5 + 2, 21) * 15
    assert fused_elements(sizes(3, 40), outputs=1, projected=False) == max(40 + 2, 7) * 43
    assert fused_elements(sizes(3, 40, backward=False), outputs=1, projected=False) == 7 * 43
    # the projections' pass: (COTANGENTS + 1) rows per output + 1, (3 DIRECTIONS + 1) per input
    k, k2 = route.DIRECTIONS, route.COTANGENTS
    assert (
        fused_elements(sizes(100, 50, inputs=2), outputs=3, projected=True)
        == max((k2 + 1) * 3 + 1, (3 * k + 1) * 2) * 150
    )


def test_the_jacobian_budget_is_auto_modes_alone():
    from opcheck.engine.flags import DEFAULT_JACOBIAN_BUDGET

    auto = Sizes.of(8, 8, 1, jacobian_budget=63, auto=True, backward=True)
    full = Sizes.of(8, 8, 1, jacobian_budget=63, auto=False, backward=True)
    assert auto.budget == 63 and not auto.within_budget
    assert full.budget == DEFAULT_JACOBIAN_BUDGET and route.full_mode_fused(full)
