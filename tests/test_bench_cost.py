"""The cost benchmark compares estimates with measured times on a couple of specs and says so; its
exit status follows --target. No time is judged here: --target 0 always passes, above 1 never."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from bench_runner import run_benchmark


def run(*args: str, only: str = "sin,cube") -> subprocess.CompletedProcess:
    return run_benchmark("bench_cost", "--only", only, "--repeats", "1", *args)


@pytest.mark.long
def test_two_specs_estimated_measured_and_compared(tmp_path):
    records = tmp_path / "records.json"
    proc = run("--target", "0", "--fit", "--json", str(records))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(
        r"^2 spec\(s\), cpu tests, 1 run\(s\) each; torch \S+, one thread; machine factor [\d.]+$", out, re.M
    )
    within = re.search(r"^\[within 2x\] (\d+) of (\d+) \([\d.]+%\)$", out, re.M)
    assert within, out
    compared = int(within.group(2))
    assert re.search(rf"^{compared} tests compared", out, re.M)
    assert re.search(r"^estimate / measured: min [\d.]+, p5 [\d.]+, p25 [\d.]+, median [\d.]+, p75", out, re.M)
    assert re.search(r"^suite: estimated [\d.]+ s, measured [\d.]+ s \(ratio [\d.]+\)$", out, re.M)
    assert "worst under-estimates:" in out and "worst over-estimates:" in out and "slowest tests:" in out
    assert re.search(
        r"^\[backward only\] backward_only_conv::test_gradcheck\[cpu-float64-deform_conv_sized\]: estimated [\d.]+ m?s "
        r"\(\d+ fwd, (\d+) bwd, .*\), measured [\d.]+ m?s, ratio [\d.]+",
        out,
        re.M,
    ), out
    loop = re.search(r"\[backward only\].*?, (\d+) bwd,", out)
    assert loop and int(loop.group(1)) > 2048  # a backward per output element: 2*8*16*16 of them
    assert re.search(r"^fitted \(seconds on the reference machine; within 2x with them: \d+ of \d+\):$", out, re.M)
    assert re.search(r"^  FIXED\[gradcheck\] = \S+$", out, re.M) and "PER_EVALUATION[FORWARD]" in out
    saved = json.loads(records.read_text())
    assert len(saved) == compared and {"name", "estimated", "measured", "counts"} <= set(saved[0])
    assert all(r["name"].split("::")[0] in ("sin", "cube") for r in saved)


def test_a_target_above_every_test_exits_1():
    # no fraction of tests is above 1: one spec (sin's, which has no compile check to time) shows it
    proc = run("--target", "1.01", "--no-backward-only", only="sin")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fewer than 101% of the tests within 2x" in proc.stdout
    assert "[backward only]" not in proc.stdout
