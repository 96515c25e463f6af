"""The thread benchmark runs a generated module under each setting and prints the default's ratio."""

from __future__ import annotations

import re

import pytest
from bench_runner import run_benchmark


@pytest.mark.long
def test_one_round_on_one_module():
    proc = run_benchmark("bench_threads", "--suite", "generated_tests/test_flip.py", "--rounds", "1", "--threads", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for setting in ("1", "keep", "2"):
        assert re.search(rf"round 1: --opcheck-threads {setting} +[\d.]+ s  \(\d+ passed", out), out
    assert re.search(
        r"^\[default\] --opcheck-threads 1: median [\d.]+ s; best setting (1|keep|2): [\d.]+ s; "
        r"default / best = [\d.]+ \((within|NOT within) 10%\)$",
        out,
        re.M,
    ), out
    assert "warning" not in out  # every run ended the same way


def test_a_failing_suite_stops_the_benchmark(tmp_path):
    (tmp_path / "test_boom.py").write_text("def test_boom():\n    assert False\n")
    proc = run_benchmark("bench_threads", "--suite", str(tmp_path), "--rounds", "1")
    assert proc.returncode != 0 and "exited 1" in proc.stderr
