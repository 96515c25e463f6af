"""A check kind's facts (opcheck.spec.model.CheckFacts) are what the runtime does with the kind:
the engine call it makes for a gradient check says the same as `second_order` and `forward_ad`."""

from __future__ import annotations

import pytest

from opcheck.runtime.checks import engine_call
from opcheck.runtime.context import Settings
from opcheck.runtime.policy import choose_policy
from opcheck.runtime.report import Case
from opcheck.runtime.tolerances import resolve_tolerances
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import Check

SPEC = load_spec_text("op: torch.sin\nsamples:\n  - name: m\n    args: [{shape: [3]}]\n", source="op_specs/sin.yaml")[0]
ENGINE_CHECKS = [c for c in Check if c not in (Check.LOWPREC, Check.LIBRARY_OPCHECK, Check.COMPILE)]


@pytest.mark.parametrize("check", ENGINE_CHECKS, ids=str)
def test_the_engine_call_is_what_the_kind_says(check: Check):
    case = Case.of(SPEC, check, "cpu", "float64", "m")
    tol = resolve_tolerances(SPEC, check, "cpu", "float64", case.sample)
    fn, kwargs = engine_call(case, tol, choose_policy("auto", Settings()))
    second_order = "gradgradcheck" in getattr(fn, "__name__", "") or "gradgradcheck" in repr(fn)
    assert second_order == check.second_order
    forward = kwargs.get("check_forward_ad", False) or kwargs.get("check_fwd_over_rev", False)
    assert forward == check.forward_ad


def test_every_kind_names_what_it_compares():
    assert all(c.path and c.description.startswith("opcheck: ") for c in Check)
    assert [c for c in Check if c.declared] == [Check.GRADGRAD_UNSUPPORTED, Check.FORWARD_AD_UNSUPPORTED]
