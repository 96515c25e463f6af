"""The plan benchmark holds the cost estimate's plans to the calls the generated tests make: on the
catalog every passing test's forward-side calls are the planned ones, a test expected to fail
because the op's backward raises is planned to its crash, and a plan off by one call is reported."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch
from bench_runner import run_benchmark, script


@pytest.mark.long
def test_every_passing_test_of_the_catalog_makes_the_calls_its_plan_counts(tmp_path):
    """Every cpu gradcheck, forward_ad, gradgradcheck and fwgrad_bwgrad test of op_specs/: real ops,
    custom ops, complex, sparse and second-order checks, batched and looped, each planned by the
    engine's own check of a stand-in; but where the engine makes a timed
    choice (it decides by timing its own calls, which a loaded machine moves), where the test's
    values decide (entries near the tolerance, batched results that disagree with plain calls), and
    an expected failure's (its batches too may grow otherwise than planned)."""
    out = tmp_path / "plan.json"
    proc = run_benchmark("bench_plan", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"^tests: (\d+) of (\d+) planned the op's calls they made", proc.stdout, re.M)
    assert found, proc.stdout  # (its count takes the timed choices too, which a loaded machine moves)
    records = json.loads(out.read_text())
    passing = [r for r in records if not r["expected_failure"]]
    assert len(passing) == int(found.group(2)) >= 500
    checks = {r["test"].split("::")[1].split("[")[0] for r in records}
    assert checks == {"test_gradcheck", "test_forward_ad", "test_gradgradcheck", "test_fwgrad_bwgrad"}
    assert all(r["outcome"] == "passed" and r["made"] > 0 for r in passing)
    # (forward AD through backward times its batched JVPs against the loop: most timed tests are those)
    decided = [r for r in passing if not r["timed"] and not r["by_values"]]
    assert len(decided) >= 0.85 * len(passing), len(decided)
    assert all(r["planned"] == r["made"] for r in decided), [r for r in decided if r["planned"] != r["made"]]


DRY_RUN_SPECS = ("complex", "unary", "rms_norm", "cube", "multi_output")
"""Complex inputs and outputs, forward AD (sin, exp, ... on complex inputs), a custom op whose
backward has no batching rule, a Function without a vmap rule, outputs without a gradient."""


def test_the_engine_run_on_a_stand_in_makes_the_calls_it_makes_on_the_op(tmp_path):
    """The dry run (--dry-run: the engine's own check of a function with the probed shapes and
    support) makes the op's calls, and the engine's backward passes, on every test of these specs,
    forward_ad, gradgradcheck and fwgrad_bwgrad included."""
    out = tmp_path / "plan.json"
    specs = [arg for name in DRY_RUN_SPECS for arg in ("--specs", f"op_specs/{name}.yaml")]
    proc = run_benchmark("bench_plan", *specs, "--dry-run", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = json.loads(out.read_text())
    dry = [r for r in records if r["dry_run"] is not None]
    checks = {r["test"].split("::")[1].split("[")[0] for r in dry}
    assert checks == {"test_gradcheck", "test_forward_ad", "test_gradgradcheck", "test_fwgrad_bwgrad"}, checks
    assert len(dry) >= 300 and any("complex128" in r["test"] for r in dry)
    assert all(r["outcome"] == "passed" for r in dry)
    # rms_norm's first derivative has no batching rule where its forward has one, and its column
    # groups are more than the grouped finite differences take: so the stand-in's
    assert all(r["dry_run"] == r["made"] for r in dry), [r for r in dry if r["dry_run"] != r["made"]]
    assert any(r["test"] == "rms_norm::test_gradgradcheck[cpu-float64-toy]" for r in dry)
    # the engine's backward passes, which a wrapper of the op does not see
    assert all(r["backward_made"] is not None for r in dry)
    backward = [r for r in dry if "test_forward_ad" not in r["test"] and "test_fwgrad_bwgrad" not in r["test"]]
    assert all(r["dry_run_backward"] == r["backward_made"] > 0 for r in backward)
    assert all(r["dry_run_backward"] == r["backward_made"] for r in dry)


CRASHING_SPEC = """\
op: torch.scatter_add
samples:
  # src larger than index: ScatterAddBackward0 returns src's gradient in index's shape, and autograd
  # raises in every plain backward (pytorch/pytorch#27614)
  - name: src_larger_than_index
    args: [{shape: [2, 3]}, 1, {shape: [2, 2], dtype: int64, low: 0, high: 3}, {shape: [2, 5]}]
expected_failures:
  - where: {sample: src_larger_than_index, check: [gradcheck]}
    reason: invalid gradient at index 1
"""


def test_a_test_expected_to_crash_is_planned_to_its_crash(tmp_path):
    """The fused passes fall back from the raising backward, the step-by-step check's first plain
    backward ends the call, and the crash's report calls the op once more (the policy's count);
    the engine run on the op's stand-in, whose backward raises too, makes the same calls."""
    spec = tmp_path / "scatter_add.yaml"
    spec.write_text(CRASHING_SPEC)
    out = tmp_path / "plan.json"
    proc = run_benchmark("bench_plan", "--specs", str(spec), "--json", str(out), "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = [r for r in json.loads(out.read_text()) if "test_gradcheck" in r["test"]]
    assert record["expected_failure"] and record["outcome"] == "CheckCrashed", record
    assert record["planned"] == record["made"] == record["dry_run"] > 0, record
    assert record["path"][-1] == "crashes: a plain backward raises", record


def test_a_plan_off_by_one_call_is_reported_and_fails_the_run(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("bench_plan", script("bench_plan"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from opcheck.runtime.cost import estimate

    plans_of = estimate.plans_of

    def one_more(*args, **kwargs):
        plans = plans_of(*args, **kwargs)
        plans[-1].add(bench.Kind.FORWARD)
        return plans

    monkeypatch.setattr(estimate, "plans_of", one_more)
    assert bench.main(["--specs", "op_specs/sin.yaml"]) == 1
    out = capsys.readouterr().out
    differs = re.findall(r"^differs: sin::test_\w+\[cpu-\w+-\w+\]: planned (\d+), made (\d+) \(passed\)", out, re.M)
    assert differs and all(int(planned) == int(made) + 1 for planned, made in differs), out
    assert re.search(r"^tests: 0 of \d+ planned the op's calls they made", out, re.M), out


def test_large_dry_runs_on_meta_tensors_make_the_evaluations_of_real_ones():
    spec = importlib.util.spec_from_file_location("bench_plan", script("bench_plan"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = {"sin": (torch.sin, (16, 16)), "square": (bench._SquareWithoutVmap.apply, (32, 16))}
    lines = bench.large(cases)
    assert [line.split(" at ")[0] for line in lines] == ["sin", "square"]
    assert all(line.endswith("(passed: True); same evaluations: True") for line in lines), lines
