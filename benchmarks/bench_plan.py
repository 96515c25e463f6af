"""The cost estimate's plans against the calls the generated tests make, over the catalog.

For every cpu gradcheck, forward_ad, gradgradcheck and fwgrad_bwgrad test of the specs: the
estimate's plan (opcheck.runtime.cost: one probe of the op per sample; the evaluations of the
engine's own check of the op's stand-in; a test the spec expects to fail planned as a failing
check), then the test itself through
opcheck.runtime.checks.run_check, with the op wrapped to count its calls. Compared: the op's
forward-side calls, every call of the op that Python sees (plain forwards, forward-mode calls, which
run the op on dual inputs, and vmapped calls, one per batch), planned against made. The
backward-side calls run inside autograd, where a wrapper does not see them; --dry-run compares the
engine's own count of them, and tests/runtime/test_cost.py counts those on functions of its own.

Prints each test whose counts differ (planned, made, the test's outcome, the plan's path), then the
totals, passing tests and expected failures apart (a plan of an expected failure is of a wrong
gradient, or of a crash where the op's backward raises); --json writes every record. Exits 1 when a
test that passes differs, unless its plan makes a timed choice (plan.TIMED: the engine times its own
calls there, as a batch schedule's later batches, and the plan takes the probe's times, so a loaded
machine can move the counts) or its values decide its calls (the engine's stats: entries near the
tolerance settled by plain calls, a batched result that disagreed with a plain call); those are
counted apart. Counts only: nothing here reads a clock.

--dry-run also reports the estimate's dry runs by their own counts (opcheck.runtime.cost.standin:
the engine with the test's own arguments on a function with the probe's shapes and its vmap,
forward-AD and batched-backward support; for an expected failure, a wrong one): the op's calls, and
the engine's backward passes (its plain and batched VJPs, as its report counts them:
Plan.engine_backward) against those in the test, where neither raised through the check: the calls
inside autograd that a wrapper of the op does not see. It reports; the exit status stays the
estimate's plans'.

    python benchmarks/bench_plan.py                          # the catalog (about 3 minutes, one core)
    python benchmarks/bench_plan.py --specs op_specs/sin.yaml --specs op_specs/cube.yaml
    python benchmarks/bench_plan.py --dry-run
    python benchmarks/bench_plan.py --large                  # a dry run on meta tensors at real sizes

--large times one dry run of fast_mode="auto" on a large check, on meta tensors (the default beyond
the full check's first size: opcheck.runtime.cost.standin.on_meta) and on real ones, beside the check
itself, for torch.sin at 1024x1024 and x*x without a vmap rule at 4096x1024, and says whether the
two dry runs made the same evaluations (each probe's prices measured before either is timed).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import opcheck.runtime.samples as samples  # noqa: E402
from opcheck.runtime.checks import run_check  # noqa: E402
from opcheck.runtime.context import Settings  # noqa: E402
from opcheck.runtime.cost.estimate import estimate, expected_failure  # noqa: E402
from opcheck.runtime.cost.plan import TIMED, Kind  # noqa: E402
from opcheck.runtime.cost.probe import Probe  # noqa: E402
from opcheck.runtime.cost.samples import SampleProbes  # noqa: E402
from opcheck.runtime.cost.standin import dry_run  # noqa: E402
from opcheck.runtime.outcomes import CheckSkipped  # noqa: E402
from opcheck.spec import load_specs  # noqa: E402
from opcheck.spec.case import cases_of  # noqa: E402
from opcheck.spec.model import Check  # noqa: E402

CHECKS = ("gradcheck", "forward_ad", "gradgradcheck", "fwgrad_bwgrad")
FORWARD_SIDE = (Kind.FORWARD, Kind.JVP, Kind.VMAP, Kind.VMAP_JVP, Kind.VMAP_TANGENTS)
"""The plan's kinds of evaluation that call the op itself (a batched one once)."""


class _Counter:
    """Calls of the ops samples.op_callable resolves, while `on`."""

    def __init__(self) -> None:
        self.calls, self.on = 0, False

    def wrap(self, op: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(op)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.calls += 1
            return op(*args, **kwargs)

        return counted

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.calls, self.on = 0, True
        try:
            yield
        finally:
            self.on = False


@contextlib.contextmanager
def counted_ops(counter: _Counter) -> Iterator[None]:
    """Every op the runtime resolves comes wrapped by `counter` (the estimate's probes and the test's
    calls alike; only calls inside `counter.counting()` count)."""
    resolve = samples._op
    samples._op = lambda spec: counter.wrap(resolve(spec))
    try:
        yield
    finally:
        samples._op = resolve


def compare(spec_paths: list[Path], dry: bool = False) -> list[dict[str, Any]]:
    """One record per cpu gradient test of the specs (CHECKS; with `dry`, and the dry runs' counts)
    that is neither skipped nor unestimated."""
    specs = sorted(load_specs(spec_paths, root=REPO), key=lambda s: s.name)
    settings, counter, records = Settings(), _Counter(), []
    with counted_ops(counter), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spec in specs:
            probes = SampleProbes(spec)
            for case in cases_of(spec):
                if case.device != "cpu" or case.check not in CHECKS:
                    continue
                est = estimate(spec, case, settings, probes)
                if est.skipped is not None:
                    continue
                fails = expected_failure(spec, case)
                plans = est.plans  # (plans_of's, as `opcheck list --cost` prices them)
                planned = sum(n for plan in plans for (kind, _), n in plan.evals.items() if kind in FORWARD_SIDE)
                # the dry runs' own counts: the op's calls (the plan's) and the engine's backward passes
                backward = [plan.engine_backward for plan in plans]
                dry_runs = planned if dry else None
                dry_backward = sum(b for b in backward if b is not None) if dry and None not in backward else None
                # one engine call per call of the sample; a kink's redraw, or a crash, makes it another count
                engine_calls = len(probes.for_check(case, second_order=Check.parse(case.check).second_order))
                with counter.counting(), contextlib.redirect_stdout(io.StringIO()), engine_stats() as stats:
                    try:
                        run_check(spec, case.check, case.device, case.dtype, case.sample)
                        outcome = "passed"
                    except CheckSkipped:
                        continue
                    except Exception as e:  # noqa: BLE001 - a failing test: its outcome is the record's
                        outcome = type(e).__name__
                records.append(
                    {
                        "test": f"{spec.name}::test_{case.check}[cpu-{case.dtype}-{case.sample}]",
                        "expected_failure": fails,
                        "outcome": outcome,
                        "planned": planned,
                        "made": counter.calls,
                        "path": list(dict.fromkeys(text for plan in plans for text in plan.path)),
                        "timed": any(plan.steps[TIMED] for plan in plans),
                        # what the test's values decided: entries settled near the tolerance, batched
                        # results that disagreed with a plain call (a stand-in's values decide neither)
                        "by_values": sum(s.settled_rows + s.disagreements for s in stats),
                        "dry_run": dry_runs,
                        "backward_made": _backward_passes(stats) if len(stats) == engine_calls else None,
                        "dry_run_backward": dry_backward,
                    }
                )
    return records


@contextlib.contextmanager
def engine_stats() -> Iterator[list[Any]]:
    """The engine's EvalStats of every check that returned a report inside (its reports'
    opcheck.engine.api._report): a check that raised through has none."""
    from opcheck.engine import api

    found: list[Any] = []
    report = api._report

    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = report(*args, **kwargs)
        found.append(result.stats)
        return result

    api._report = recorded
    try:
        yield found
    finally:
        api._report = report


def _backward_passes(stats: list[Any]) -> int:
    """The engine's backward passes, plain and batched, as its reports count them."""
    return sum(s.vjp_calls + s.batched_vjp_calls for s in stats)


def report(records: list[dict[str, Any]]) -> int:
    differ = [r for r in records if r["planned"] != r["made"]]
    for r in differ:
        print(
            f"differs: {r['test']}: planned {r['planned']}, made {r['made']} ({r['outcome']}"
            f"{', expected to fail' if r['expected_failure'] else ''}"
            f"{', a timed choice' if r['timed'] else ''}{', decided by values' if r['by_values'] else ''}); "
            f"{'; '.join(r['path'])}"
        )
    passing = [r for r in records if not r["expected_failure"]]
    failing = [r for r in records if r["expected_failure"]]
    for label, group in (("tests", passing), ("expected failures", failing)):
        equal = sum(r["planned"] == r["made"] for r in group)
        planned, made = sum(r["planned"] for r in group), sum(r["made"] for r in group)
        print(
            f"{label}: {equal} of {len(group)} planned the op's calls they made "
            f"(forward side: {planned} planned, {made} made)"
        )
    timed = [r for r in passing if r["timed"]]
    print(
        f"of the tests, {len(timed)} make a timed choice (the engine times its own calls there, the plan"
        f" takes the probe's times): {sum(r['planned'] == r['made'] for r in timed)} of them planned exactly"
    )
    by_values = [r for r in passing if r["by_values"]]
    print(
        f"of the tests, {len(by_values)} make calls their values decide (entries near the tolerance settled"
        f" by plain calls, a batched result that disagreed with a plain call): "
        f"{sum(r['planned'] == r['made'] for r in by_values)} of them planned exactly"
    )
    dry = [r for r in records if r.get("dry_run") is not None]
    if dry:
        for r in dry:
            if r["dry_run"] != r["made"]:
                print(f"dry run differs: {r['test']}: dry run {r['dry_run']}, made {r['made']}, planned {r['planned']}")
        for label, group in (
            ("tests", [r for r in dry if not r["expected_failure"]]),
            ("expected failures", [r for r in dry if r["expected_failure"]]),
        ):
            print(
                f"dry run, {label}: {sum(r['dry_run'] == r['made'] for r in group)} of {len(group)} made the op's calls"
                f" (the estimate's plans: {sum(r['planned'] == r['made'] for r in group)} of them)"
            )
        compared = [r for r in dry if r["backward_made"] is not None and r["dry_run_backward"] is not None]
        for r in compared:
            if r["dry_run_backward"] != r["backward_made"]:
                print(
                    f"dry run's backward passes differ: {r['test']}: dry run {r['dry_run_backward']}, "
                    f"made {r['backward_made']}"
                )
        print(
            f"dry run, backward passes: {sum(r['dry_run_backward'] == r['backward_made'] for r in compared)} of "
            f"{len(compared)} tests made the engine's backward passes"
        )
    return 1 if any(r["planned"] != r["made"] and not r["timed"] and not r["by_values"] for r in passing) else 0


class _SquareWithoutVmap(torch.autograd.Function):
    """x*x as a kernel without a vmap rule: every finite difference a plain call."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


LARGE = {"torch.sin": (torch.sin, (1024, 1024)), "x*x without a vmap rule": (_SquareWithoutVmap.apply, (4096, 1024))}


def large(cases: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = LARGE) -> list[str]:
    """Per case, a line: the dry run's seconds on meta tensors and on real ones, the check's, and
    whether the two dry runs made the same evaluations."""
    from opcheck.engine import gradcheck_report

    lines = []
    flags = {"fast_mode": "auto"}
    for name, (fn, shape) in cases.items():
        x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
        probe = Probe(fn, (x,))
        dry_run(probe, flags)  # the probe measures what the dry run prices: its batched calls
        seconds = {}
        runs = {}
        for where, meta in (("meta", True), ("real", False)):
            start = time.perf_counter()
            runs[where] = dry_run(probe, flags, meta=meta)
            seconds[where] = time.perf_counter() - start
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            passed = gradcheck_report(fn, (x,), **flags).passed
        check = time.perf_counter() - start
        meta_run, real_run = runs["meta"], runs["real"]
        same = meta_run is not None and real_run is not None and meta_run.evaluations == real_run.evaluations
        size = "x".join(map(str, shape))
        lines.append(
            f"{name} at {size}: dry run on meta tensors {seconds['meta']:.2f} s, on real tensors "
            f"{seconds['real']:.2f} s, the check {check:.2f} s (passed: {passed}); same evaluations: {same}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--specs", action="append", type=Path, help="a spec file or folder (repeatable; default op_specs)"
    )
    parser.add_argument("--json", type=Path, help="write every record here")
    parser.add_argument("--dry-run", action="store_true", help="also the forward_ad tests, and the dry runs")
    parser.add_argument("--large", action="store_true", help="only: dry runs of two large checks, timed")
    args = parser.parse_args(argv)
    if args.large:
        print("\n".join(large()))
        return 0
    records = compare(args.specs or [REPO / "op_specs"], dry=args.dry_run)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return report(records)


if __name__ == "__main__":
    sys.exit(main())
