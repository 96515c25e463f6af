"""The plan benchmark holds the cost estimate's plans to the calls the generated tests make: on the
catalog every passing test's forward-side calls are the planned ones, a test expected to fail
because the op's backward raises is planned to its crash, and a plan off by one call is reported."""

from __future__ import annotations

import importlib.util
import json
import re

import torch
from bench_runner import run_benchmark, script


def test_every_passing_test_of_the_catalog_makes_the_calls_its_plan_counts(tmp_path):
    """Every cpu gradcheck, forward_ad and gradgradcheck test of op_specs/: real ops, custom ops,
    complex, sparse and second-order checks, batched and looped, their first-order plans the engine's
    own check of a stand-in; but where the plan makes a timed choice
    (the engine decides by timing its own calls, which a loaded machine moves), and an expected
    failure's (its batches too may grow otherwise than planned)."""
    out = tmp_path / "plan.json"
    proc = run_benchmark("bench_plan", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"^tests: (\d+) of (\d+) planned the op's calls they made", proc.stdout, re.M)
    assert found, proc.stdout  # (its count takes the timed choices too, which a loaded machine moves)
    records = json.loads(out.read_text())
    passing = [r for r in records if not r["expected_failure"]]
    assert len(passing) == int(found.group(2)) >= 500
    checks = {r["test"].split("::")[1].split("[")[0] for r in records}
    assert checks == {"test_gradcheck", "test_forward_ad", "test_gradgradcheck"}
    assert all(r["outcome"] == "passed" and r["made"] > 0 for r in passing)
    untimed = [r for r in passing if not r["timed"]]
    assert len(untimed) >= 0.9 * len(passing), len(untimed)
    assert all(r["planned"] == r["made"] for r in untimed), [r for r in untimed if r["planned"] != r["made"]]


DRY_RUN_SPECS = ("complex", "unary", "rms_norm", "cube", "multi_output")
"""Complex inputs and outputs, forward AD (sin, exp, ... on complex inputs), a custom op whose
backward has no batching rule, a Function without a vmap rule, outputs without a gradient."""


def test_the_engine_run_on_a_stand_in_makes_the_calls_it_makes_on_the_op(tmp_path):
    """The dry run (--dry-run: the engine's own check of a function with the probed shapes and
    support) makes the op's calls on every test of these specs, forward_ad and gradgradcheck
    included, but one, where the model's second walk misses some."""
    out = tmp_path / "plan.json"
    specs = [arg for name in DRY_RUN_SPECS for arg in ("--specs", f"op_specs/{name}.yaml")]
    proc = run_benchmark("bench_plan", *specs, "--dry-run", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = json.loads(out.read_text())
    dry = [r for r in records if r["dry_run"] is not None]
    checks = {r["test"].split("::")[1].split("[")[0] for r in dry}
    assert checks == {"test_gradcheck", "test_forward_ad", "test_gradgradcheck"}, checks
    assert len(dry) >= 300 and any("complex128" in r["test"] for r in dry)
    assert all(r["outcome"] == "passed" for r in dry)
    # rms_norm's first derivative has no batching rule where its forward has one: the stand-in's
    # backward batches wherever its forward does (generate_vmap_rule), so its gradgradcheck differs
    unlike = [r for r in dry if r["dry_run"] != r["made"]]
    assert [r["test"] for r in unlike] == ["rms_norm::test_gradgradcheck[cpu-float64-toy]"], unlike
    # the engine's backward passes, which a wrapper of the op does not see: the same in every
    # first-order test's dry run
    first_order = [r for r in dry if "test_gradgradcheck" not in r["test"]]
    assert first_order and all(r["backward_made"] is not None for r in first_order)
    assert all(r["dry_run_backward"] == r["backward_made"] > 0 for r in first_order if "forward_ad" not in r["test"])
    assert all(r["dry_run_backward"] == r["backward_made"] for r in first_order)


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
    plans_of = bench.plans_of

    def one_more(*args, **kwargs):
        plans = plans_of(*args, **kwargs)
        plans[-1].add(bench.Kind.FORWARD)
        return plans

    monkeypatch.setattr(bench, "plans_of", one_more)
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
