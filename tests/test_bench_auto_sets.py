"""The auto-vs-torch-fast set benchmark runs end to end on small sets: its table, its JSON, and the
first call of each worker, which imports opcheck inside its timed region. No assertion reads a time
as good or bad: the times only have to add up."""

from __future__ import annotations

import json

import pytest
from bench_runner import run_benchmark

pytest.importorskip("expecttest")  # torch's op_db imports it


@pytest.mark.long
def test_two_small_sets_and_the_first_call(tmp_path):
    out = tmp_path / "sets.json"
    args = "--set ops104 --set random --ops sin,mul --max-samples 2 --count 3 --seed 1 --first-call --repeat 1"
    proc = run_benchmark("bench_auto_sets", *args.split(), "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("set ") and "auto/torch" in line and "no ref" in line for line in lines)
    assert any(line.startswith("ops104 ") for line in lines)
    assert any(line.startswith("random:1 ") for line in lines)
    assert "first call in a fresh process (sin 5x4, median of 1): torch " in proc.stdout
    assert "[ops104] excess opcheck - torch:" in proc.stdout

    data = json.loads(out.read_text())
    summary, records = data["summary"], data["records"]
    assert summary["false_alarms"] == 0 and summary["misses"] == 0
    assert set(summary["sets"]) == {"ops104", "random:1"}
    for label, s in summary["sets"].items():
        recs = [r for r in records if r["set"] == label]
        assert s["samples"] == len(recs) == 3
        assert s["ops"] == len({r["op"] for r in recs}) and {r["op"] for r in recs} <= {"sin", "mul"}
        assert s["false_alarms"] == 0 and s["misses"] == 0 and s["no_reference"] == 0
        assert sum(s["verdicts"].values()) == s["samples"]
        assert all(r["vs_torch_slow"] == "agree" and r["torch_slow_verdict"] is True for r in recs)
        torch_s, opcheck_s = sum(r["torch_s"] for r in recs), sum(r["opcheck_s"] for r in recs)
        assert s["torch_s"] == pytest.approx(torch_s) and s["opcheck_s"] == pytest.approx(opcheck_s)
        assert s["aggregate_ratio"] == pytest.approx(opcheck_s / torch_s)
        # the ratio over the samples of at most TINY_ELEMENTS input elements, on a line of its own
        # where the set has larger samples too
        tiny = [r for r in recs if 0 < r["numel"] <= 20]
        assert s["tiny_samples"] == len(tiny)
        assert s["tiny_torch_s"] == pytest.approx(sum(r["torch_s"] for r in tiny))
        assert s["tiny_opcheck_s"] == pytest.approx(sum(r["opcheck_s"] for r in tiny))
        shown = f"{label}: its {len(tiny)} tiny samples (at most 20 input elements): torch fast "
        assert (shown in proc.stdout) == (0 < len(tiny) < len(recs)), proc.stdout
        # the worker's first sample: opcheck runs first and its call includes `import opcheck`
        first = [r for r in recs if r["first_call"]]
        assert len(first) == 1 and first[0] is recs[0] and first[0]["first"] == "opcheck"
        assert first[0]["import_s"] > 0 and not s["opcheck_imported_before_loop"]
        assert s["first_call_opcheck_ms"] == pytest.approx(first[0]["opcheck_s"] * 1e3)
        assert all("import_s" not in r for r in recs[1:])
        assert [r["first"] for r in recs] == ["opcheck", "torch", "opcheck"]  # alternating
    assert all(r["dtype"] in ("float64", "complex128") for r in records if r["set"] == "random:1")
    assert all(r["calls"][0] == "test_fn_grad" for r in records)
    # ops104: the list's order (sin before mul), each op's first samples (at most 2)
    ops104 = [(r["op"], r["sample"]) for r in records if r["set"] == "ops104"]
    assert [op for op, _ in ops104] == sorted((op for op, _ in ops104), key=["sin", "mul"].index)
    for op in ("sin", "mul"):
        assert [i for o, i in ops104 if o == op] == list(range(len([o for o, _ in ops104 if o == op])))

    fc = summary["first_call"]
    assert fc["repeat"] == 1 and fc["passed"]
    assert [len(fc["runs"][t]) for t in ("torch", "opcheck")] == [1, 1]
    assert fc["difference_ms"] == pytest.approx(fc["opcheck_ms"] - fc["torch_ms"])


def test_the_tiny_set_with_defaults_warm(tmp_path):
    out = tmp_path / "tiny.json"
    args = "--set tiny --ops sin,sum,mul,nn.functional.linear --count 3 --seed 2 --flags defaults --warm --full"
    proc = run_benchmark("bench_auto_sets", *args.split(), "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    records = data["records"]
    ops = {r["op"] for r in records}
    assert len(ops) == 3 and ops <= {"sin", "sum", "mul", "nn.functional.linear"}
    assert records and all(0 < r["numel"] <= 20 and r["dtype"] == "float64" for r in records)
    for op in ops:  # each op's first tiny samples, at most TINY_SAMPLES of them
        samples = [r["sample"] for r in records if r["op"] == op]
        assert samples == sorted(samples) and len(samples) <= 10
    # one call with gradcheck's defaults per tool, where torch's tests make one or two
    assert all(r["calls"] == ["gradcheck"] for r in records)
    assert all(r["opcheck_verdict"] is True and r["torch_verdict"] is True for r in records)
    summary = data["summary"]["sets"]["tiny"]
    assert summary["samples"] == len(records)
    assert "--flags defaults" in data["command"] and "--warm" in data["command"]
    # --full: opcheck's full mode beside torch's slow mode on every sample, the same verdicts
    assert all(r["opcheck_full_verdict"] is True is r["torch_slow_verdict"] for r in records)
    assert summary["full_samples"] == len(records) and summary["full_verdicts_differ"] == 0
    full_s, slow_s = sum(r["opcheck_full_s"] for r in records), sum(r["torch_slow_s"] for r in records)
    assert summary["full_ratio"] == pytest.approx(full_s / slow_s)
    assert (
        f"tiny: full mode, opcheck fast_mode=False {full_s:.2f} s against torch's slow mode {slow_s:.2f} s "
        f"over {len(records)} samples: opcheck/torch {full_s / slow_s:.2f}"
    ) in proc.stdout
