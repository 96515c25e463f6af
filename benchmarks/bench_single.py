#!/usr/bin/env python
"""One function, one input, side by side: torch.autograd.gradcheck slow mode vs opcheck full mode.

    python benchmarks/bench_single.py                      # torch.sin on a 32x32 float64 input
    python benchmarks/bench_single.py --op tanh --shape 64,64 --repeat 5

Each tool runs once untimed, then --repeat timed calls; the best time of each is printed with
their ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

import opcheck


def best_time(check, fn, x, repeat: int) -> float:
    check(fn, (x,))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        assert check(fn, (x,))
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="sin", help="a torch function of one tensor (default: sin)")
    p.add_argument("--shape", default="32,32", help="comma-separated input shape (default: 32,32)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    fn = getattr(torch, args.op)
    shape = tuple(int(s) for s in args.shape.split(","))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).requires_grad_()
    t_torch = best_time(torch.autograd.gradcheck, fn, x, args.repeat)
    t_opcheck = best_time(opcheck.gradcheck, fn, x, args.repeat)
    print(
        f"torch.{args.op} on {list(shape)} float64, {args.threads} thread(s), best of {args.repeat}: "
        f"torch slow mode {t_torch * 1e3:.1f} ms, opcheck full mode {t_opcheck * 1e3:.1f} ms, "
        f"ratio {t_torch / t_opcheck:.1f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
