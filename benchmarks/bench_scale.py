#!/usr/bin/env python
"""Scale mutants: opcheck's fast_mode="auto" vs torch's fast and slow modes, side by side.

    python benchmarks/bench_scale.py                  # every mutant and twin, best of 1
    python benchmarks/bench_scale.py --repeat 3 --json /tmp/scale.json
    python benchmarks/bench_scale.py --cases sin_64x64_tail7,sin_64x64_tail7:twin
    python benchmarks/bench_scale.py --device cuda

The corpus is tests/engine/scale_mutants.py (imported from there, nothing is copied): localized
gradient bugs at real sizes (a tail tile, one matmul column, one softmax row, one attention head,
one conv row, one entry, a jvp tail, a double-backward tail), each beside its correct twin. Case
names: ID for the mutant, ID:twin for its twin (--list-cases prints them).

For every case, each tool runs in its own fresh subprocess (so its peak memory,
getrusage(RUSAGE_SELF).ru_maxrss, is its own): one untimed warm-up on torch.sin over a 4x4 input
with the case's checker and flags, then --repeat timed calls (best time kept) on fresh inputs.
With --device (default cpu) the inputs are drawn as on the CPU and moved there; the clock waits
for the device, and the peak device memory of the timed calls (torch.cuda.max_memory_allocated,
reset after the warm-up) is reported beside the peak RSS ("n/a" on the CPU):

* auto: opcheck.gradcheck_report / gradgradcheck_report with fast_mode="auto" and the default
  jacobian_budget; its verdict, the path each comparison took (stats.auto_paths) and, on a
  failure, where the failure was localized;
* torch fast: torch.autograd.gradcheck / gradgradcheck with fast_mode=True;
* torch slow: fast_mode=False, only where the Jacobian has at most --slow-max-entries entries
  (n*m; for gradgradcheck (n_in + n_out) * n_in), else "not run".

A mutant is "caught" when the check fails with GradcheckError; a twin "passes" when it passes
(a failure on a twin is a false alarm). The summary prints caught/missed per tool, opcheck auto
total / torch fast total (the same cases) and the largest peak memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "engine"))  # scale_mutants lives with the engine tests
sys.path.insert(0, str(ROOT))  # and builds its ops from tests.broken_ops
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _device import add_device_option, clock, fmt_mb, parse_device, peak_memory_mb, reset_peak_memory  # noqa: E402
from _results import write_json  # noqa: E402

TOOLS = ("auto", "torch fast", "torch slow")
DEFAULT_SLOW_MAX = 2**24


def _corpus():
    import scale_mutants

    return {m.id: m for m in scale_mutants.MUTANTS}


def all_cases(corpus) -> list[str]:
    return [c for mid in corpus for c in (mid, f"{mid}:twin")]


def parse_case(name: str, corpus):
    mid, _, kind = name.partition(":")
    if mid not in corpus or kind not in ("", "twin"):
        raise SystemExit(f"unknown case {name!r}; --list-cases prints them")
    return corpus[mid], ("twin" if kind else "mutant")


def jacobian_size(m) -> int:
    """n*m of the function checked (gradgradcheck checks the VJP: (n_in + n_out) * n_in)."""
    import torch

    inputs = m.make_inputs()
    out = m.right(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    n_in = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad)
    n_out = sum(o.numel() for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))
    return (n_in + n_out) * n_in if m.checker == "gradgradcheck" else n_in * n_out


# ---------------------------------------------------------------------------------- worker
def _first_lines(msg: str, n: int = 3) -> str:
    return "\n".join(msg.strip().splitlines()[:n])


def _where(mismatch) -> str | None:
    """Where opcheck localized a failure, in a line."""
    if mismatch is None:
        return None
    head = f"d {mismatch.output_name} / d {mismatch.input_name}"
    comparison = getattr(mismatch, "comparison", None)
    if comparison is not None:  # a ProjectionMismatch: beyond the budget
        hint = mismatch.hints[0] if mismatch.hints else ""
        return f"{head}, {comparison}: {mismatch.mismatched} of {mismatch.total} projection entries; {hint}"
    worst = mismatch.worst[0] if mismatch.worst else None
    at = f"; worst entry d out{list(worst.output_index)} / d in{list(worst.input_index)}" if worst else ""
    return f"{head}, full block: {mismatch.mismatched} of {mismatch.total} Jacobian entries{at}"


def on_device(inputs: tuple, device) -> tuple:
    """The corpus's inputs (drawn on the CPU) on `device`, as leaves with the same requires_grad."""
    import torch

    if device.type == "cpu":
        return inputs
    return tuple(
        x.detach().to(device).requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs
    )


def worker(tool: str, case: str, repeat: int, threads: int, device_name: str = "cpu") -> dict:
    import torch

    import opcheck

    device = parse_device(device_name)
    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    from torch.autograd.gradcheck import GradcheckError

    m, kind = parse_case(case, _corpus())
    fn = m.right if kind == "twin" else m.wrong
    if tool == "auto":
        report = getattr(opcheck, f"{m.checker}_report")

        def check(f, inputs):
            return report(f, inputs, fast_mode="auto", **m.flags)
    else:
        torch_check = getattr(torch.autograd, m.checker)

        def check(f, inputs):
            return torch_check(f, inputs, fast_mode=(tool == "torch fast"), **m.flags)

    def run(f, inputs):
        gc.collect()
        gc.disable()
        t0 = clock(device)
        try:
            r = check(f, inputs)
            if tool == "auto":
                verdict = True if r.passed else "GradcheckError"
                msg = "" if r.passed else str(r.error)
            else:
                verdict, msg = (True, "") if r is True else (repr(r), "")
        except GradcheckError as e:
            r, verdict, msg = None, "GradcheckError", str(e)
        except Exception as e:  # noqa: BLE001 - any exception is a verdict here
            r, verdict, msg = None, type(e).__name__, str(e)
        secs = clock(device) - t0
        gc.enable()
        return secs, verdict, msg, r

    warm = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    run(torch.sin, on_device((warm,), device))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reset_peak_memory(device)
    times, result = [], None
    for _ in range(repeat):
        secs, verdict, msg, r = run(fn, on_device(m.make_inputs(), device))
        times.append(secs)
        result = result or (verdict, msg, r)
    verdict, msg, r = result
    out = {
        "tool": tool,
        "case": case,
        "seconds": min(times),
        "times": times,
        "verdict": verdict,
        "message": _first_lines(msg, 4) if msg else "",
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_check_mb": rss_before / 1024,
        "peak_device_mb": peak_memory_mb(device),
    }
    if tool == "auto" and r is not None:
        out["auto_paths"] = list(r.stats.auto_paths)
        found = re.search(r"\(J·U from ([^)]+)\) found a mismatch|J·U from ([^)]+)\)", msg) if msg else None
        if found and not any(p.startswith("projected") for p in out["auto_paths"]):
            # a failure in the JVP stage raises before the path is recorded: the message names it
            out["auto_paths"].append(f"projected (J·U from {found.group(1) or found.group(2)}), failed")
        out["where"] = _where(r.mismatch) if not r.passed else None
    return out


# ---------------------------------------------------------------------------------- driver
def outcome(kind: str, verdict) -> str:
    if verdict is None:
        return "not run"
    if verdict not in (True, "GradcheckError"):
        return f"error ({verdict})"
    if kind == "mutant":
        return "caught" if verdict == "GradcheckError" else "MISSED"
    return "passed" if verdict is True else "FALSE ALARM"


def run_worker(tool, case, args) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        tool,
        case,
        "--repeat",
        str(args.repeat),
        "--threads",
        str(args.threads),
        "--device",
        args.device,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {
        "tool": tool,
        "case": case,
        "seconds": None,
        "verdict": f"worker failed (exit {proc.returncode})",
        "message": _first_lines(proc.stderr[-2000:], 8),
        "peak_rss_mb": None,
        "peak_device_mb": None,
    }


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cases", default=None, help="comma-separated cases (ID = the mutant, ID:twin = its twin; default: all)"
    )
    p.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="timed calls per tool and case, best kept (default 1)"
    )
    p.add_argument(
        "--slow-max-entries",
        type=int,
        default=DEFAULT_SLOW_MAX,
        metavar="N",
        help=f"run torch's slow mode only where n*m <= N (default 2**24 = {DEFAULT_SLOW_MAX})",
    )
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each worker (default 1)")
    add_device_option(p)
    p.add_argument("--json", default=None, metavar="PATH", help="write the results to PATH")
    p.add_argument("--list-cases", action="store_true", help="print the case names and exit")
    p.add_argument("--worker", nargs=2, metavar=("TOOL", "CASE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")

    if args.worker:
        result = worker(args.worker[0], args.worker[1], args.repeat, args.threads, args.device)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    import torch

    import opcheck

    device = parse_device(args.device)
    corpus = _corpus()
    if args.list_cases:
        print("\n".join(all_cases(corpus)))
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()] if args.cases else all_cases(corpus)
    for c in cases:
        parse_case(c, corpus)

    t_start = time.perf_counter()
    cmd = shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    print(f"command: {cmd}")
    print(
        f"torch {torch.__version__} | opcheck {getattr(opcheck, '__version__', '?')} | python "
        f"{platform.python_version()} | {platform.machine()}, {os.cpu_count()} CPUs, torch threads {args.threads} | "
        f"device {args.device} | "
        f"best of {args.repeat} | torch slow where n*m <= {args.slow_max_entries} | one subprocess per tool x case"
    )

    # ---- detection table, a row as each case ends
    w = max(len(c) for c in cases) + 1
    # MB: the worker's peak RSS; on a device with memory statistics, "dev MB": its peak device memory
    dev = device.type != "cpu"
    mem = f"{'MB':>5s}" + (f" {'dev MB':>6s}" if dev else "")
    hdr = (
        f"{'case':{w}s} {'checker':13s} {'n*m':>10s} | {'auto':>8s} {'s':>7s} {mem} | "
        f"{'torch fast':>10s} {'s':>7s} {mem} | {'torch slow':>10s} {'s':>7s} {mem} | auto path"
    )
    print("\n" + hdr)
    print("-" * len(hdr), flush=True)

    def cell(t, width):
        if t.get("not_run"):
            return f"{'not run':>{width}s} {'-':>7s} {'-':>5s}" + (f" {'-':>6s}" if dev else "")
        secs = f"{t['seconds']:7.3f}" if t.get("seconds") is not None else f"{'-':>7s}"
        mb = f"{t['peak_rss_mb']:5.0f}" if t.get("peak_rss_mb") is not None else f"{'-':>5s}"
        if dev:
            mb += " " + fmt_mb(t.get("peak_device_mb"), 6)
        return f"{_short(t['outcome'], width):>{width}s} {secs} {mb}"

    results = []
    for case in cases:
        m, kind = parse_case(case, corpus)
        entries = jacobian_size(m)
        rec = {"case": case, "id": m.id, "kind": kind, "checker": m.checker, "entries": entries, "tools": {}}
        for tool in TOOLS:
            if tool == "torch slow" and entries > args.slow_max_entries:
                rec["tools"][tool] = {
                    "verdict": None,
                    "seconds": None,
                    "peak_rss_mb": None,
                    "not_run": f"n*m = {entries} > --slow-max-entries {args.slow_max_entries}",
                }
                continue
            r = run_worker(tool, case, args)
            r["outcome"] = outcome(kind, r["verdict"])
            rec["tools"][tool] = r
        results.append(rec)
        t = rec["tools"]
        paths = sorted(set(t["auto"].get("auto_paths") or [])) or ["-"]
        print(
            f"{rec['case']:{w}s} {rec['checker']:13s} {rec['entries']:10d} | {cell(t['auto'], 8)} | "
            f"{cell(t['torch fast'], 10)} | {cell(t['torch slow'], 10)} | {', '.join(paths)}",
            flush=True,
        )
    fails = [(rec, tool) for rec in results for tool in TOOLS if rec["tools"][tool].get("verdict") not in (None, True)]
    if fails:
        print("\nfailures (first lines; auto: where it localized the error):")
        for rec, tool in fails:
            t = rec["tools"][tool]
            first = t["message"].splitlines()[0] if t.get("message") else ""
            print(f"  {rec['case']} [{tool}] {t['outcome']}: {_short(first, 150)}")
            if t.get("where"):
                print(f"      where: {_short(t['where'], 200)}")

    # ---- summary
    summary = {"cases": len(results), "detection": {}}
    print("\n== detection")
    for tool in TOOLS:
        mut = [r for r in results if r["kind"] == "mutant" and not r["tools"][tool].get("not_run")]
        twin = [r for r in results if r["kind"] == "twin" and not r["tools"][tool].get("not_run")]
        caught = [r["case"] for r in mut if r["tools"][tool]["outcome"] == "caught"]
        missed = [r["case"] for r in mut if r["tools"][tool]["outcome"] != "caught"]
        passed = [r["case"] for r in twin if r["tools"][tool]["outcome"] == "passed"]
        alarms = [r["case"] for r in twin if r["tools"][tool]["outcome"] != "passed"]
        not_run = sum(1 for r in results if r["tools"][tool].get("not_run"))
        print(
            f"[{tool}] mutants caught {len(caught)}/{len(mut)}, twins passed {len(passed)}/{len(twin)}"
            + (f", not run on {not_run} case(s)" if not_run else "")
            + (f" | missed: {', '.join(missed)}" if missed else "")
            + (f" | false alarms / errors: {', '.join(alarms)}" if alarms else "")
        )
        summary["detection"][tool] = {
            "mutants": len(mut),
            "caught": caught,
            "missed": missed,
            "twins": len(twin),
            "passed": passed,
            "false_alarms": alarms,
            "not_run": not_run,
        }

    def total(tool, recs):
        return sum(r["tools"][tool]["seconds"] or 0.0 for r in recs)

    ran = [
        r
        for r in results
        if r["tools"]["auto"].get("seconds") is not None and r["tools"]["torch fast"].get("seconds") is not None
    ]
    ta, tf = total("auto", ran), total("torch fast", ran)
    rt = ta / tf if tf > 0 else float("nan")
    print(f"[time] opcheck auto {ta:.3f}s / torch fast {tf:.3f}s = {rt:.2f}x over {len(ran)} cases (target <= 10x)")
    slow = [r for r in results if r["tools"]["torch slow"].get("seconds") is not None]
    if slow:
        ts, tas = total("torch slow", slow), total("auto", slow)
        print(
            f"[time] where torch slow ran ({len(slow)} cases): torch slow {ts:.3f}s, opcheck auto {tas:.3f}s "
            f"= {tas / ts if ts > 0 else float('nan'):.3f}x of it"
        )
        summary.update(torch_slow_s=ts, auto_s_where_slow_ran=tas)
    peaks = {tool: max((r["tools"][tool].get("peak_rss_mb") or 0.0 for r in results), default=0.0) for tool in TOOLS}
    base = min((r["tools"]["auto"].get("rss_before_check_mb") or 0.0 for r in results), default=0.0)
    print(
        "[memory] max peak RSS per process: "
        + ", ".join(f"{t} {v:.0f} MB" for t, v in peaks.items())
        + f" (target <= 2048 MB; a process holds about {base:.0f} MB before its first check)"
    )
    device_peaks = {
        tool: max(
            (r["tools"][tool]["peak_device_mb"] for r in results if r["tools"][tool].get("peak_device_mb") is not None),
            default=None,
        )
        for tool in TOOLS
    }
    print(
        f"[memory] max peak device memory per process ({device}, timed calls): "
        + ", ".join(f"{t} {fmt_mb(v, unit=True)}" for t, v in device_peaks.items())
    )
    wall = time.perf_counter() - t_start
    print(f"wall time {wall:.1f}s")
    summary.update(
        auto_s=ta, torch_fast_s=tf, auto_over_torch_fast=rt, peak_rss_mb=peaks, peak_device_mb=device_peaks, wall_s=wall
    )

    if args.json:
        write_json(
            args.json,
            cmd,
            args.threads,
            device=str(device),
            repeat=args.repeat,
            slow_max_entries=args.slow_max_entries,
            cases=results,
            summary=summary,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
