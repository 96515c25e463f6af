"""The op_db benchmark end to end on one op: records, resume, report, and the batching compare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_opdb.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_op_paired_resumed_reported_and_compared(tmp_path):
    on, off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    proc = bench("--ops", "abs", "--limit", "1", "--out", str(on))
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(on)
    assert [r["done"] for r in recs if "done" in r] == ["abs|float64", "abs|complex128"]
    calls = [r for r in recs if "call" in r]
    # abs: grad, fwd, gradgrad(+noncontig), fwgrad_bwgrad(+noncontig), each slow and fast, per dtype
    assert {(r["call"], r["mode"]) for r in calls} == {
        (c, m)
        for c in ("grad", "fwd", "gradgrad", "gradgrad_noncontig", "fwgrad_bwgrad", "fwgrad_bwgrad_noncontig")
        for m in ("slow", "fast")
    }
    assert len(calls) == 24
    assert all(r["torch"]["verdict"] is True and r["opcheck"]["verdict"] is True for r in calls)

    again = bench("--ops", "abs", "--limit", "1", "--out", str(on))  # every group is done: nothing reruns
    assert again.returncode == 0 and len(records(on)) == len(recs)

    report = bench("--report", str(on))
    assert report.returncode == 0, report.stdout
    assert "1 ops, 2 samples, 24 paired calls" in report.stdout
    assert "verdict disagreements: 0" in report.stdout and "first-line disagreements: 0" in report.stdout

    proc = bench("--ops", "abs", "--limit", "1", "--out", str(off), "--no-batching")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(r["torch"] is None for r in records(off) if "call" in r)  # opcheck alone
    same = bench("--compare", str(on), str(off))
    assert same.returncode == 0, same.stdout
    assert "24 calls in both runs; opcheck's verdict differs on 0, its first line on 0 more" in same.stdout

    # a run whose verdict differs on one call is reported and fails the compare
    changed = records(off)
    target = next(r for r in changed if r.get("call") == "grad" and r["mode"] == "slow")
    target["opcheck"] = {"verdict": "GradcheckError", "first_line": "Jacobian mismatch", "seconds": 0.0}
    off.write_text("".join(json.dumps(r) + "\n" for r in changed))
    differ = bench("--compare", str(on), str(off))
    assert differ.returncode == 1
    assert "verdict differs on 1," in differ.stdout and "Jacobian mismatch" in differ.stdout
