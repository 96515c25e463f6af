#!/usr/bin/env python
"""One function, one input, side by side: torch.autograd.gradcheck slow mode vs opcheck full mode.

    python benchmarks/bench_single.py                      # torch.sin on a 32x32 float64 input
    python benchmarks/bench_single.py --op tanh --shape 64,64 --repeat 5
    python benchmarks/bench_single.py --device cuda

Each tool runs once untimed, then --repeat timed calls (the clock waits for the device); the best
time of each is printed with their ratio, then each tool's peak device memory over its timed calls
(n/a on the CPU) and the process's peak host RSS.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import opcheck

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _device import (  # noqa: E402
    add_device_option,
    clock,
    fmt_mb,
    host_peak_rss_mb,
    parse_device,
    peak_memory_mb,
    reset_peak_memory,
)


def best_time(check, fn, x, repeat: int, device: torch.device) -> tuple[float, float | None]:
    """(best seconds of `repeat` timed calls after an untimed one, peak device MB over the timed calls)."""
    check(fn, (x,))
    reset_peak_memory(device)
    times = []
    for _ in range(repeat):
        t0 = clock(device)
        passed = check(fn, (x,))
        times.append(clock(device) - t0)
        if passed is not True:
            raise SystemExit(f"{check.__module__}.{check.__name__} returned {passed!r}")
    return min(times), peak_memory_mb(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="sin", help="a torch function of one tensor (default: sin)")
    p.add_argument("--shape", default="32,32", help="comma-separated input shape (default: 32,32)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    add_device_option(p)
    args = p.parse_args(argv)
    device = parse_device(args.device)
    torch.set_num_threads(args.threads)
    fn = getattr(torch, args.op)
    shape = tuple(int(s) for s in args.shape.split(","))
    # Drawn on the CPU, so every device checks the same values.
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = x.to(device).requires_grad_()
    t_torch, mem_torch = best_time(torch.autograd.gradcheck, fn, x, args.repeat, device)
    t_opcheck, mem_opcheck = best_time(opcheck.gradcheck, fn, x, args.repeat, device)
    print(
        f"torch.{args.op} on {list(shape)} float64, {device}, {args.threads} thread(s), best of {args.repeat}: "
        f"torch slow mode {t_torch * 1e3:.1f} ms, opcheck full mode {t_opcheck * 1e3:.1f} ms, "
        f"ratio {t_torch / t_opcheck:.1f}x"
    )
    print(
        f"[memory] peak device memory: torch slow mode {fmt_mb(mem_torch, unit=True)}, opcheck full mode "
        f"{fmt_mb(mem_opcheck, unit=True)} | peak host RSS of the process {host_peak_rss_mb():.0f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
