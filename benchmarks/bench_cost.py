"""Each generated test's estimated cost (`opcheck list --cost`) against its measured time.

For every test of the specs on the cpu: the estimate (opcheck.runtime.cost: one probe of the op per
sample, the engine's evaluations planned from it), then the test itself, run --repeats times
through opcheck.runtime.run_check with torch on one thread, as the generated tests run. A test's
time is its best run, each run read as the lesser of its wall-clock and its thread's CPU seconds
(what other processes of a shared machine take is not the test's). Prints the distribution of
estimate / measured, how many are within 2x, the worst both ways and the totals, and exits 1 when
fewer than --target of the compared tests are within 2x. Skipped tests, tests that fail (the
catalog's expected failures: a failing check stops early, and the estimate is of a passing one)
and tests whose probe raised are counted, not compared.

It also times a backward-only kernel, a torch.library custom op with a backward and nothing else
(no forward AD, no double backward, no vmap rule, as a C++, CUDA or Triton kernel is often
registered), on a 2x8x16x16 input: the engine's checks of it loop, one backward per Jacobian row.

    python benchmarks/bench_cost.py                          # the catalog, 3 runs a test
    python benchmarks/bench_cost.py --specs op_specs/sin.yaml --repeats 2 --no-backward-only
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from opcheck.runtime.checks import run_check  # noqa: E402
from opcheck.runtime.cost.estimate import estimate_spec, format_seconds, machine_factor, one_thread  # noqa: E402
from opcheck.runtime.outcomes import CheckSkipped  # noqa: E402
from opcheck.spec import load_specs  # noqa: E402
from opcheck.spec.model import GRADCHECK, Location, OpSpec, Sample, TensorArg  # noqa: E402

WITHIN = 2.0


@dataclass(frozen=True)
class Record:
    name: str  # spec::test_<check>[<device>-<dtype>-<sample>]
    check: str
    estimated: float
    measured: float
    calls: str
    evaluations: float  # of `estimated`, the op's evaluations at the probe's times
    counts: dict[str, int]  # evaluations by kind, step-by-step comparisons

    @property
    def ratio(self) -> float:
        return self.estimated / max(self.measured, 1e-9)


def measure(spec: OpSpec, check: str, device: str, dtype: str, sample: str, repeats: int) -> float | str:
    """The test's best time over `repeats` runs, or why it is not compared ("skipped", "failed: ...")."""
    best = math.inf
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # what a passing test says (re-draws, outcomes)
                run_check(spec, check, device, dtype, sample)
        except CheckSkipped:
            return "skipped"
        except Exception as e:  # an expected failure of the catalog, or a crash
            return f"failed: {type(e).__name__}"
        best = min(best, time.perf_counter() - wall, time.thread_time() - cpu)
    return best


def compare(specs: list[OpSpec], repeats: int, verbose: bool) -> tuple[list[Record], dict[str, int], float]:
    """Estimate then measure every cpu test of the specs: (records, counts of the others, seconds spent estimating)."""
    records: list[Record] = []
    others = {"skipped": 0, "failed": 0, "not estimated": 0}
    estimating = 0.0
    for spec in specs:
        start = time.perf_counter()
        estimates = estimate_spec(spec, devices=["cpu"])
        estimating += time.perf_counter() - start
        for est in estimates:
            case = est.case
            name = f"{spec.name}::{case.name}"
            if est.skipped is not None:
                others["not estimated" if est.not_estimated == "probe" else "skipped"] += 1
                continue
            with one_thread():
                result = measure(spec, case.check, case.device, case.dtype, case.sample, repeats)
            if isinstance(result, str):
                others["skipped" if result == "skipped" else "failed"] += 1
                continue
            records.append(
                Record(name, case.check, est.seconds, result, est.calls.describe(), est.evaluations, dict(est.counts))
            )
            if verbose:
                print(f"  {name}: estimated {format_seconds(est.seconds)}, measured {format_seconds(result)}")
    return records, others, estimating


def report(records: list[Record], others: dict[str, int], worst: int) -> float:
    """Print the comparison; return the fraction of records within 2x."""
    if not records:
        print("no test compared")
        return 0.0
    ratios = sorted(r.ratio for r in records)
    n = len(ratios)
    within = sum(1 for r in ratios if 1 / WITHIN <= r <= WITHIN)

    def quantile(q: float) -> float:
        return ratios[min(n - 1, int(q * (n - 1) + 0.5))]

    counted = ", ".join(f"{v} {k}" for k, v in others.items() if v)
    print(f"{n} tests compared" + (f" ({counted}, not compared)" if counted else ""))
    print(
        "estimate / measured: "
        + ", ".join(f"{label} {quantile(q):.2f}" for label, q in (("min", 0), ("p5", 0.05), ("p25", 0.25)))
        + f", median {quantile(0.5):.2f}, "
        + ", ".join(f"{label} {quantile(q):.2f}" for label, q in (("p75", 0.75), ("p95", 0.95), ("max", 1)))
    )
    est_total, meas_total = sum(r.estimated for r in records), sum(r.measured for r in records)
    print(f"suite: estimated {est_total:.2f} s, measured {meas_total:.2f} s (ratio {est_total / meas_total:.2f})")
    for label, chosen in (
        ("under", sorted(records, key=lambda r: r.ratio)[:worst]),
        ("over", sorted(records, key=lambda r: -r.ratio)[:worst]),
    ):
        print(f"worst {label}-estimates:")
        for r in chosen:
            print(
                f"  {r.ratio:5.2f}  {r.name}: estimated {format_seconds(r.estimated)}, "
                f"measured {format_seconds(r.measured)} ({r.calls})"
            )
    slowest = sorted(records, key=lambda r: -r.measured)[:worst]
    print("slowest tests:")
    for r in slowest:
        print(f"  {r.name}: measured {format_seconds(r.measured)}, estimated {format_seconds(r.estimated)}")
    print(f"[within 2x] {within} of {n} ({100 * within / n:.1f}%)")
    return within / n


def fit(records: list[Record]) -> None:
    """Print the constants of opcheck.runtime.cost (FIXED, PER_EVALUATION, PER_STEP) that fit these
    measurements best, relative error by relative error, none negative (numpy's least squares, less
    the columns that come out negative, until none does)."""
    import numpy as np

    from opcheck.runtime.cost import estimate as cost

    factor = machine_factor()
    columns = sorted({r.check for r in records}) + sorted({k for r in records for k in r.counts})
    x = np.zeros((len(records), len(columns)))
    for i, r in enumerate(records):
        x[i, columns.index(r.check)] = 1
        for k, v in r.counts.items():
            x[i, columns.index(k)] = v
    y = np.array([r.measured for r in records])
    rest = (y - np.array([r.evaluations for r in records])) / factor
    a, b = x / y[:, None], rest / y
    active = list(range(len(columns)))
    while True:
        solution = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        if (solution >= 0).all():
            break
        active = [c for c, v in zip(active, solution) if v >= 0]
    values = dict.fromkeys(columns, 0.0)
    values.update({columns[c]: float(v) for c, v in zip(active, solution)})
    fitted = np.array([r.evaluations for r in records]) + factor * (x @ np.array([values[c] for c in columns]))
    ratio = fitted / y
    within = int(((ratio >= 1 / WITHIN) & (ratio <= WITHIN)).sum())
    print(f"fitted (seconds on the reference machine; within 2x with them: {within} of {len(records)}):")
    known = {**{k: "FIXED" for k in cost.FIXED}, **{k.name: "PER_EVALUATION" for k in cost.PER_EVALUATION}}
    for c in columns:
        print(f"  {known.get(c, 'PER_STEP')}[{c}] = {values[c]:.3g}")


# ----------------------------------------------------------------------------- backward only
def backward_only_spec() -> OpSpec:
    """A spec of a convolution registered as a torch.library custom op with a backward kernel alone."""

    @torch.library.custom_op("opcheck_bench_cost::conv", mutates_args=())
    def conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w, padding=1)

    @conv.register_fake
    def _(x, w):  # noqa: ANN001, ANN202
        return x.new_empty(x.shape[0], w.shape[0], *x.shape[2:])

    @torch.library.custom_op("opcheck_bench_cost::conv_backward", mutates_args=())
    def conv_backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grad_x = torch.nn.grad.conv2d_input(x.shape, w, g, padding=1)
        return grad_x, torch.nn.grad.conv2d_weight(x, w.shape, g, padding=1)

    @conv_backward.register_fake
    def _(g, x, w):  # noqa: ANN001, ANN202
        return torch.empty_like(x), torch.empty_like(w)

    def setup(ctx, inputs, output):  # noqa: ANN001, ANN202
        ctx.save_for_backward(*inputs)

    def backward(ctx, g):  # noqa: ANN001, ANN202
        return conv_backward(g, *ctx.saved_tensors)

    conv.register_autograd(backward, setup_context=setup)
    source = "benchmarks/bench_cost.py"
    return OpSpec(
        name="backward_only_conv",
        op="torch.ops.opcheck_bench_cost.conv",
        source=source,
        sha256="0",
        samples=(
            Sample(
                "deform_conv_sized",
                args=(TensorArg(shape=(2, 8, 16, 16)), TensorArg(shape=(8, 8, 3, 3))),
                location=Location(source, 1, 1),
            ),
        ),
        supports_forward_ad=False,
        supports_gradgrad=False,
        location=Location(source, 1, 1),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=Path, default=REPO / "op_specs", help="spec file or folder (default op_specs)")
    parser.add_argument("--only", default="", help="comma-separated spec names to keep")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each test; its best counts (default 3)")
    parser.add_argument(
        "--target", type=float, default=0.95, help="fraction of tests to be within 2x, else exit 1 (default 0.95)"
    )
    parser.add_argument("--worst", type=int, default=8, help="how many of the worst estimates to list (default 8)")
    parser.add_argument("--no-backward-only", action="store_true", help="leave out the backward-only kernel")
    parser.add_argument("--json", type=Path, help="write every compared test's estimate and time there")
    parser.add_argument("--fit", action="store_true", help="print the fixed costs that fit these measurements best")
    parser.add_argument("--verbose", action="store_true", help="a line per test as it is measured")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    os.chdir(REPO)
    specs = sorted(load_specs([args.specs], root=REPO), key=lambda s: s.name)
    if args.only:
        keep = set(args.only.split(","))
        specs = [s for s in specs if s.name in keep]
    print(
        f"{len(specs)} spec(s), cpu tests, {args.repeats} run(s) each; torch {torch.__version__}, one thread; "
        f"machine factor {machine_factor():.2f}"
    )
    start = time.perf_counter()
    records, others, estimating = compare(specs, args.repeats, args.verbose)
    print(f"estimating took {estimating:.1f} s; the whole comparison {time.perf_counter() - start:.1f} s")
    fraction = report(records, others, args.worst)
    if not args.no_backward_only:
        spec = backward_only_spec()
        found, _, spent = compare([spec], args.repeats, verbose=False)
        for r in found:
            if r.name.endswith(f"test_{GRADCHECK}[cpu-float64-deform_conv_sized]") or args.verbose:
                print(
                    f"[backward only] {r.name}: estimated {format_seconds(r.estimated)} ({r.calls}), "
                    f"measured {format_seconds(r.measured)}, ratio {r.ratio:.2f}; estimating its spec took "
                    f"{format_seconds(spent)}"
                )
    if args.fit and records:
        fit(records)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in records], indent=1))
    if fraction < args.target:
        print(f"fewer than {100 * args.target:.0f}% of the tests within 2x")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
