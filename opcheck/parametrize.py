"""The parametrization of a generated module's test functions, made when pytest collects the module.

A generated module says, for each check, which devices and dtypes its test function covers (the
samples are its SPEC's) and which of its tests a rule marks. `grid` makes that function's
`pytest.mark.parametrize` over (device, dtype, sample): one `pytest.param` per case of
`opcheck.spec.case.cases_of(spec)` for the check, in that order, with the case's id, so ids, order
and seeds are the case's own. `skip` and `xfail` make a rule's mark, with its reason and where the
spec says it; a rule's torch condition becomes the mark's condition, evaluated here, when the module
is collected, so the module's text is the same whatever torch generated it.

Only generated modules (and the plugin) import this module; the rest of opcheck never imports pytest
through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from opcheck import _suite

_suite.require("a generated test module")  # every generated module imports this one first

from opcheck.spec.case import NEVER_RUNS, CaseId, cases_of  # noqa: E402
from opcheck.spec.model import OpSpec, Rule  # noqa: E402

PARAMS = ("device", "dtype", "sample")
"""The arguments of every generated test function, in the order of its ids."""


def grid(
    spec: OpSpec,
    check: str,
    *,
    devices: Sequence[str],
    dtypes: Sequence[str],
    marked: Mapping[str, pytest.MarkDecorator] | None = None,
) -> pytest.MarkDecorator:
    """`parametrize("device, dtype, sample")` over devices × dtypes × the spec's samples, less the
    (device, dtype) pairs that never run; `marked` maps a test's name (`test_gradcheck[cpu-float64-x]`)
    to its mark and may hold the other checks' tests too.

    Raises ValueError when the grid is not the spec's cases for `check`, or `marked` names a test
    of this check that the grid does not have: the module no longer matches its spec.
    """
    marked = {} if marked is None else marked
    cases = [
        CaseId(spec.name, check, device, dtype, sample.name)
        for device in devices
        for dtype in dtypes
        if (device, dtype) not in NEVER_RUNS
        for sample in spec.samples
    ]
    if cases != [case for case in cases_of(spec) if case.check == check]:
        raise ValueError(
            f"{spec.source}: test_{check} over devices {tuple(devices)} and dtypes {tuple(dtypes)} "
            f"is not what the spec generates; regenerate the module (`opcheck generate`)"
        )
    names = {case.name for case in cases}
    strays = [name for name in marked if name.startswith(f"test_{check}[") and name not in names]
    if strays:
        raise ValueError(
            f"{spec.source}: marked tests that test_{check} does not have: {', '.join(strays)}; "
            f"regenerate the module (`opcheck generate`)"
        )
    params = [
        pytest.param(case.device, case.dtype, case.sample, id=case.param_id, marks=marked.get(case.name, ()))
        for case in cases
    ]
    return pytest.mark.parametrize(PARAMS, params)


def skip(rule: Rule) -> pytest.MarkDecorator:
    """The mark of a `skips:` rule; with a torch condition, a `skipif` on the installed torch."""
    if rule.where.torch is not None:
        return pytest.mark.skipif(rule.where.matches_torch(), reason=reason(rule))
    return pytest.mark.skip(reason=reason(rule))


def xfail(rule: Rule) -> pytest.MarkDecorator:
    """The mark of an `expected_failures:` rule: strict, so an unexpected pass fails; with a torch
    condition, expected only where the installed torch meets it."""
    if rule.where.torch is not None:
        return pytest.mark.xfail(rule.where.matches_torch(), reason=reason(rule), strict=True)
    return pytest.mark.xfail(reason=reason(rule), strict=True)


def reason(rule: Rule) -> str:
    """What a marked test's report says: the rule's reason and where it is written (`file:line:col`)."""
    return f"{rule.reason} ({rule.location})" if rule.location.file else rule.reason
