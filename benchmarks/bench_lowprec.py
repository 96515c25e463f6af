#!/usr/bin/env python
"""The low-precision criteria side by side: the calibrated one ("baseline") against the fixed
per-dtype table, on the mutant corpus of tests/lowprec and on the catalog's low-precision tests.

    python benchmarks/bench_lowprec.py                  # corpus (3 seeds) and catalog, on the CPU
    python benchmarks/bench_lowprec.py --device cuda    # the catalog on a GPU (TF32 off, the default)
    python benchmarks/bench_lowprec.py --device cuda --tf32   # ... with TF32 and reduced-precision reductions on
    python benchmarks/bench_lowprec.py --details        # every mutant, twin and failing catalog test
    python benchmarks/bench_lowprec.py --no-corpus --ops sin,softmax   # the catalog's tests of two specs

For each criterion it prints: mutants caught (every mutant at each dtype where it is a bug, per
seed), twins passed (each correct twin at float32, float16 and bfloat16, per seed; the Triton ones
at float32 and float16, which the interpreter computes), and catalog
tests passed (every `lowprec` test of op_specs/ that is neither skipped nor an expected failure on
the device; with the spec's own rules, so a rule that sets atol/rtol keeps its test on the table).
Then, per dtype, the largest `floor` the catalog's tests and the twins need, and the smallest the
mutants need: the default floor must lie between them. Last, the wall time (read once the device
is done), the process's peak host RSS and the run's peak device memory (n/a on the CPU).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _device import clock, fmt_mb, host_peak_rss_mb, peak_memory_mb, reset_peak_memory  # noqa: E402

from opcheck.engine.lowprec import LOWPREC_FLOORS, TABLE, Criterion, lowprec_report  # noqa: E402
from opcheck.runtime.devices import unavailable_reason, unsupported_dtype_reason  # noqa: E402
from opcheck.runtime.lowprec import case_report, resolve_parts  # noqa: E402
from opcheck.runtime.precision import reduced_precision  # noqa: E402
from opcheck.runtime.samples import build_calls  # noqa: E402
from opcheck.runtime.tolerances import resolve_lowprec_criterion  # noqa: E402
from opcheck.spec import load_specs  # noqa: E402
from opcheck.spec.case import CaseId  # noqa: E402
from opcheck.spec.model import LOWPREC, ReducedPrecision  # noqa: E402
from opcheck.spec.oppath import resolve_op  # noqa: E402
from tests.lowprec.corpus import LOW_DTYPES, MUTANTS  # noqa: E402


def _triton_mutants():
    """The Triton mutants with their dtypes, where triton is installed (on CPU, its interpreter)."""
    try:
        from tests.lowprec.triton_corpus import TRITON_DTYPES, TRITON_MUTANTS
    except ImportError:
        return []
    return [(m, TRITON_DTYPES) for m in TRITON_MUTANTS]


CRITERIA = ("baseline", "table")


@dataclass
class Tally:
    passed: int = 0
    total: int = 0

    def add(self, ok: bool) -> None:
        self.passed += int(ok)
        self.total += 1

    def __str__(self) -> str:
        pct = 100 * self.passed / self.total if self.total else 0.0
        return f"{self.passed}/{self.total} ({pct:.0f}%)"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def corpus(seeds: int, details: bool, floors: dict) -> dict[str, tuple[Tally, Tally]]:
    """Per criterion: (mutants caught, twins passed)."""
    out = {c: (Tally(), Tally()) for c in CRITERIA}
    for m, dtypes in [(m, LOW_DTYPES) for m in MUTANTS] + _triton_mutants():
        for dtype in dtypes:
            for seed in range(seeds):
                inputs = m.inputs(dtype, torch.Generator().manual_seed(seed))
                for kernel, is_mutant in ((m.twin, False), (m.mutant, True)):
                    if is_mutant and dtype not in m.dtypes:
                        continue
                    verdicts = {}
                    for c in CRITERIA:
                        gen = torch.Generator().manual_seed(seed)
                        report = lowprec_report(kernel, inputs, reference=m.reference, criterion=c, generator=gen)
                        verdicts[c] = report.passed
                        tally = out[c][0 if is_mutant else 1]
                        tally.add(not report.passed if is_mutant else report.passed)
                    gen = torch.Generator().manual_seed(seed)
                    report = lowprec_report(kernel, inputs, reference=m.reference, generator=gen)
                    need = max(p.floor_needed for p in report.parts)
                    key = ("mutants" if is_mutant else "twins", _name(dtype))
                    floors[key] = (min if is_mutant else max)(floors.get(key, need), need)
                    if details:
                        what = "mutant" if is_mutant else "twin  "
                        print(
                            f"  {m.name:30s} {_name(dtype):9s} seed {seed} {what} "
                            + " ".join(f"{c}={'pass' if v else 'FAIL'}" for c, v in verdicts.items())
                            + f"  floor needed {need:.3g}"
                        )
    return out


def catalog(
    device: str, block: ReducedPrecision | None, details: bool, floors: dict, ops: set[str] | None = None
) -> dict[str, Tally]:
    """Per criterion, the catalog's low-precision tests passed (of the specs named in `ops`, or all)."""
    specs = load_specs([ROOT / "op_specs"], root=ROOT)
    if ops is not None and (unknown := ops - {spec.name for spec in specs}):
        raise SystemExit(f"--ops: no spec named {', '.join(sorted(unknown))} in op_specs/")
    out = {c: Tally() for c in CRITERIA}
    skipped = 0
    for spec in specs:
        if not spec.lowprec_dtypes or device not in spec.devices or (ops is not None and spec.name not in ops):
            continue
        reference = resolve_op(spec.reference) if spec.reference else None
        forward = spec.gradcheck.check_forward_ad and spec.supports_forward_ad
        for dtype in spec.lowprec_dtypes:
            if unavailable_reason(device) or unsupported_dtype_reason(device, dtype):
                continue
            for sample in spec.samples:
                matches = [
                    r
                    for r in (*spec.skips, *spec.expected_failures)
                    if r.where.matches(device=device, dtype=dtype, check=LOWPREC, sample=sample.name)
                ]
                if matches:
                    skipped += 1
                    continue
                case = CaseId(spec.name, LOWPREC, device, dtype, sample.name)
                parts = resolve_parts(spec, device, dtype, sample.name).parts
                resolved = resolve_lowprec_criterion(spec, device, dtype, sample.name).criterion
                crits = {"baseline": resolved, "table": replace(resolved, kind=TABLE)}
                try:
                    calls = build_calls(spec, sample, device, dtype, case.seed())
                except Exception as e:  # a sample that needs what this machine lacks
                    print(f"  {case.nodeid()}: not built ({type(e).__name__}: {e})")
                    continue
                if spec.clone_inputs:
                    calls = [replace(c, clone_inputs=True) for c in calls]
                for c, crit in crits.items():
                    ok = True
                    for call in calls:
                        report = _run(call, case, crit, forward, reference, parts, block or spec.reduced_precision)
                        ok = ok and report.passed
                        if c == "baseline" and crit.kind != TABLE:
                            need = max((p.floor_needed for p in report.parts), default=0.0)
                            key = ("catalog", dtype)
                            floors[key] = max(floors.get(key, 0.0), need)
                        if not report.passed and details:
                            print(f"  {case.nodeid()} [{c}]: {report.message.splitlines()[0]}")
                    out[c].add(ok)
    print(f"catalog on {device}: {skipped} tests skipped or expected to fail by their specs' rules")
    return out


def _run(call, case, criterion: Criterion, forward, reference, parts, block):
    with reduced_precision(block):
        return case_report(call, case, criterion, check_forward_ad=forward, reference_op=reference, parts=parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seeds", type=int, default=3, help="draws of each corpus sample (default 3)")
    p.add_argument("--tf32", action="store_true", help="run the catalog with TF32 and reduced-precision reductions on")
    p.add_argument("--no-corpus", action="store_true", help="the catalog only")
    p.add_argument("--ops", default=None, metavar="NAME,...", help="the catalog's tests of these specs only")
    p.add_argument("--details", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    floors: dict = {}
    # The corpus runs on the CPU whatever --device says; the catalog on --device, when it is here.
    device = torch.device(args.device if unavailable_reason(torch.device(args.device).type) is None else "cpu")
    reset_peak_memory(device)
    t0 = clock(device)
    rows = []
    if not args.no_corpus:
        n_triton = len(_triton_mutants())
        print(
            f"corpus: {len(MUTANTS)} PyTorch and {n_triton} Triton mutants with their twins, {args.seeds} seeds, on cpu"
        )
        found = corpus(args.seeds, args.details, floors)
        rows.append(("mutants caught", {c: found[c][0] for c in CRITERIA}))
        rows.append(("twins passed", {c: found[c][1] for c in CRITERIA}))
    block = ReducedPrecision(tf32=True, reduced_precision_reduction=True) if args.tf32 else None
    ops = {name.strip() for name in args.ops.split(",") if name.strip()} if args.ops else None
    cat = catalog(args.device, block, args.details, floors, ops)
    rows.append((f"catalog passed ({args.device}{', TF32 on' if args.tf32 else ''})", cat))
    print()
    print(f"{'':38s}" + "".join(f"{c:>22s}" for c in CRITERIA))
    for label, tallies in rows:
        print(f"{label:38s}" + "".join(f"{str(tallies[c]):>22s}" for c in CRITERIA))
    print()
    print("floor (roundings of a part's largest entry) needed, by dtype: the default must lie between")
    print(f"{'dtype':10s}{'default':>10s}{'catalog max':>14s}{'twins max':>12s}{'mutants min':>14s}")
    for dtype in LOW_DTYPES + (torch.complex64,):
        name = _name(dtype)
        cells = [floors.get((k, name)) for k in ("catalog", "twins", "mutants")]
        if all(c is None for c in cells):
            continue
        shown = "".join(f"{(f'{c:.3g}' if c is not None else '-'):>{w}s}" for c, w in zip(cells, (14, 12, 14)))
        print(f"{name:10s}{LOWPREC_FLOORS[dtype]:>10g}{shown}")
    print(f"\n{clock(device) - t0:.0f} s")
    print(
        f"[memory] peak host RSS of the process {host_peak_rss_mb():.0f} MB | peak device memory of the run "
        f"({args.device}): {fmt_mb(peak_memory_mb(device), unit=True)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
