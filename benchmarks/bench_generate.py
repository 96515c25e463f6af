#!/usr/bin/env python
"""Generator speed: 1,000 synthetic specs generated, regenerated as a no-op, and collected.

    python benchmarks/bench_generate.py [--specs 1000]

Prints: full generation time (load + validate + render + write), no-op regeneration time (must
write nothing; with and without the generator's cache), the same as separate processes, and
pytest's collection time per generated test, with and without pytest's own start-up (measured by
collecting an empty folder).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
op: {op}
name: {name}
dtypes: [float64]
lowprec_dtypes: [float32]
devices: [cpu, cuda]
samples:
  - name: small
    args: [{{shape: [3, 4]}}]
  - name: noncontig
    args: [{{shape: [4, 5], noncontiguous: true, low: -1, high: 1}}]
  - name: scalar
    args: [{{shape: []}}]
gradcheck:
  check_forward_ad: true
tolerances:
  - where: {{device: cuda}}
    atol: 1.0e-4
    reason: synthetic rule
expected_failures:
  - where: {{sample: scalar, check: lowprec}}
    reason: synthetic expected failure
"""

OPS = [
    "torch.sin",
    "torch.cos",
    "torch.tanh",
    "torch.exp",
    "torch.sigmoid",
    "torch.abs",
    "torch.neg",
    "torch.nn.functional.gelu",
    "torch.nn.functional.silu",
    "torch.special.erf",
]


def run_cli(*args, cwd) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "opcheck", *args], cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"opcheck {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return elapsed, proc


def in_process_generate(cwd: Path, *args: str) -> float:
    """`opcheck generate` in this process (imports already done), as a user's re-run sees it."""
    import contextlib
    import io

    from opcheck.cli import main as opcheck_main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            rc = opcheck_main(["generate", *args])
        elapsed = time.perf_counter() - start
    finally:
        os.chdir(old)
    if rc != 0:
        sys.exit(f"opcheck generate {' '.join(args)} failed in process")
    return elapsed


def collect(path: Path, cwd: Path) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(path)],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    tests = sum(1 for line in proc.stdout.splitlines() if "::" in line)
    return elapsed, tests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, default=1000)
    args = parser.parse_args()
    print(f"command: {' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "op_specs").mkdir()
        for i in range(args.specs):
            (root / "op_specs" / f"op{i:04d}.yaml").write_text(SPEC.format(op=OPS[i % len(OPS)], name=f"op{i:04d}"))

        import opcheck.cli  # noqa: F401  (imports are not part of what is timed in-process)
        import opcheck.codegen  # noqa: F401
        import opcheck.spec  # noqa: F401

        full = in_process_generate(root)
        files = sorted((root / "generated_tests").glob("test_*.py"))
        mtimes = {p: p.stat().st_mtime_ns for p in files}
        noop = in_process_generate(root)
        noop_uncached = in_process_generate(root, "--no-cache")
        rewritten = sum(1 for p in files if p.stat().st_mtime_ns != mtimes[p])
        cli_noop, _ = run_cli("generate", cwd=root)
        cli_check, _ = run_cli("generate", "--check", cwd=root)
        print(
            f"generate {args.specs} specs (load, validate, render, write): {full:.2f} s "
            f"({full / args.specs * 1e3:.2f} ms per spec)"
        )
        print(
            f"no-op regenerate: {noop:.3f} s; with --no-cache (load, validate, render, compare): "
            f"{noop_uncached:.2f} s; files rewritten by either: {rewritten}"
        )
        print(
            f"as separate processes (interpreter start-up and imports included): `opcheck generate` "
            f"no-op {cli_noop:.2f} s, `opcheck generate --check` {cli_check:.2f} s"
        )

        (root / "empty").mkdir()
        base, _ = collect(root / "empty", root)
        took, tests = collect(root / "generated_tests", root)
        print(
            f"pytest --collect-only: {tests} tests in {took:.2f} s; pytest start-up (empty folder) "
            f"{base:.2f} s; per test {(took - base) / max(tests, 1) * 1e3:.3f} ms "
            f"({took / max(tests, 1) * 1e3:.3f} ms including start-up)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
