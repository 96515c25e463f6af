"""The scale benchmark runs end to end on one mutant and its twin (verdicts only, never times)."""

from __future__ import annotations

import json

import pytest
from bench_runner import run_benchmark

CASE = "sin_64x64_tail7"


@pytest.mark.long
def test_one_mutant_and_its_twin(tmp_path):
    out = tmp_path / "scale.json"
    # --slow-max-entries 0: torch's slow mode is "not run" (it would take seconds here)
    proc = run_benchmark(
        "bench_scale", "--cases", f"{CASE},{CASE}:twin", "--repeat", "1", "--slow-max-entries", "0", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    rows = {line.split()[0]: line for line in lines if line.startswith(CASE)}
    assert set(rows) == {CASE, f"{CASE}:twin"}
    assert "caught" in rows[CASE] and "MISSED" in rows[CASE]  # auto catches it, torch's fast mode does not
    assert "passed" in rows[f"{CASE}:twin"] and "not run" in rows[f"{CASE}:twin"]
    assert "[auto] mutants caught 1/1, twins passed 1/1" in proc.stdout
    assert "[torch fast] mutants caught 0/1, twins passed 1/1" in proc.stdout
    assert any(line.startswith("[time] opcheck auto") for line in lines)
    assert any(line.startswith("[memory] max peak RSS") for line in lines)
    # on the CPU there is no device memory: said, not omitted
    assert "[memory] max peak device memory per process (cpu, timed calls): auto n/a" in proc.stdout

    data = json.loads(out.read_text())
    cases = {c["case"]: c for c in data["cases"]}
    mutant, twin = cases[CASE]["tools"], cases[f"{CASE}:twin"]["tools"]
    assert mutant["auto"]["verdict"] == "GradcheckError" and mutant["auto"]["outcome"] == "caught"
    assert mutant["auto"]["where"] and mutant["auto"]["message"].startswith("Jacobian mismatch")
    assert all(p.startswith("projected") for p in mutant["auto"]["auto_paths"])
    assert twin["auto"]["verdict"] is True and twin["auto"]["outcome"] == "passed"
    assert mutant["torch fast"]["verdict"] is True and twin["torch fast"]["verdict"] is True
    assert mutant["torch slow"]["verdict"] is None and "not_run" in mutant["torch slow"]
    assert data["summary"]["detection"]["auto"]["missed"] == []
    assert data["summary"]["peak_rss_mb"]["auto"] > 0
    assert data["device"] == "cpu" and mutant["auto"]["peak_device_mb"] is None
