"""The generated catalog under each torch intra-op thread setting, and the default's cost against the best.

Runs `python -m pytest generated_tests` once per setting and round (`--opcheck-threads 1`, the
plugin's default; `--opcheck-threads keep`, torch's own setting, which is one thread per core
unless OMP_NUM_THREADS says otherwise; and any `--threads N` asked for), in fresh processes, in
rotated order so that a slow spell of a shared machine does not always land on the same setting.
Prints each setting's wall times, its best and median, and the plugin default's median over the
best median: the default is within 10% of the best when that ratio is at most 1.10.

    python benchmarks/bench_threads.py                  # 1 vs keep, 3 rounds
    python benchmarks/bench_threads.py --threads 2 --rounds 5 --workers 2
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = "1"  # opcheck.plugin.DEFAULT_THREADS


def run_suite(threads: str, suite: str, workers: int) -> tuple[float, str]:
    """Wall seconds of one run of the suite, and its summary line; a failing run stops the benchmark."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", suite, "--opcheck-threads", threads]
    if workers:
        cmd += ["-n", str(workers)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else done.stderr.strip()
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return wall, re.sub(r" in [\d.]+s.*$", "", summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        action="append",
        default=[],
        metavar="N",
        help="another setting to time besides 1 and keep (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting (default 3)")
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (-n), 0 for a serial run")
    parser.add_argument("--suite", default="generated_tests", help="what pytest runs (default generated_tests)")
    args = parser.parse_args(argv)
    settings = list(dict.fromkeys([DEFAULT, "keep", *args.threads]))
    import torch

    print(
        f"{args.suite}: {args.rounds} rounds, {'serial' if not args.workers else f'-n {args.workers}'}; "
        f"torch {torch.__version__}, {os.cpu_count()} cores, torch's own setting: {torch.get_num_threads()} "
        f"threads (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})"
    )
    walls: dict[str, list[float]] = {s: [] for s in settings}
    summaries = set()
    for r in range(args.rounds):
        order = settings[r % len(settings) :] + settings[: r % len(settings)]
        for setting in order:
            wall, summary = run_suite(setting, args.suite, args.workers)
            walls[setting].append(wall)
            summaries.add(summary)
            print(f"  round {r + 1}: --opcheck-threads {setting:<4} {wall:6.1f} s  ({summary})", flush=True)
    if len(summaries) > 1:
        print(f"warning: the runs did not all end the same way: {sorted(summaries)}")
    medians = {s: statistics.median(w) for s, w in walls.items()}
    best = min(medians, key=medians.get)
    print("setting  median   best   runs")
    for s in settings:
        print(f"{s:<7} {medians[s]:6.1f} s {min(walls[s]):6.1f} s   {', '.join(f'{w:.1f}' for w in walls[s])}")
    ratio = medians[DEFAULT] / medians[best]
    print(
        f"[default] --opcheck-threads {DEFAULT}: median {medians[DEFAULT]:.1f} s; best setting {best}: "
        f"{medians[best]:.1f} s; default / best = {ratio:.2f} ({'within' if ratio <= 1.10 else 'NOT within'} 10%)"
    )
    print(f"[keep] torch's own setting / default = {medians['keep'] / medians[DEFAULT]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
