#!/usr/bin/env python
"""Does the adaptive rule pay? opcheck with it, opcheck without batching, and torch, side by side.

    python benchmarks/bench_batching.py               # three functions, best of 3
    python benchmarks/bench_batching.py --repeat 10

For each function, full mode (fast_mode=False, check_forward_ad=True) three ways in one process:
opcheck.gradcheck as it ships (batched, timed by the real clock, dropping a kind of batching that
turns out slower than the loop), opcheck under vmap_batching(False) (the loop only) and
torch.autograd.gradcheck. Each runs once untimed, then --repeat timed calls; the best time of each
is printed with the ratios, and the kinds of batching the rule dropped: in the untimed first call
(the function's first trip through vmap) and in how many of the timed calls.
The tests pin the rule's clock; this is where its real-time behaviour is watched.
"""

from __future__ import annotations

import argparse
import collections
import gc
import time

import torch

import opcheck
from opcheck.engine.batching import vmap_batching


class LoopedExp(torch.autograd.Function):
    """exp whose vmap rule runs one example at a time, as vmap's fallback for an op without a rule does."""

    generate_vmap_rule = False

    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y

    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return t * y

    @staticmethod
    def vmap(info, in_dims, x):
        if in_dims[0] is None:
            return LoopedExp.apply(x), None
        return torch.stack([LoopedExp.apply(xi) for xi in x.movedim(in_dims[0], 0)]), 0


def _x(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


CASES = {  # name: (function, inputs)
    "sin 32x32 (batching rule)": (torch.sin, lambda: (_x(32, 32),)),
    "exp 8x8 (looping vmap rule)": (LoopedExp.apply, lambda: (_x(8, 8),)),
    "renorm 8x8 (no batching rule)": (lambda x: torch.renorm(x, 2, 0, 1.0), lambda: (_x(8, 8),)),
    "x @ y + z, 3 x 64 elements": (
        lambda x, y, z: x @ y + z,
        lambda: (_x(8, 8, seed=1), _x(8, 8, seed=2), _x(8, 8, seed=3)),
    ),
}
FLAGS = dict(fast_mode=False, check_forward_ad=True)


def timed(call) -> tuple[float, object]:
    gc.collect()
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def _dropped(report) -> set[str]:
    return {f.split(":")[0] for f in report.stats.fallbacks if "slower than the loop" in f}


def run_case(fn, make_inputs, repeat: int) -> dict:
    def adaptive():
        return opcheck.gradcheck_report(fn, make_inputs(), **FLAGS)

    def loop():
        with vmap_batching(False):
            return opcheck.gradcheck_report(fn, make_inputs(), **FLAGS)

    def torch_slow():
        return torch.autograd.gradcheck(fn, make_inputs(), **FLAGS)

    best = {}
    dropped: collections.Counter[str] = collections.Counter()
    for name, call in (("opcheck", adaptive), ("loop", loop), ("torch", torch_slow)):
        first = call()
        if name == "opcheck":
            best["first"] = _dropped(first)
        times = []
        for _ in range(repeat):
            seconds, result = timed(call)
            passed = result if isinstance(result, bool) else result.passed
            if not passed:
                raise SystemExit(f"{name} failed a correct function: {getattr(result, 'message', '')}")
            if name == "opcheck":
                dropped.update(_dropped(result))
            times.append(seconds)
        best[name] = min(times)
    return dict(best, dropped=dropped)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="timed calls per tool and function (default: 3)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), best of {args.repeat}, "
        f"fast_mode=False, check_forward_ad=True; times in ms"
    )
    print(
        f"{'function':<30} {'opcheck':>8} {'no batch':>9} {'torch':>8} {'torch/opcheck':>14} "
        f"{'no batch/opcheck':>17}  dropped: first call; timed calls"
    )
    for name, (fn, make_inputs) in CASES.items():
        r = run_case(fn, make_inputs, args.repeat)
        first = ", ".join(sorted(r["first"])) or "-"
        timed_calls = ", ".join(f"{kind} {n}/{args.repeat}" for kind, n in sorted(r["dropped"].items())) or "-"
        print(
            f"{name:<30} {r['opcheck'] * 1e3:8.1f} {r['loop'] * 1e3:9.1f} {r['torch'] * 1e3:8.1f} "
            f"{r['torch'] / r['opcheck']:13.1f}x {r['loop'] / r['opcheck']:16.1f}x  {first}; {timed_calls}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
