"""benchmarks/gpu_check.sh on its CPU path: every part runs, scaled down, and the summary has each.

Checks what the summary holds and that every part ended well, never a time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash")


def run(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTEST_XDIST_WORKER", None)  # the suite it runs is not a worker of this one
    return subprocess.run(
        ["bash", str(SCRIPT), *args, str(out)], capture_output=True, text=True, timeout=900, env=env, cwd=ROOT
    )


def parts(out: Path) -> dict[str, list[str]]:
    rows = [line.split("\t") for line in (out / "parts.tsv").read_text().splitlines()]
    return {row[1]: row for row in rows}


@pytest.mark.long
def test_cpu_path_runs_every_part_and_summarizes_it(tmp_path):
    pytest.importorskip("expecttest")  # bench_opinfo's op_db imports it
    out = tmp_path / "gpu_check"
    proc = run("--device", "cpu", out=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = parts(out)
    assert list(ran) == ["env", "suite", "opinfo", "scale", "single", "lowprec_tf32_off", "lowprec_tf32_on"]
    assert all(row[2] == "ok" for row in ran.values()), ran

    summary = (out / "summary.txt").read_text()
    sections = [line for line in summary.splitlines() if line.startswith("## ")]
    assert [s.split(":")[0] for s in sections] == [
        "## machine",
        "## generated suite (one process)",
        "## bench_opinfo",
        "## bench_scale",
        "## bench_single",
        "## bench_lowprec",
        "## bench_lowprec",
        "## peak memory",
        "## parts",
    ]
    assert "torch " in summary and "triton" in summary
    # the suite: pytest's own line, counts in all and per check kind, from its JUnit XML
    assert "pytest: " in summary and " passed" in summary
    assert "counts: " in summary and " 0 failed" in summary
    assert any(line.strip().startswith("lowprec ") for line in summary.splitlines())
    # the benchmarks' ratio tables and summaries
    assert "full torch   opcheck  ratio" in summary and "[full] fast_mode=False" in summary
    assert "[auto] mutants caught 1/1, twins passed 1/1" in summary
    assert "torch slow mode" in summary and "ratio" in summary
    assert "catalog passed (cpu)" in summary and "catalog passed (cpu, TF32 on)" in summary
    # peak memory: host RSS beside the device's, which the CPU does not have
    memory = summary.split("## peak memory")[1].split("## parts")[0]
    for name in ("opinfo", "scale", "single", "lowprec_tf32_off", "lowprec_tf32_on"):
        assert f"\n{name}: [memory]" in memory
    assert "n/a" in memory and "RSS" in memory


def test_parts_past_the_budget_are_skipped_and_listed(tmp_path):
    out = tmp_path / "skipped"
    proc = run("--device", "cpu", "--parts", "env,single", "--budget", "0", out=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = parts(out)
    assert list(ran) == ["env", "single"] and all(row[2].startswith("skipped: the budget") for row in ran.values())
    summary = (out / "summary.txt").read_text()
    assert "## generated suite" in summary and "not run (--parts)" in summary


def test_gpu_lowprec_is_the_low_precision_parts(tmp_path):
    out = tmp_path / "lowprec"
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_lowprec.sh"), "--device", "cpu", "--budget", "0", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = parts(out)
    assert list(ran) == ["env", "suite", "lowprec_tf32_off", "lowprec_tf32_on"]
    assert "-m lowprec" in ran["suite"][4] and ran["lowprec_tf32_on"][4].endswith("--tf32")


def test_bad_options_are_usage_errors(tmp_path):
    for args in (["--parts", "env,bogus"], ["--workers", "two"], ["--budget", "soon"], ["--bogus"]):
        proc = run(*args, out=tmp_path / "bad")
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)


# ------------------------------------------------------------------ the benchmarks' --device
@pytest.mark.parametrize("script", ["bench_single.py", "bench_scale.py", "bench_opinfo.py"])
def test_a_device_this_machine_lacks_is_refused(script):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode != 0 and "--device cuda: torch" in proc.stderr and "sees no CUDA device" in proc.stderr


def test_device_helpers_on_the_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import _device
    import torch

    cpu = _device.parse_device("cpu")
    _device.reset_peak_memory(cpu)
    assert _device.peak_memory_mb(cpu) is None  # the CPU has no allocator statistics
    assert _device.host_peak_rss_mb() > 10
    assert _device.clock(cpu) <= _device.clock(cpu)
    assert _device.fmt_mb(None, 5) == "  n/a" and _device.fmt_mb(1234.4, 6) == "  1234"
    assert _device.fmt_mb(12.6, unit=True) == "13 MB" and _device.fmt_mb(None, unit=True) == "n/a"
    assert _device.describe(cpu) == "cpu" and isinstance(cpu, torch.device)
    with pytest.raises(SystemExit, match="--device nodevice"):
        _device.parse_device("nodevice")
