"""fast_mode auto: the full Jacobian within the budget, projections beyond; spec and options force it."""

import pytest
import torch

import opcheck.engine as engine
from opcheck.runtime import DEFAULT_JACOBIAN_BUDGET, Settings, run_check
from opcheck.runtime.context import ItemContext, current_item, parse_budget
from opcheck.runtime.policy import choose_policy, jacobian_entries
from opcheck.runtime.samples import build_calls, case_id, seed_for
from opcheck.spec.model import GradcheckFlags, OpSpec, Sample, TensorArg


def test_jacobian_entries_first_and_second_order():
    assert jacobian_entries("gradcheck", [6, 4], [5]) == 50
    assert jacobian_entries("forward_ad", [6], [5, 2]) == 42
    # gradgradcheck checks (inputs, grad_outputs) -> input grads
    assert jacobian_entries("gradgradcheck", [6, 4], [5]) == (10 + 5) * 10
    assert jacobian_entries("fwgrad_bwgrad", [3], [3]) == 18


def test_auto_compares_entries_with_the_budget():
    s = Settings(budget=100)
    assert choose_policy("auto", s, 100).fast_mode is False
    p = choose_policy("auto", s, 101)
    assert p.fast_mode is True and "101 Jacobian entries > budget 100" in p.describe()
    assert choose_policy("auto", Settings(), DEFAULT_JACOBIAN_BUDGET).fast_mode is False


def test_spec_forces_and_options_override():
    never = lambda: pytest.fail("entries are only counted for auto")  # noqa: E731
    assert choose_policy("true", Settings(), never).fast_mode is True
    assert choose_policy("false", Settings(), never).fast_mode is False
    assert choose_policy("true", Settings(policy="full"), never).fast_mode is False
    assert choose_policy("false", Settings(policy="fast"), never).fast_mode is True
    assert choose_policy("true", Settings(policy="auto", budget=10), 5).fast_mode is False
    assert "--opcheck-policy=full" in choose_policy("true", Settings(policy="full"), never).reason


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
    return OpSpec(name="wrong_entry", op="runtime_ops:one_wrong_entry", source="op_specs/wrong_entry.yaml",
                  sha256="0", samples=(Sample("square", args=(TensorArg(shape=(32, 32)),)),),
                  gradcheck=GradcheckFlags(fast_mode=fast_mode, check_batched_grad=False))


def test_auto_catches_one_wrong_entry_of_a_32x32_jacobian_that_torch_fast_mode_misses():
    spec = wrong_entry_spec()
    seed = seed_for(spec.name, case_id("gradcheck", "cpu", "float64", "square"))
    (call,) = build_calls(spec, spec.samples[0], "cpu", "float64", seed)
    # the premise, on the very sample the test draws: torch's fast mode passes it
    assert torch.autograd.gradcheck(call.as_function(), call.gradcheck_inputs(), fast_mode=True)
    with pytest.raises(engine.GradcheckError) as info:
        run_check(spec, "gradcheck", "cpu", "float64", "square")
    text = str(info.value)
    assert "1 of 1048576 Jacobian entries differ" in text and "d out[0, 3] / d in[0, 3]" in text
    assert "full Jacobian: auto: 1048576 Jacobian entries <= budget 1048576" in text
    run_check(wrong_entry_spec("true"), "gradcheck", "cpu", "float64", "square")  # fast mode: passes


def test_a_smaller_budget_switches_auto_to_fast_mode():
    ctx = ItemContext(nodeid="x", rerun="pytest x", settings=Settings(budget=1000, budget_source="--opcheck-budget"))
    token = current_item.set(ctx)
    try:
        run_check(wrong_entry_spec(), "gradcheck", "cpu", "float64", "square")  # projections miss the entry
    finally:
        current_item.reset(token)
