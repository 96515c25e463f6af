"""Margins of passing tests: `--opcheck-margin FRACTION` lists the passes that came that close to
their bound, `--opcheck-results` and JUnit XML keep each pass's margin, serially and under xdist."""

import json

import pytest
from plugin_helpers import generated_module, param, spec_source

from opcheck.report.results import load_results

# 2 * x with a backward off by a known relative amount: at float64's atol 1e-5 and rtol 1e-3 every
# gradient entry is off by 2 * off of an allowance of 1e-5 + 2e-3.
OPS = """
import torch


def _scaled(off):
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (2 * (1 + off))

    return Scaled.apply


close = _scaled(8e-4)   # 1.6e-3 / 2.01e-3 = 0.796 of the bound
far = _scaled(1e-4)     # 2e-4 / 2.01e-3 = 0.0995
broken = _scaled(1e-2)  # fails
"""

CLOSE = "test_close.py::test_gradcheck[cpu-float64-vec]"
FAR = "test_far.py::test_gradcheck[cpu-float64-vec]"
BROKEN = "test_broken.py::test_gradcheck[cpu-float64-vec]"
SIN_LOWPREC = "test_sin.py::test_lowprec[cpu-float32-vec]"
GRADCHECK = "GradcheckFlags(check_batched_grad=False)"


def _module(name: str, op: str, checks: dict) -> str:
    return generated_module(spec_source(name, op, gradcheck=GRADCHECK), checks)


@pytest.fixture
def suite(pytester):
    pytester.syspathinsert()
    gradcheck = {"gradcheck": [param("cpu", "float64", "vec")]}
    pytester.makepyfile(
        ops=OPS,
        test_close=_module("close", "ops:close", gradcheck),
        test_far=_module("far", "ops:far", gradcheck),
        test_broken=_module("broken", "ops:broken", gradcheck),
        test_sin=_module("sin", "torch.sin", {"lowprec": [param("cpu", "float32", "vec")]}),
    )
    return pytester


def test_the_option_lists_the_passes_at_the_fraction_or_closer(suite):
    result = suite.runpytest("--opcheck-margin", "0.5")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- opcheck: 1 passing test at 0.5 of the bound or closer (error / allowed of the worst comparison) -*",
            f"0.8  {CLOSE}: VJP: d output 0 / d input 0",
        ]
    )
    assert FAR not in result.stdout.str() and BROKEN + ":" not in result.stdout.str()


def test_the_closest_pass_comes_first(suite):
    result = suite.runpytest("--opcheck-margin", "0.05", "-p", "no:randomly", FAR, CLOSE)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*- opcheck: 2 passing tests at 0.05 of the bound or closer *",
            f"0.8  {CLOSE}: VJP: d output 0 / d input 0",
            f"0.1  {FAR}: VJP: d output 0 / d input 0",
        ]
    )


def test_without_the_option_nothing_is_listed(suite):
    result = suite.runpytest(CLOSE)
    result.assert_outcomes(passed=1)
    assert "of the bound or closer" not in result.stdout.str()


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5", "half", "nan"])
def test_a_fraction_outside_0_to_1_is_a_usage_error(pytester, value):
    result = pytester.runpytest("--opcheck-margin", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    expected = "expected a fraction of the bound greater than 0 and at most 1 (e.g. 0.5)"
    result.stderr.fnmatch_lines([f"ERROR: --opcheck-margin: {expected}, got '{value}'"])


def test_the_results_file_and_junit_keep_each_pass_margin(suite):
    result = suite.runpytest("--opcheck-results", "r.json", "--junitxml", "j.xml")
    result.assert_outcomes(passed=3, failed=1)
    data = json.loads((suite.path / "r.json").read_text())
    assert data["version"] == 3
    records = {r["nodeid"]: r for r in data["tests"]}
    assert records[CLOSE]["margin"] == pytest.approx(1.6e-3 / 2.01e-3, abs=1e-3)
    assert records[CLOSE]["margin_where"] == "VJP: d output 0 / d input 0"
    assert records[FAR]["margin"] == pytest.approx(2e-4 / 2.01e-3, abs=1e-3)
    lowprec = records[SIN_LOWPREC]
    assert 0 < lowprec["margin"] <= 1  # the worst of its parts' error / allowed
    assert lowprec["margin_where"].startswith(("output", "VJP: gradient of "))  # sin: the output and the VJP
    assert "margin" not in records[BROKEN] and "margin_where" not in records[BROKEN]
    from_junit = {r.nodeid: (r.margin, r.margin_where) for r in load_results(suite.path / "j.xml")}
    assert from_junit == {nodeid: (r.get("margin"), r.get("margin_where", "")) for nodeid, r in records.items()}


@pytest.mark.long
def test_under_xdist_the_controller_lists_and_records_the_margins(suite):
    pytest.importorskip("xdist")
    result = suite.runpytest_subprocess("-n", "2", "--opcheck-margin", "0.5", "--opcheck-results", "r.json")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        ["*- opcheck: 1 passing test at 0.5 of the bound or closer *", f"0.8  {CLOSE}: VJP: d output 0 / d input 0"]
    )
    records = {r["nodeid"]: r for r in json.loads((suite.path / "r.json").read_text())["tests"]}
    assert records[CLOSE]["margin"] == pytest.approx(0.796, abs=1e-3)
