"""fast_mode auto: the engine's auto mode with the run's budget; spec and options force full or fast mode."""

import pytest
import torch

import opcheck.engine as engine
from opcheck.runtime import DEFAULT_JACOBIAN_BUDGET, Settings, run_check
from opcheck.runtime.context import ItemContext, current_item, parse_budget
from opcheck.runtime.policy import choose_policy, jacobian_entries
from opcheck.runtime.samples import build_calls
from opcheck.spec.case import CaseId
from opcheck.spec.model import FastMode, GradcheckFlags, OpSpec, Sample, TensorArg
from tests.broken_ops import SQUARE


def test_jacobian_entries_first_and_second_order():
    assert jacobian_entries("gradcheck", [6, 4], [5]) == 50
    assert jacobian_entries("forward_ad", [6], [5, 2]) == 42
    # gradgradcheck checks (inputs, grad_outputs) -> input grads
    assert jacobian_entries("gradgradcheck", [6, 4], [5]) == (10 + 5) * 10
    assert jacobian_entries("fwgrad_bwgrad", [3], [3]) == 18


def test_auto_hands_the_budget_to_the_engine():
    never = lambda: pytest.fail("entries are only counted to describe a failure")  # noqa: E731
    p = choose_policy("auto", Settings(budget=100), never)
    assert p.engine_kwargs() == {"fast_mode": "auto", "jacobian_budget": 100}
    assert choose_policy("auto", Settings(), never).budget == DEFAULT_JACOBIAN_BUDGET == engine.DEFAULT_JACOBIAN_BUDGET
    assert choose_policy("true", Settings(), never).engine_kwargs() == {"fast_mode": True}
    assert choose_policy("false", Settings(), never).engine_kwargs() == {"fast_mode": False}


_SquareNoVmap = SQUARE.function("SquareNoVmap")  # no vmap rule; its backward, of torch ops, batches


def test_auto_describes_what_the_engine_did():
    x = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    full = engine.gradcheck_report(torch.sin, (x,), fast_mode="auto", jacobian_budget=4096)
    assert (
        choose_policy("auto", Settings(budget=4096), 4096).describe(full)
        == "auto: full Jacobian (4096 entries <= budget 4096)"
    )
    projected = engine.gradcheck_report(torch.sin, (x,), fast_mode="auto", jacobian_budget=100)
    assert (
        choose_policy("auto", Settings(budget=100, budget_source="--opcheck-budget"), 4096).describe(projected)
        == "auto: projections (J·U from forward AD, fused), 4096 entries > budget 100 from --opcheck-budget"
    )
    y = torch.randn(16, 16, dtype=torch.float64, requires_grad=True)  # passed on its projections, within budget
    middle = engine.gradcheck_report(torch.sin, (y,), fast_mode="auto")
    assert (
        choose_policy("auto", Settings(), 256**2).describe(middle)
        == "auto: projections (J·U from forward AD, fused), 65536 entries <= budget 1048576"
    )
    z = torch.randn(8, 8, dtype=torch.complex128, requires_grad=True)
    complex_ = engine.gradcheck_report(torch.sin, (z,), fast_mode="auto", jacobian_budget=100)
    assert (
        choose_policy("auto", Settings(budget=100), 4096).describe(complex_)
        == "auto: projections (J·U from forward AD, fused), 4096 entries > budget 100"
    )
    # a function without vmap support whose backward batches: the full Jacobian by groups of columns
    grouped = engine.gradcheck_report(_SquareNoVmap.apply, (y[0],), fast_mode="auto")
    assert (
        choose_policy("auto", Settings(), 256).describe(grouped)
        == "auto: full Jacobian (grouped finite differences), 256 entries <= budget 1048576"
    )
    # no verdict (the check raised): the plan, and the size when it can be counted
    assert choose_policy("auto", Settings(budget=100), 4096).describe() == (
        "fast_mode auto (spec gradcheck.fast_mode): full Jacobian up to 128 input and output elements, entrywise "
        "projections beyond, decided by the full Jacobian within budget 100 entries; this check has 4096 entries"
    )


def test_a_failing_projection_names_its_source_in_the_policy_row():
    from runtime_ops import one_wrong_entry

    x = torch.rand(32, 32, dtype=torch.float64, requires_grad=True)
    report = engine.gradcheck_report(
        one_wrong_entry, (x,), fast_mode="auto", jacobian_budget=1000, check_batched_grad=False
    )
    assert not report.passed
    assert (
        choose_policy("auto", Settings(budget=1000), 32**4).describe(report)
        == f"auto: projections (J·U from {report.mismatch.source}), 1048576 entries > budget 1000"
    )


class _SmallInputWrong(torch.autograd.Function):
    """Two inputs: the small one's gradient takes a neighbour's cotangent, the large one's is right."""

    @staticmethod
    def forward(ctx, y, x):
        ctx.save_for_backward(x)
        return y * 2, x.sin()

    @staticmethod
    def backward(ctx, gy, gx):
        (x,) = ctx.saved_tensors
        g = gy * 2
        g[0] += gy[1]
        return g, gx * x.cos()


def test_a_block_recomputed_in_full_names_the_comparison_that_found_it_from_the_report():
    # beyond the budget as a whole, the failing block fits it: the mismatch is the full block, and
    # the engine's stats, not its message, say which projection found it
    y = torch.rand(4, dtype=torch.float64, requires_grad=True)
    x = torch.rand(20, 20, dtype=torch.float64, requires_grad=True)
    report = engine.gradcheck_report(
        _SmallInputWrong.apply, (y, x), fast_mode="auto", jacobian_budget=10_000, check_batched_grad=False
    )
    assert not report.passed and "recomputed in full" in report.message
    found = report.stats.failed_path
    assert found is not None and found.startswith("projected (J·U from ")
    report.stats.auto_paths.clear()  # as when no other comparison passed before it
    description = choose_policy("auto", Settings(budget=10_000), 404 * 404).describe(report)
    assert description == f"auto: {found.replace('projected', 'projections', 1)}, 163216 entries > budget 10000"


def test_spec_forces_and_options_override():
    never = lambda: pytest.fail("entries are only counted for auto")  # noqa: E731
    assert choose_policy("true", Settings(), never).fast_mode is True
    assert choose_policy("false", Settings(), never).fast_mode is False
    assert choose_policy("true", Settings(policy="full"), never).fast_mode is False
    assert choose_policy("false", Settings(policy="fast"), never).fast_mode is True
    assert choose_policy("true", Settings(policy="auto", budget=10), never).engine_kwargs() == {
        "fast_mode": "auto",
        "jacobian_budget": 10,
    }
    assert "--opcheck-policy=full" in choose_policy("true", Settings(policy="full"), never).reason
    assert "--opcheck-policy=auto" in choose_policy("true", Settings(policy="auto"), never).reason


def test_the_spec_fast_mode_may_be_a_member_or_its_spelling():
    never = lambda: pytest.fail("entries are only counted for auto")  # noqa: E731
    for mode in FastMode:
        assert choose_policy(mode, Settings(), never) == choose_policy(mode.value, Settings(), never)
    assert choose_policy(FastMode.FALSE, Settings(), never).reason == "fast_mode false (spec gradcheck.fast_mode)"
    assert type(choose_policy(FastMode.AUTO, Settings(), never).engine_kwargs()["fast_mode"]) is str


def test_parse_budget():
    assert parse_budget("1048576", where="x") == 2**20
    assert parse_budget("2**20", where="x") == 2**20
    assert parse_budget("4M", where="x") == 4 * 2**20
    assert parse_budget("512k", where="x") == 512 * 1024
    assert parse_budget("1e6", where="x") == 10**6
    for bad in ("", "0", "-5", "lots", "1.5"):
        with pytest.raises(ValueError, match="x: expected a positive number"):
            parse_budget(bad, where="x")


def test_env_budget_reaches_checks_outside_pytest(monkeypatch):
    monkeypatch.setenv("OPCHECK_JACOBIAN_BUDGET", "2**10")
    assert Settings.from_env() == Settings(budget=1024, budget_source="OPCHECK_JACOBIAN_BUDGET")


def wrong_entry_spec(fast_mode="auto"):
    return OpSpec(
        name="wrong_entry",
        op="runtime_ops:one_wrong_entry",
        source="op_specs/wrong_entry.yaml",
        sha256="0",
        samples=(Sample("square", args=(TensorArg(shape=(32, 32)),)),),
        gradcheck=GradcheckFlags(fast_mode=fast_mode, check_batched_grad=False),
    )


def test_auto_catches_one_wrong_entry_of_a_32x32_jacobian_that_torch_fast_mode_misses():
    spec = wrong_entry_spec()
    seed = CaseId(spec.name, "gradcheck", "cpu", "float64", "square").seed()
    (call,) = build_calls(spec, spec.samples[0], "cpu", "float64", seed)
    # the premise, on the very sample the test draws: torch's fast mode passes it
    assert torch.autograd.gradcheck(call.as_function(), call.gradcheck_inputs(), fast_mode=True)
    with pytest.raises(engine.GradcheckError) as info:
        run_check(spec, "gradcheck", "cpu", "float64", "square")
    text = str(info.value)
    assert "1 of 1048576 Jacobian entries differ" in text and "d out[0, 3] / d in[0, 3]" in text
    assert "policy:      auto: full Jacobian (1048576 entries <= budget 1048576)" in text
    run_check(wrong_entry_spec("true"), "gradcheck", "cpu", "float64", "square")  # fast mode: passes


def test_beyond_a_smaller_budget_auto_still_catches_the_entry_with_projections():
    ctx = ItemContext(nodeid="x", rerun="pytest x", settings=Settings(budget=1000, budget_source="--opcheck-budget"))
    token = current_item.set(ctx)
    try:
        with pytest.raises(engine.GradcheckError) as info:
            run_check(wrong_entry_spec(), "gradcheck", "cpu", "float64", "square")
    finally:
        current_item.reset(token)
    text = str(info.value)
    assert "auto: J·U projections against finite differences" in text and "the first: [0, 3]" in text
    assert "policy:      auto: projections (J·U from " in text
    assert "1048576 entries > budget 1000 from --opcheck-budget" in text
