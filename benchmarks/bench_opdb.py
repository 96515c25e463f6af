#!/usr/bin/env python
"""Every op of OpInfo's op_db through opcheck and torch.autograd, call for call, as JSON lines.

For each op with autograd (every variant), each of float64 and complex128 that the op's
backward supports on CPU, and each of its samples, the script makes the calls PyTorch's own
gradient tests make (test_ops_gradients.py / test_ops_fwd_gradients.py, built like
``TestGradients._check_helper``), in torch's slow mode (fast_mode=False) and fast mode
(fast_mode=True):

* ``grad``: gradcheck with the op's check_batched_grad and nondet tol, check_grad_dtypes;
* ``fwd``: forward-AD gradcheck (check_backward_ad=False) with the op's check_batched_forward_grad;
* ``gradgrad`` and ``gradgrad_noncontig``: gradgradcheck with the op's check_batched_gradgrad,
  without and with non-contiguous grad_outputs;
* ``fwgrad_bwgrad`` and ``fwgrad_bwgrad_noncontig``: gradgradcheck forward over reverse;
* ``fwd_unsupported``, ``fwgrad_bwgrad_unsupported`` and ``fwgrad_bwgrad_unsupported_noncontig``:
  the same calls on an op that declares forward AD (``supports_forward_ad=False``) or forward over
  reverse (``supports_fwgrad_bwgrad=False``) unsupported, where torch's tests
  (test_forward_mode_AD, test_fn_fwgrad_bwgrad) expect NotImplementedError ("Trying to use forward
  AD with ... that does not support it"); ``--calls KIND...`` makes only the kinds named.

Both tools run in one process, on separately built copies of the same sample, each call after
``torch.manual_seed(0)`` (torch draws gradgradcheck's grad_outputs and its batched-grad probes
from the global generator). Each call's verdict (True, "GradcheckError" or the exception's class
name), the first line of its message and its time are written as one JSON line: wall seconds,
and the CPU seconds of the thread that runs both, which other work on a shared machine does not
stretch (torch runs on one thread here), so the report compares CPU seconds where a record has
them. A pair that disagrees (verdict or first line; neither a timeout) is run through torch
again: when torch disagrees with itself the pair is marked nondeterministic and counted apart.

Sharded and resumable: ``--shard i/n`` takes every n-th op group; an (op, dtype) group that
finished has a ``{"done": ...}`` line and is skipped when the same file is given again (a done
line lists the call kinds made, ``"calls"``, unless they are all of the op's and all supported
ones, as the lines written before the unsupported kinds are), and in a group a run stopped
inside, the calls it recorded are not made again. ``--skip-recorded FILE...``
does the same for the records of earlier runs kept in other files, such as those kept with the
project, gzipped, in benchmarks/results/opdb/ (every reader takes ``.gz`` files as they are).
A call that runs past ``--limit-seconds`` of CPU time is a timeout, one that cannot allocate within
``--limit-memory`` (GiB of address space over what the process holds at the start) is out of
memory; both are counted apart. A slow-mode call whose least cost in torch (two evaluations
of the checked function per input direction, each at least its fastest call) is over twice the
limit is not made, nor one with non-contiguous grad_outputs whose contiguous twin ran past the time
or memory limit in torch's loop: both sides are recorded as a predicted timeout (or, after the
twin's out of memory, a predicted out of memory), listed apart by group.
``--no-batching`` runs opcheck alone with vmapped evaluation off (torch's loop), and
``--compare FILE...`` lists the calls where opcheck's verdict or first line differs between the
paired records (batching on) and the ``--no-batching`` ones (``"torch": null``) of the files.
``--report FILE...`` prints the totals; both count the unsupported kinds on a line of their own.

    python benchmarks/bench_opdb.py --shard 0/2 --out opdb.jsonl &
    python benchmarks/bench_opdb.py --shard 1/2 --out opdb.jsonl
    python benchmarks/bench_opdb.py --report opdb.jsonl
    python benchmarks/bench_opdb.py --report benchmarks/results/opdb/*.jsonl.gz
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import math
import os
import resource
import signal
import sys
import time
import warnings
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_opinfo import build_check, fresh_args, make_samples, op_key  # noqa: E402

DTYPES = (torch.float64, torch.complex128)
MODES = {"slow": False, "fast": True}


SUPPORTED = ("grad", "fwd", "gradgrad", "gradgrad_noncontig", "fwgrad_bwgrad", "fwgrad_bwgrad_noncontig")
"""The call kinds torch's tests expect to pass (an op's declared support decides which it gets)."""
UNSUPPORTED = ("fwd_unsupported", "fwgrad_bwgrad_unsupported", "fwgrad_bwgrad_unsupported_noncontig")
"""The call kinds torch's tests expect to raise NotImplementedError: forward AD, or forward over
reverse, on an op that declares it unsupported."""
KINDS = SUPPORTED + UNSUPPORTED


def calls_for(op, kinds=KINDS) -> list[tuple[str, str, dict]]:
    """(call name, checker, kwargs without fast_mode) for the calls torch's tests make on this op,
    of these kinds. An op that declares forward AD (or forward over reverse) unsupported gets the
    same call as one that supports it, under its own name: torch's tests make it and expect it to
    raise NotImplementedError."""
    return [call for call in _calls_for(op) if call[0] in kinds]


def _calls_for(op) -> list[tuple[str, str, dict]]:
    common = dict(check_grad_dtypes=True, nondet_tol=op.gradcheck_nondet_tol)
    calls = []
    if op.supports_autograd:
        calls.append(
            (
                "grad",
                "gradcheck",
                dict(
                    common,
                    check_batched_grad=op.check_batched_grad,
                    check_forward_ad=False,
                    check_backward_ad=True,
                    check_undefined_grad=True,
                    check_batched_forward_grad=False,
                ),
            )
        )
    calls.append(
        (
            "fwd" if op.supports_forward_ad else "fwd_unsupported",
            "gradcheck",
            dict(
                common,
                check_batched_grad=False,
                check_forward_ad=True,
                check_backward_ad=False,
                check_undefined_grad=True,
                check_batched_forward_grad=op.check_batched_forward_grad,
            ),
        )
    )
    for noncontig in (False, True):
        suffix = "_noncontig" if noncontig else ""
        if op.supports_gradgrad:
            calls.append(
                (
                    f"gradgrad{suffix}",
                    "gradgradcheck",
                    dict(common, gen_non_contig_grad_outputs=noncontig, check_batched_grad=op.check_batched_gradgrad),
                )
            )
        calls.append(
            (
                f"fwgrad_bwgrad{suffix}" if op.supports_fwgrad_bwgrad else f"fwgrad_bwgrad_unsupported{suffix}",
                "gradgradcheck",
                dict(
                    common,
                    gen_non_contig_grad_outputs=noncontig,
                    check_fwd_over_rev=True,
                    check_rev_over_rev=False,
                    check_batched_grad=False,
                    check_undefined_grad=False,
                ),
            )
        )
    return calls


class CallTimeout(Exception):
    pass


LIMITED = ("Timeout", "OutOfMemory")
"""Verdicts of a call that hit the benchmark's limits rather than an answer; counted apart."""


def limit_memory(gib: float) -> None:
    """Let this process map at most `gib` GiB more than it does now: a larger allocation raises
    (recorded as OutOfMemory) instead of the kernel's OOM killer ending the whole run."""
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def out_of_memory(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


WALL_LIMIT_FACTOR = 4
"""A call also stops after this many times its limit in wall seconds (one that waits, not computes)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """At most `seconds` of the process's CPU time (which other work on the machine does not use
    up, as it does wall time: two busy processes a core made 600 wall seconds 135-330 CPU
    seconds), and WALL_LIMIT_FACTOR times that in wall seconds."""

    def expire(signum, frame):
        cpu = signum == signal.SIGPROF
        raise CallTimeout(f"over {seconds if cpu else WALL_LIMIT_FACTOR * seconds:g} {'CPU' if cpu else 'wall'} s")

    old = signal.signal(signal.SIGPROF, expire), signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, WALL_LIMIT_FACTOR * seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old[0])
        signal.signal(signal.SIGALRM, old[1])


def first_line(e: BaseException) -> str:
    from torch.autograd.gradcheck import GradcheckError

    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text if isinstance(e, GradcheckError) else f"{type(e).__name__}: {text}"


def run(checker, fn, args, kwargs, limit: float) -> dict:
    from torch.autograd.gradcheck import GradcheckError

    fresh = fresh_args(args)
    gc.disable()  # a collection inside one tool's call would be charged to it (collected per group)
    torch.manual_seed(0)
    # the thread's CPU clock: torch runs on this one thread here, and the process's clock reads in
    # 4 ms ticks while time_limit's CPU timer is armed
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        with time_limit(limit), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = checker(fn, fresh, **kwargs)
        verdict, line = (True, "") if r is True else (repr(r), "")
    except CallTimeout as e:
        verdict, line = "Timeout", str(e)
    except GradcheckError as e:  # opcheck.GradcheckError subclasses torch's
        verdict, line = "GradcheckError", first_line(e)
    except Exception as e:  # noqa: BLE001 - any exception is a verdict here
        verdict, line = ("OutOfMemory", first_line(e)) if out_of_memory(e) else (type(e).__name__, first_line(e))
    seconds, cpu = time.perf_counter() - t0, time.thread_time() - c0
    gc.enable()
    return {"verdict": verdict, "first_line": line[:300], "seconds": round(seconds, 6), "cpu_seconds": round(cpu, 6)}


PREDICT_FACTOR = 2.0
"""A slow-mode call is not made when its least cost is this many times the time limit. The
margin covers the probe's noise: on a loaded machine a probe of a few hundred microseconds was
seen to read 1.26x the time torch's whole call then took per evaluation."""

FLOOR_SHOWN = 1.0
"""The report holds the probe's floors to torch's time on the slow calls that took this long."""

SECOND_ORDER = (
    "gradgrad",
    "gradgrad_noncontig",
    "fwgrad_bwgrad",
    "fwgrad_bwgrad_noncontig",
    "fwgrad_bwgrad_unsupported",
    "fwgrad_bwgrad_unsupported_noncontig",
)


def directions(t: torch.Tensor) -> int:
    """The numerical Jacobian's perturbations of t: one per element, two per complex element
    (the real and the imaginary part), each a central difference of two evaluations."""
    return t.numel() * (2 if t.is_complex() else 1)


def least_slow_seconds(fn, args, call: str = "fwd", clock=time.thread_time, repeats: int = 3) -> float:
    """A floor under torch's CPU seconds for a slow-mode call on these arguments, or 0 where the
    probe raises, from fn's fastest of `repeats` calls here (one alone is no floor: a first call
    of a few microseconds was seen to take 10x its next). torch's numerical Jacobian evaluates the checked
    function twice per direction of its inputs: for gradcheck that is fn (timed under no_grad);
    for gradgradcheck it is fn's VJP (fn and one backward, without create_graph), whose inputs
    add the grad_outputs. A ``grad`` call also takes the analytical Jacobian by rows, one
    backward per element of the output, twice (the reentrancy check): counted where fn has one
    differentiable output, since a backward from all of several outputs is no floor for one.
    The probe costs 1/(2 x directions) of the numerical Jacobian's time, or less."""
    n_in, floor = sum(directions(a) for a in args), math.inf
    for _ in range(repeats):
        fresh = fresh_args(args)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.no_grad():
                    c0 = clock()
                    fn(*fresh)
                    forward = clock() - c0
                cost = 2 * n_in * forward
                if call == "grad" or call in SECOND_ORDER:
                    out = fn(*fresh)
                    outs = [
                        o
                        for o in (out if isinstance(out, (tuple, list)) else (out,))
                        if isinstance(o, torch.Tensor) and o.requires_grad
                    ]
                    c0 = clock()
                    torch.autograd.grad(outs, fresh, [torch.ones_like(o) for o in outs], allow_unused=True)
                    backward = clock() - c0
                    if call in SECOND_ORDER:
                        cost = 2 * (n_in + sum(directions(o) for o in outs)) * (forward + backward)
                    elif len(outs) == 1:
                        cost += 2 * outs[0].numel() * backward
        except Exception:  # noqa: BLE001 - the call itself will say what is wrong
            return 0.0
        floor = min(floor, cost)
    return floor


def not_made(line: str, verdict: str = "Timeout") -> dict:
    """The record of a call not made: a timeout (or out of memory), counted apart, that says so."""
    return {"verdict": verdict, "first_line": line, "seconds": 0.0, "cpu_seconds": 0.0, "predicted": True}


def tools(no_batching: bool):
    import opcheck
    from opcheck.engine.batching import vmap_batching

    def with_batching(f):
        def call(*a, **k):
            with vmap_batching(not no_batching):
                return f(*a, **k)

        return call

    return (
        {"gradcheck": torch.autograd.gradcheck, "gradgradcheck": torch.autograd.gradgradcheck},
        {"gradcheck": with_batching(opcheck.gradcheck), "gradgradcheck": with_batching(opcheck.gradgradcheck)},
    )


def groups(ops_filter, dtypes=DTYPES, kinds=KINDS):
    """The (op, dtype) groups with autograd that make a call of these kinds."""
    from torch.testing._internal.common_methods_invocations import op_db

    out = []
    for op in op_db:
        if not (op.supports_autograd or op.supports_forward_ad):
            continue
        key = op_key(op.name, op.variant_test_name)
        if ops_filter and key not in ops_filter and op.name not in ops_filter:
            continue
        if not calls_for(op, kinds):
            continue
        supported = op.supported_backward_dtypes("cpu")
        for dtype in dtypes:
            if dtype in supported:
                out.append((op, dtype))
    return out


def lines_of(path: str):
    """The JSON records of a run's file, plain or gzipped (``.gz``); a line a killed run cut short
    is left out."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def call_key(rec: dict) -> tuple:
    return rec["group"], rec["sample"], rec["call"], rec["mode"]


def of_no_batching_run(rec: dict) -> bool:
    """Whether a record is a --no-batching run's: a call with torch's side null, a done line that says so."""
    return rec.get("torch") is None if "call" in rec else rec.get("no_batching", False)


def loop_side(rec: dict) -> dict:
    """The side of a call record that ran a loop over the Jacobian: torch's, or opcheck's in a
    --no-batching run."""
    return rec["opcheck"] if rec["torch"] is None else rec["torch"]


def finished(paths, no_batching: bool = False) -> tuple[dict[str, set[str]], dict[tuple, object]]:
    """What earlier runs of one kind (paired, or ``--no-batching``) recorded in these files: their
    done groups, each with the call kinds made in it (see done_line), and the (group, sample,
    call, mode) of every call they made with its loop side's verdict (a run stopped inside a group
    resumes after its last call: samples are rebuilt from the same seed, so sample k is the same
    sample). The other kind's records do not count: the two runs are made apart."""
    groups: dict[str, set[str]] = defaultdict(set)
    calls: dict[tuple, object] = {}
    for path in paths:
        if os.path.exists(path):
            for rec in lines_of(path):
                if of_no_batching_run(rec) != no_batching:
                    continue
                if "done" in rec:
                    groups[rec["done"]].update(rec.get("calls", SUPPORTED))
                elif "call" in rec:
                    calls[call_key(rec)] = loop_side(rec)["verdict"]
    return groups, calls


def done_line(group: str, op, kinds, kind: dict) -> dict:
    """The line that marks a group done: with the call kinds made in it, unless they are every
    kind of the op and all of SUPPORTED (what a done line without them means, as the lines
    written before the UNSUPPORTED kinds do)."""
    made = [name for name, _, _ in calls_for(op, kinds)]
    if made == [name for name, _, _ in calls_for(op)] and set(made) <= set(SUPPORTED):
        return {"done": group, **kind}
    return {"done": group, "calls": made, **kind}


def ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def run_groups(args) -> int:
    torch.set_num_threads(1)
    if args.limit_memory and os.path.exists("/proc/self/statm"):
        limit_memory(args.limit_memory)
    torch_tools, opcheck_tools = tools(args.no_batching)
    dtypes = tuple(getattr(torch, d) for d in args.dtypes) if args.dtypes else DTYPES
    kinds = tuple(args.calls) if args.calls else KINDS
    todo = groups(set(args.ops) if args.ops else None, dtypes, kinds)
    gc.freeze()  # op_db's objects: later collections need not walk them
    shard, nshards = (int(x) for x in args.shard.split("/"))
    todo = [g for k, g in enumerate(todo) if k % nshards == shard]
    done, recorded = finished([args.out, *(args.skip_recorded or ())], args.no_batching)
    kind = {"no_batching": True} if args.no_batching else {}
    with open(args.out, "a") as out:
        if out.tell() and not ends_with_newline(args.out):
            out.write("\n")  # after a line a killed run cut short, not onto it
        for op, dtype in todo:
            key = op_key(op.name, op.variant_test_name)
            group = f"{key}|{str(dtype).replace('torch.', '')}"
            if {name for name, _, _ in calls_for(op, kinds)} <= done.get(group, set()):
                continue
            gc.collect()
            try:
                samples = {tool: make_samples(op, dtype, args.limit) for tool in ("torch", "opcheck")}
            except Exception as e:  # noqa: BLE001 - an op_db entry that cannot make samples here
                out.write(json.dumps({"group": group, "error": first_line(e), **kind}) + "\n")
                samples = None
            if samples:
                for k, (s_t, s_o) in enumerate(zip(samples["torch"], samples["opcheck"])):
                    fn_t, args_t = build_check(op, s_t)
                    fn_o, args_o = build_check(op, s_o)
                    if not args_t:
                        continue
                    floors: dict[str, float] = {}  # each slow call's least cost in torch, probed once
                    for name, checker, kwargs in calls_for(op, kinds):
                        for mode, fast in MODES.items():
                            if (group, k, name, mode) in recorded:
                                continue
                            kw = dict(kwargs, fast_mode=fast)
                            checked = "vjp" if name in SECOND_ORDER else name  # all four check fn's VJP
                            if not fast and checked not in floors:
                                floors[checked] = least_slow_seconds(fn_o, args_o, name)
                            floor = 0.0 if fast else floors[checked]
                            twin = (group, k, name.removesuffix("_noncontig"), mode)
                            line, verdict = None, "Timeout"
                            if floor >= PREDICT_FACTOR * args.limit_seconds:
                                line = f"predicted: over {args.limit_seconds:g} CPU s (at least {floor:.4g} s)"
                            elif not fast and twin[2] != name and recorded.get(twin) in LIMITED:
                                # the same work, and the same allocations, with contiguous grad_outputs
                                verdict = recorded[twin]
                                past = (
                                    f"{args.limit_seconds:g} CPU s"
                                    if verdict == "Timeout"
                                    else f"the {args.limit_memory:g} GiB memory limit"
                                )
                                line = f"predicted: over {past} (its contiguous twin ran past it)"
                            if line:
                                # torch's loop (and opcheck's without batching) would run past the limit, so
                                # there is no verdict to compare opcheck's with
                                t = None if args.no_batching else not_made(line, verdict)
                                o = not_made(line if args.no_batching else "not run: torch's call " + line, verdict)
                            else:
                                t = (
                                    None
                                    if args.no_batching
                                    else run(torch_tools[checker], fn_t, args_t, kw, args.limit_seconds)
                                )
                                o = run(opcheck_tools[checker], fn_o, args_o, kw, args.limit_seconds)
                            rec = {
                                "group": group,
                                "op": key,
                                "dtype": group.split("|")[1],
                                "sample": k,
                                "call": name,
                                "mode": mode,
                                "torch": t,
                                "opcheck": o,
                            }
                            if not fast:
                                rec["floor"] = round(floor, 6)  # the report holds it to torch's time
                            recorded[call_key(rec)] = loop_side(rec)["verdict"]
                            answered = t and not {t["verdict"], o["verdict"]} & set(LIMITED)
                            if answered and (t["verdict"], t["first_line"]) != (o["verdict"], o["first_line"]):
                                again = run(torch_tools[checker], fn_t, args_t, kw, args.limit_seconds)
                                rec["nondeterministic"] = (again["verdict"], again["first_line"]) != (
                                    t["verdict"],
                                    t["first_line"],
                                )
                            out.write(json.dumps(rec) + "\n")
                            out.flush()
            out.write(json.dumps(done_line(group, op, kinds, kind)) + "\n")
            out.flush()
            if args.verbose:
                print(group, flush=True)
    return 0


# ------------------------------------------------------------------------------------ reports
@contextlib.contextmanager
def no_collection():
    """The cyclic garbage collector off while the records are read and summed: they are hundreds of
    thousands of dicts in no cycle, and the collections that walked them again and again as they
    were read took a fifth of the time of a report or a compare of the kept records."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_paired(paths) -> tuple[list[dict], set[str]]:
    """The files' paired call records (not --no-batching's), and the groups paired runs finished."""
    recs: dict[tuple, dict] = {}
    done = set()
    for path in paths:
        for rec in lines_of(path):
            if of_no_batching_run(rec):
                continue
            if "done" in rec:
                done.add(rec["done"])
            elif "call" in rec:
                recs[call_key(rec)] = rec  # a group redone after an interrupted run: the last record wins
    return list(recs.values()), done


def spent(side: dict) -> float:
    """A call's time: CPU seconds where recorded (not stretched by other work), else wall seconds."""
    return side.get("cpu_seconds", side["seconds"])


def print_times(mode_t: dict, mode_o: dict, op_t: dict, op_o: dict, indent: str) -> None:
    """Each mode's seconds for torch and opcheck (by mode) and the geometric mean of the ratios per op."""
    for mode in MODES:
        if mode_t[mode]:
            print(
                f"{indent}{mode}: torch {mode_t[mode]:.1f} s, opcheck {mode_o[mode]:.1f} s "
                f"(torch / opcheck {mode_t[mode] / max(mode_o[mode], 1e-9):.2f}x)"
            )
    ratios = [op_t[k] / op_o[k] for k in op_t if op_o[k] > 0 and op_t[k] > 0]
    if ratios:
        print(f"{indent}geomean per op torch / opcheck: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")


def count_of(recs: list[dict]) -> str:
    """`N ops, N samples, N` of these call records."""
    ops = {r["op"] for r in recs}
    samples = {(r["group"], r["sample"]) for r in recs}
    return f"{len(ops)} ops, {len(samples)} samples, {len(recs)}"


def report(paths, slow_factor: float) -> int:
    recs, done = load_paired(paths)
    if not recs:
        print("no paired records")
        return 1
    verdicts, lines, nondet, limited = [], [], [], []
    time_t, time_o = defaultdict(float), defaultdict(float)
    per_op_t, per_op_o = defaultdict(float), defaultdict(float)
    worst_call = defaultdict(float)  # op -> max (opcheck - torch) seconds on one call
    calls_slower = []  # (opcheck - torch seconds, record) for every call opcheck took longer on
    cpu_t, cpu_o, cpu_calls = defaultdict(float), defaultdict(float), defaultdict(int)  # per op, CPU-timed calls
    cpu_mode_t, cpu_mode_o = defaultdict(float), defaultdict(float)
    on_cpu = 0
    for r in recs:
        t, o = r["torch"], r["opcheck"]
        if t["verdict"] in LIMITED or o["verdict"] in LIMITED:
            limited.append(r)
            continue
        st, so = spent(t), spent(o)
        if "cpu_seconds" in t and "cpu_seconds" in o:
            on_cpu += 1
            cpu_t[r["op"]] += t["cpu_seconds"]
            cpu_o[r["op"]] += o["cpu_seconds"]
            cpu_calls[r["op"]] += 1
            cpu_mode_t[r["mode"]] += t["cpu_seconds"]
            cpu_mode_o[r["mode"]] += o["cpu_seconds"]
        time_t[r["mode"]] += st
        time_o[r["mode"]] += so
        per_op_t[r["op"]] += st
        per_op_o[r["op"]] += so
        worst_call[r["op"]] = max(worst_call[r["op"]], so - st)
        if so > st:
            calls_slower.append((so - st, r))
        if (t["verdict"], t["first_line"]) == (o["verdict"], o["first_line"]):
            continue
        if r.get("nondeterministic"):
            nondet.append(r)
        elif t["verdict"] != o["verdict"]:
            verdicts.append(r)
        else:
            lines.append(r)
    apart = {id(r) for r in limited}
    floored = [r for r in recs if "floor" in r and id(r) not in apart and spent(r["torch"]) >= FLOOR_SHOWN]
    supported = [r for r in recs if r["call"] not in UNSUPPORTED]
    unsupported = [r for r in recs if r["call"] in UNSUPPORTED]
    if supported or not unsupported:
        print(f"{count_of(supported)} paired calls")
    if unsupported:
        print(
            f"{'  and ' if supported else ''}{count_of(unsupported)} paired calls of the kinds an op declares "
            f"unsupported ({', '.join(UNSUPPORTED)})"
        )
    print(f"  groups: {len(done)} of op_db's {len(groups(None))} (op, dtype) groups done")
    on_wall = len(recs) - len(limited) - on_cpu
    print(f"  times: CPU seconds for {on_cpu} calls, wall seconds for the {on_wall} older records")
    print_times(time_t, time_o, per_op_t, per_op_o, "  ")
    if on_cpu and on_wall:
        print(f"  the {on_cpu} calls timed in CPU seconds alone:")
        print_times(cpu_mode_t, cpu_mode_o, cpu_t, cpu_o, "    ")
    print(f"verdict disagreements: {len(verdicts)}")
    print(f"first-line disagreements: {len(lines)}")
    print(f"nondeterministic (torch disagrees with itself), apart: {len(nondet)}")
    predicted = [r for r in limited if r["torch"].get("predicted")]
    print(f"timeouts or out of memory, apart: {len(limited)} ({len(predicted)} of them predicted, not run)")
    if floored:
        most = max(r["floor"] / spent(r["torch"]) for r in floored)
        print(
            f"the probe's floor under a slow call (measured apart, so other work on the machine stretches either), "
            f"of the {len(floored)} that took torch {FLOOR_SHOWN:g} s or more: at most {most:.2f} of torch's time"
        )
    for title, rows in (
        ("verdicts", verdicts),
        ("first lines", lines),
        ("nondeterministic", nondet),
        ("timeouts or out of memory", [r for r in limited if not r["torch"].get("predicted")]),
    ):
        if rows:
            print(f"\n-- {title}")
            for r in rows[:200]:
                print(
                    f"{r['group']} sample {r['sample']} {r['call']} {r['mode']}:\n"
                    f"    torch:   {r['torch']['verdict']} {r['torch']['first_line'][:160]}\n"
                    f"    opcheck: {r['opcheck']['verdict']} {r['opcheck']['first_line'][:160]}"
                )
    if predicted:
        print(
            f"\n-- slow-mode calls not run: a probe put torch's loop over {PREDICT_FACTOR}x the time limit,"
            " or their twin with contiguous grad_outputs ran past a limit"
        )
        by_group = defaultdict(list)
        for r in predicted:
            by_group[r["group"]].append(r)
        for group, rows in sorted(by_group.items()):
            print(f"  {group}: {len(rows)} calls on samples {sorted({r['sample'] for r in rows})}")
    slower = sorted(
        (
            (per_op_o[k] / max(per_op_t[k], 1e-9), k)
            for k in per_op_o
            if per_op_o[k] > slow_factor * per_op_t[k] and worst_call[k] > 0.05
        ),
        reverse=True,
    )
    if slower:
        print(f"\n-- ops where opcheck takes more than {slow_factor:g}x torch's time (and > 50 ms more in one call)")
        for x, k in slower[:40]:
            print(f"  {k}: {per_op_o[k]:.2f} s vs {per_op_t[k]:.2f} s ({x:.1f}x)")
    calls_slower.sort(key=lambda p: -p[0])
    if calls_slower:
        print("\n-- the calls opcheck takes longest over torch's time on")
        for extra, r in calls_slower[:10]:
            print(
                f"  {r['group']} sample {r['sample']} {r['call']} {r['mode']}: +{extra:.2f} s "
                f"({spent(r['opcheck']):.2f} s vs {spent(r['torch']):.2f} s)"
            )
    longer = sorted(((cpu_o[k] - cpu_t[k], k) for k in cpu_o if cpu_o[k] > cpu_t[k]), reverse=True)
    print(
        f"\n-- ops opcheck takes longer on than torch in sum, of the {len(cpu_o)} with CPU-timed calls: {len(longer)}"
    )
    for extra, k in longer[:10]:
        print(f"  {k}: +{extra:.3f} s ({cpu_o[k]:.3f} s vs {cpu_t[k]:.3f} s over {cpu_calls[k]} calls)")
    return 0 if not verdicts and not lines else 1


def compare(paths) -> int:
    """opcheck with batching (the paired records) against opcheck without (the --no-batching
    records, torch's side null) in these files: the calls whose verdict or first line differs."""
    ra, rb = {}, {}
    for path in paths:
        for rec in lines_of(path):
            if "call" in rec:
                (rb if of_no_batching_run(rec) else ra)[call_key(rec)] = rec
    both = sorted(set(ra) & set(rb))
    limited = [k for k in both if {ra[k]["opcheck"]["verdict"], rb[k]["opcheck"]["verdict"]} & set(LIMITED)]
    apart = set(limited)
    common = [k for k in both if k not in apart]
    differ = [k for k in common if ra[k]["opcheck"]["verdict"] != rb[k]["opcheck"]["verdict"]]
    differing = set(differ)
    lines = [
        k for k in common if k not in differing and ra[k]["opcheck"]["first_line"] != rb[k]["opcheck"]["first_line"]
    ]
    supported = {k for k in both if k[2] not in UNSUPPORTED}
    for unsupported, of in ((False, supported), (True, set(both) - supported)):
        if not of and (unsupported or len(supported) < len(both)):
            continue
        print(
            ("  and " if unsupported and supported else "")
            + f"{sum(k in of for k in common)} calls in both runs"
            + (f" of the kinds an op declares unsupported ({', '.join(UNSUPPORTED)})" if unsupported else "")
            + f"; opcheck's verdict differs on {sum(k in of for k in differ)}, its first line on "
            f"{sum(k in of for k in lines)} more; {sum(k in of for k in limited)} timeouts or out of memory apart"
        )
    for k in differ[:200] + lines[:200]:
        print(
            f"  {k}: {ra[k]['opcheck']['verdict']} {ra[k]['opcheck']['first_line'][:100]!r} vs "
            f"{rb[k]['opcheck']['verdict']} {rb[k]['opcheck']['first_line'][:100]!r}"
        )
    return 1 if differ or lines or not common else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="opdb.jsonl", help="JSON lines file to append to (resumes)")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th (op, dtype) group from the i-th")
    p.add_argument("--ops", nargs="*", help="only these OpInfo names (name or name:variant)")
    p.add_argument(
        "--calls", nargs="+", choices=KINDS, metavar="KIND", help=f"only these call kinds: {', '.join(KINDS)}"
    )
    p.add_argument("--dtypes", nargs="*", choices=[str(d).replace("torch.", "") for d in DTYPES], help="only these")
    p.add_argument("--limit", type=int, default=None, help="samples per (op, dtype) (default: all)")
    p.add_argument(
        "--limit-seconds",
        type=float,
        default=300.0,
        help=f"CPU seconds per call (and {WALL_LIMIT_FACTOR}x in wall seconds); slower calls are timeouts",
    )
    p.add_argument(
        "--limit-memory",
        type=float,
        default=10.0,
        help="GiB one call may allocate beyond the process's start (0: no limit); more is OutOfMemory",
    )
    p.add_argument(
        "--no-batching", action="store_true", help="opcheck alone, without vmapped evaluation (for --compare)"
    )
    p.add_argument(
        "--skip-recorded",
        nargs="+",
        metavar="FILE",
        help="the groups and calls these earlier runs' files recorded are not made again (.gz read as is)",
    )
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--report", nargs="+", metavar="FILE", help="summarize these files instead of running")
    p.add_argument("--slow-factor", type=float, default=2.0, help="report ops slower than this x torch")
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="FILE",
        help="opcheck's verdicts in these files' paired records against their --no-batching ones",
    )
    args = p.parse_args(argv)
    for path in (args.report or []) + (args.compare or []) + (args.skip_recorded or []):
        if not os.path.isfile(path):
            p.error(f"{path}: no such file")
    if args.report:
        with no_collection():
            return report(args.report, args.slow_factor)
    if args.compare:
        with no_collection():
            return compare(args.compare)
    return run_groups(args)


if __name__ == "__main__":
    sys.exit(main())
