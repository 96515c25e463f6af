"""The OpInfo benchmark runs end to end on a few samples, in every mode, with no disagreement."""

from __future__ import annotations

import json
import re

import pytest
from bench_runner import run_benchmark

pytest.importorskip("expecttest")  # torch's op_db imports it


def test_all_modes_on_two_ops(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark("bench_opinfo", "--ops", "sin,mul", "--max-samples", "2", "--mode", "all", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for line in ("[full]", "[fast]", "[auto]", "[fixed]", "[ceiling]", "[cost of full strength]"):
        assert line in proc.stdout
    summary = json.loads(out.read_text())["summary"]
    assert summary["disagreements"] == 0
    # auto runs the engine's fast_mode="auto"; its verdicts are compared with torch's slow mode (here from full mode)
    assert "[auto] verdicts against torch slow mode (from the full mode of this run" in proc.stdout
    assert summary["auto"]["false_alarms"] == 0 and summary["auto"]["misses"] == 0
    samples = [r for r in json.loads(out.read_text())["samples"] if r["mode"] == "auto"]
    assert samples and all(r["vs_torch_slow"] == "agree" and r["auto_paths"] for r in samples)
    assert summary["full_ratio_ceiling"] == pytest.approx(summary["full"]["torch_s"] / summary["fixed"]["opcheck_s"])
    # peak memory: the process's host RSS, and no device memory on the CPU
    memory = summary["memory"]
    assert memory["host_peak_rss_mb"] > 0 and memory["device"] == "cpu"
    assert memory["device_peak_mb"] == {"torch": None, "opcheck": None}
    assert "peak device memory of one sample's checks (cpu): torch n/a, opcheck n/a" in proc.stdout


def test_budget_zero_runs_the_projections_on_every_sample():
    proc = run_benchmark("bench_opinfo", "--ops", "sin", "--max-samples", "2", "--mode", "auto", "--budget", "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    paths = re.search(
        r"auto paths: (.*)$", next(line for line in proc.stdout.splitlines() if line.startswith("[auto] verdicts"))
    )
    assert paths and "projected" in paths.group(1) and "full" not in paths.group(1), proc.stdout[-2000:]
