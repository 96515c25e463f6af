"""`--opcheck-results PATH` across runs: a run updates the records of the tests it ran, keeps the
others, drops those of tests that no longer exist, and never loses a file it cannot read."""

import json

import pytest
from plugin_helpers import generated_module, param, spec_source

OPS = """
import os

import torch


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (3 if os.environ.get("SQUARE_BROKEN") else 2) * g * x


def square(x):
    return _Square.apply(x)
"""

TWO_SAMPLES = "(Sample('a', args=(TensorArg(shape=(3,)),)), Sample('b', args=(TensorArg(shape=(4,)),)))"


def sq_module(samples=("a", "b")):
    return generated_module(
        spec_source("sq", "ops:square", samples=TWO_SAMPLES, gradcheck="GradcheckFlags(check_batched_grad=False)"),
        {"gradcheck": [param("cpu", "float64", s) for s in samples]},
    )


SIN_MODULE = generated_module(
    spec_source("sin", "torch.sin", samples=TWO_SAMPLES), {"gradcheck": [param("cpu", "float64", "a")]}
)

SQ_A, SQ_B = "test_sq.py::test_gradcheck[cpu-float64-a]", "test_sq.py::test_gradcheck[cpu-float64-b]"
SIN_A = "test_sin.py::test_gradcheck[cpu-float64-a]"


@pytest.fixture
def suite(pytester):
    pytester.syspathinsert()
    pytester.makepyfile(ops=OPS, test_sq=sq_module(), test_sin=SIN_MODULE)
    return pytester


def records(pytester) -> dict[str, dict]:
    return {r["nodeid"]: r for r in json.loads((pytester.path / "r.json").read_text())["tests"]}


def outcomes(pytester) -> dict[str, str]:
    return {nodeid: r["outcome"] for nodeid, r in records(pytester).items()}


def expect_summary(result, pytester, text):
    result.stdout.fnmatch_lines([f"*- opcheck results of {text}: {pytester.path / 'r.json'} -*"])


def test_a_subset_run_updates_the_tests_it_ran_and_keeps_the_others(suite, monkeypatch):
    monkeypatch.setenv("SQUARE_BROKEN", "1")
    first = suite.runpytest("--opcheck-results", "r.json")
    first.assert_outcomes(passed=1, failed=2)
    expect_summary(first, suite, "3 generated tests")
    failed_b = records(suite)[SQ_B]

    monkeypatch.delenv("SQUARE_BROKEN")  # the bug is fixed; rerun the `a` samples only
    second = suite.runpytest("--opcheck-results", "r.json", "-k", "float64-a")
    second.assert_outcomes(passed=2, deselected=1)
    expect_summary(second, suite, "3 generated tests (2 from this run, 1 kept from earlier runs)")
    assert outcomes(suite) == {SQ_A: "passed", SQ_B: "failed", SIN_A: "passed"}
    assert records(suite)[SQ_B] == failed_b  # kept as it was, worst entry and message included
    assert records(suite)[SQ_A].keys().isdisjoint({"worst", "hint", "message"})


def test_records_of_tests_that_no_longer_exist_are_dropped_once_that_is_known(suite):
    suite.runpytest("--opcheck-results", "r.json").assert_outcomes(passed=3)
    suite.makepyfile(test_sq=sq_module(samples=("a",)))  # the spec lost its sample `b`

    # a node id collects its module in part: nothing says `b` is gone
    named = suite.runpytest("--opcheck-results", "r.json", SQ_A)
    expect_summary(named, suite, "3 generated tests (1 from this run, 2 kept from earlier runs)")
    assert set(outcomes(suite)) == {SQ_A, SQ_B, SIN_A}

    # -k deselects after collection: test_sq.py was collected whole, and has no `b` any more
    subset = suite.runpytest("--opcheck-results", "r.json", "-k", "sin")
    subset.assert_outcomes(passed=1, deselected=1)
    expect_summary(
        subset, suite, "2 generated tests (1 from this run, 1 kept from earlier runs, 1 dropped (no longer exist))"
    )
    assert set(outcomes(suite)) == {SQ_A, SIN_A}

    # a module deleted (its spec removed) takes its records along, whatever the run collects
    (suite.path / "test_sin.py").unlink()
    deleted = suite.runpytest("--opcheck-results", "r.json", "test_sq.py")
    expect_summary(
        deleted, suite, "1 generated test (1 from this run, 0 kept from earlier runs, 1 dropped (no longer exist))"
    )
    assert set(outcomes(suite)) == {SQ_A}


def test_under_xdist_the_workers_say_which_tests_exist(suite):
    pytest.importorskip("xdist")
    suite.runpytest("--opcheck-results", "r.json").assert_outcomes(passed=3)
    suite.makepyfile(test_sq=sq_module(samples=("a",)))
    result = suite.runpytest_subprocess("--opcheck-results", "r.json", "-n", "2", "-k", "sin")
    result.assert_outcomes(passed=1)
    expect_summary(
        result, suite, "2 generated tests (1 from this run, 1 kept from earlier runs, 1 dropped (no longer exist))"
    )
    assert set(outcomes(suite)) == {SQ_A, SIN_A}


def test_a_test_of_an_unavailable_device_keeps_its_earlier_record(suite, monkeypatch):
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cuda")
    suite.makepyfile(
        test_sin=generated_module(
            spec_source("sin", "torch.sin", samples=TWO_SAMPLES),
            {"gradcheck": [param(d, "float64", s) for d in ("cpu", "cuda") for s in ("a", "b")]},
        )
    )
    cuda_a = "test_sin.py::test_gradcheck[cuda-float64-a]"
    earlier = dict(spec="sin", check="gradcheck", device="cuda", dtype="float64", sample="a", outcome="passed")
    (suite.path / "r.json").write_text(
        json.dumps({"format": "opcheck-results", "version": 1, "tests": [dict(earlier, nodeid=cuda_a)]})
    )
    result = suite.runpytest("--opcheck-results", "r.json", "test_sin.py")
    result.assert_outcomes(passed=2, deselected=2)
    found = outcomes(suite)
    assert found[cuda_a] == "passed"  # a run on a GPU machine said so; this one could not run it
    assert found["test_sin.py::test_gradcheck[cuda-float64-b]"] == "skipped"  # none said anything else
    expect_summary(result, suite, "4 generated tests (3 from this run, 1 kept from earlier runs)")


@pytest.mark.parametrize(
    "content, problem",
    [
        ('{"format": "opcheck-results", "version": 1, "tests": [', "not valid JSON: *"),
        ("<testsuites></testsuites>", "not valid JSON: *"),
        ('{"format": "opcheck-results", "version": 99, "tests": []}', "results format version 99; *"),
    ],
)
def test_a_file_that_holds_no_results_is_moved_aside_not_lost(suite, content, problem):
    (suite.path / "r.json").write_text(content)
    result = suite.runpytest("--opcheck-results", "r.json", "test_sin.py")
    result.assert_outcomes(passed=1)
    path = suite.path / "r.json"
    result.stdout.fnmatch_lines(
        [
            f"opcheck: {path} held no opcheck results ({problem}); moved it to {path}.unreadable and wrote "
            "this run's results in its place"
        ]
    )
    assert (suite.path / "r.json.unreadable").read_text() == content
    assert outcomes(suite) == {SIN_A: "passed"}
    # once more: the first backup stays, the next one gets its own name
    path.write_text(content)
    suite.runpytest("--opcheck-results", "r.json", "test_sin.py").assert_outcomes(passed=1)
    assert (suite.path / "r.json.unreadable.2").read_text() == content
    assert (suite.path / "r.json.unreadable").read_text() == content
