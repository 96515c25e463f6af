"""The committed catalog: op_specs/ compiles to the committed generated_tests/, and that suite passes
with a short, quiet report, as a newcomer's first `python -m pytest generated_tests` shows it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opcheck.runtime.compiled import TRITON_INTERPRETED

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.long
def test_generated_suite_passes_on_cpu_and_its_report_fits_on_a_screen():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}
    # hypothesis' plugin is this test environment's, not a newcomer's (`.[suite]`): a second of the run
    plugins_off = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *plugins_off, "-rs", "generated_tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(env, PYTHONPATH=str(REPO)),
    )
    lines = result.stdout.strip().splitlines()
    summary = lines[-1] if lines else result.stderr
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert re.fullmatch(r"\d+ passed, (\d+ skipped, )?(\d+ deselected, )?\d+ xfailed in .*", summary), summary
    assert len(lines) < 60, "\n".join(lines)
    # Nothing is skipped for a missing package; unavailable devices are one line, not a skip each.
    # What skips is the compile check of a Triton kernel in Triton's interpreter, saying so.
    if not torch.cuda.is_available():
        skips = [line for line in lines if line.startswith("SKIPPED")]
        assert all(line.endswith(TRITON_INTERPRETED) for line in skips), result.stdout[-5000:]
        assert all("test_triton_" in line for line in skips), skips
        assert sum("not collected" in line for line in lines) == 1, result.stdout[-5000:]
