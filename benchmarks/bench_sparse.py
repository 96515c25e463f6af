#!/usr/bin/env python
"""Sparse inputs side by side: opcheck.gradcheck vs torch.autograd.gradcheck on the same samples.

Every layout (COO, CSR, CSC, BSR, BSC, hybrid), masked and dense gradient semantics, correct ops
and one with a wrong gradient on one specified value, at kernel-like sizes (64x64 at 5 % density
and smaller). Both tools run in one process on separately built copies of each sample, in torch's
slow mode (fast_mode=False) and fast mode (fast_mode=True), and opcheck's default fast_mode="auto"
timed against torch's fast mode, its verdict compared with torch's slow mode. Prints each row's
verdicts and times and the totals; exits 1 when a verdict differs. Times are the process's CPU
seconds (torch runs on one thread here), which other work on a shared machine does not stretch.

    python benchmarks/bench_sparse.py
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch


def _sparse(shape, seed, layout, density=0.05, blocksize=None, dense_dim=0):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g, dtype=torch.float64)
    grid = shape[: len(shape) - dense_dim]
    if blocksize:
        keep = torch.rand(grid[0] // blocksize[0], grid[1] // blocksize[1], generator=g) < density
        keep = keep.repeat_interleave(blocksize[0], 0).repeat_interleave(blocksize[1], 1)
    else:
        keep = torch.rand(grid, generator=g) < density
    mask = keep.reshape(keep.shape + (1,) * dense_dim).expand(shape).to(torch.float64)
    if layout == torch.sparse_coo:
        pattern = mask.to_sparse(len(shape) - dense_dim)
    else:
        pattern = mask.contiguous().to_sparse(layout=layout, blocksize=blocksize, dense_dim=dense_dim or None)
    t = values.sparse_mask(pattern)
    return (t.coalesce() if layout == torch.sparse_coo else t).requires_grad_()


class OneValueWrong(torch.autograd.Function):
    """3x a COO input, densified; the gradient of its last specified value is 1.5 times too large."""

    @staticmethod
    def forward(ctx, s):
        ctx.save_for_backward(s)
        ctx.set_materialize_grads(False)
        return s.to_dense() * 3

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None
        (s,) = ctx.saved_tensors
        s = s.coalesce()
        values = g[tuple(s.indices())] * 3
        values[-1] *= 1.5
        return torch.sparse_coo_tensor(s.indices(), values, s.shape)


def rows():
    w = torch.randn(64, 8, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    coo, csr, csc = torch.sparse_coo, torch.sparse_csr, torch.sparse_csc
    return [
        ("sparse.mm COO 64x64 @ 64x8", lambda: (_sparse((64, 64), 1, coo),), lambda s: torch.sparse.mm(s, w), True),
        ("mm CSR 64x64 @ 64x8", lambda: (_sparse((64, 64), 2, csr),), lambda s: torch.mm(s, w), False),
        ("mm CSC 32x64 @ 64x8", lambda: (_sparse((32, 64), 3, csc, density=0.1),), lambda s: torch.mm(s, w), False),
        ("to_dense COO 64x64", lambda: (_sparse((64, 64), 4, coo),), lambda s: s.to_dense(masked_grad=True), True),
        (
            "to_dense dense grad COO 32x32",
            lambda: (_sparse((32, 32), 5, coo, density=0.1),),
            lambda s: s.to_dense(masked_grad=False),
            False,
        ),
        (
            "to_dense BSR 32x32 blocks 4x4",
            lambda: (_sparse((32, 32), 6, torch.sparse_bsr, 0.1, (4, 4)),),
            lambda s: s.to_dense(),
            True,
        ),
        (
            "to_dense BSC 32x32 blocks 4x4",
            lambda: (_sparse((32, 32), 7, torch.sparse_bsc, 0.1, (4, 4)),),
            lambda s: s.to_dense(),
            True,
        ),
        (
            "sparse.sum COO hybrid 16x16x4",
            lambda: (_sparse((16, 16, 4), 8, coo, 0.2, dense_dim=1),),
            lambda s: torch.sparse.sum(s, dim=0).to_dense(),
            True,
        ),
        ("mutant: one wrong value, COO 64x64", lambda: (_sparse((64, 64), 9, coo),), OneValueWrong.apply, True),
    ]


def run(check, fn, make, **kwargs):
    from torch.autograd.gradcheck import GradcheckError

    inputs = make()
    t0 = time.process_time()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            verdict = check(fn, inputs, **kwargs)
    except GradcheckError:
        verdict = "GradcheckError"
    except Exception as e:  # noqa: BLE001 - the exception type is the verdict
        verdict = type(e).__name__
    return verdict, time.process_time() - t0


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    import opcheck

    torch.set_num_threads(1)
    torch.sparse.check_sparse_tensor_invariants.disable()
    warnings.simplefilter("ignore")  # torch's "sparse support is in beta" notes
    differ = 0
    totals = {"slow": [0.0, 0.0], "fast": [0.0, 0.0], "auto": [0.0, 0.0]}
    print(f"{'sample':38} {'mode':5} {'torch':>16} {'opcheck':>16}  {'torch s':>8} {'opcheck s':>9}")
    for name, make, fn, masked in rows():
        slow_verdict = None
        for mode, fast in (("slow", False), ("fast", True), ("auto", "auto")):
            vt, tt = run(torch.autograd.gradcheck, fn, make, masked=masked, fast_mode=fast is not False)
            vo, to = run(opcheck.gradcheck, fn, make, masked=masked, fast_mode=fast)
            totals[mode][0] += tt
            totals[mode][1] += to
            slow_verdict = vt if mode == "slow" else slow_verdict
            # auto answers for the full check: its verdict is compared with torch's slow mode
            want = slow_verdict if mode == "auto" else vt
            mark = "" if vo == want else "  DIFFERENT VERDICT"
            differ += vo != want
            shown = f"{vt} (slow {want})" if mode == "auto" else str(vt)
            print(f"{name:38} {mode:5} {shown:>16} {str(vo):>16}  {tt:8.3f} {to:9.3f}{mark}")
    for mode, (tt, to) in totals.items():
        against = "torch fast" if mode == "auto" else f"torch {mode}"
        print(f"{mode}: opcheck {to:.2f} s vs {against} {tt:.2f} s ({to / tt:.2f}x torch's time)")
    print(f"verdicts that differ (slow and fast against torch's same mode, auto against torch slow): {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
