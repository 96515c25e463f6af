#!/usr/bin/env python
"""opcheck's default policy against torch's fast mode, the way a generated test suite pays for it.

``opcheck.gradcheck(fn, args, fast_mode="auto", **flags)`` (opcheck's default) against
``torch.autograd.gradcheck(fn, args, fast_mode=True, **flags)``, with the flags of torch's own
gradient tests (``gradcheck_calls`` of bench_opinfo.py: test_fn_grad, and test_forward_mode_AD where
the op supports forward AD). bench_opinfo.py measures the steady state: it warms every op up through
both tools before timing it. A test suite does not: each test checks one sample once, with a
function object of its own, and the first test of a process pays whatever the tool sets up the
first time it runs. So here

* each sample is checked once per tool, with a fresh function object and fresh tensors
  (``build_check`` on a build of the samples of its own per tool, and ``fresh_args`` per call), after
  ``torch.manual_seed(0)`` (random ops see the same values in both tools);
* no op is warmed up, and the process's first call is counted. A worker process imports torch and
  op_db (untimed, shared) and makes one untimed autograd warm-up that neither tool owns, the set-up
  any autograd user pays once: a backward of ``x.sin().sum()`` (the first backward's lazy set-up)
  and one forward-AD dual tensor (whose first use loads torch's jvp decompositions, about 0.25 s,
  which whichever tool made the first forward-AD call would otherwise pay for both). It does not
  import opcheck before the timed loop: the first call of opcheck imports it, inside that call's
  timed region (``OpcheckAuto``), so that call's time includes ``import opcheck`` and everything
  opcheck sets up on first use, as a test suite's first test does (the record says
  ``first_call: true``, and ``import_s`` the import's share). The first sample runs opcheck first,
  so opcheck's first call is the process's first check; after that the tool that runs first
  alternates from sample to sample. The table's "first calls" are the two tools' times on that
  first sample;
* ``time.perf_counter()`` around each gradcheck call, the cyclic GC disabled during the call and
  run between calls, as bench_opinfo's ``run_one`` does; torch on ``--threads`` threads (default 1).

Four sets of samples, each in a fresh worker process (``--worker``):

* ``ops104``: bench_opinfo's default list of 104 ops, float64, all their samples (``--max-samples``);
* ``opdb``: every op of op_db with autograd (every variant), in each of float64 and complex128 that
  its backward supports on the CPU, the first sample of each;
* ``random``: ``--count`` (op, dtype) pairs of ``opdb`` drawn with ``random.Random(--seed)``, and for
  each a sample drawn uniformly among that op's samples in that dtype (labelled ``random:SEED``).
* ``tiny``: where the default check's fixed cost is the cost: ``--count`` float64 ops of ``opdb``
  drawn with ``random.Random(--seed)`` among those with tiny samples (gradcheck inputs of at most
  TINY_ELEMENTS elements together), each with its first TINY_SAMPLES tiny samples: elementwise,
  reduction, indexing and shape ops on a few elements, as most of torch's own OpInfo samples are.

``--flags defaults`` makes one call per sample with gradcheck's default flags instead of torch's
tests' calls: ``gradcheck(fn, inputs)`` as a user writes it (no batched gradients, no forward AD),
where the fixed cost of each tool's own checks weighs most.

``--warm`` runs each sample through both tools once, untimed, before the timed calls: both engines
warm, the op's kernels loaded, so the ratio is the steady state of a long test session; without it,
each op's first sample pays what each tool sets up the first time it meets that op.

``--full`` also times opcheck's full mode (the same calls with ``fast_mode=False``, on a build of its
own) right after torch's slow-mode reference, wherever that reference ran, and prints per set
opcheck full / torch slow (aggregate and geomean per op). Full mode is a drop-in for torch's slow
mode: a sample where the two verdicts differ is listed, and makes the exit status 1. With
``--warm`` both run once, untimed, first.

Verdicts: a sample's verdict is that of the first call that does not pass (``True``,
``"GradcheckError"`` or the exception's class name, prefixed with torch's test name), as in
bench_opinfo. The reference is torch's slow mode: per sample, the same calls with
``torch.autograd.gradcheck(..., fast_mode=False)`` on a build of their own, timed apart (not in the
ratio). A false alarm is opcheck failing where torch's slow mode passes; a miss, opcheck passing
where it fails. Both make the exit status 1; the times never do. When either happens, torch's slow
mode runs again on a new build: where it disagrees with itself the sample is counted as
nondeterministic instead. The slow reference is not run where its Jacobian would be large (the
perturbed input elements times the output elements of one forward call over SLOW_MAX_ENTRIES), nor
past ``--limit-seconds`` of CPU time: those samples are "no ref". Every call runs under that CPU
time limit (a call past it has the verdict ``Timeout``), and the worker under ``--limit-memory``.

Last, the first call in a fresh process (``--first-call``, part of the default run): ``--repeat``
fresh subprocesses per tool, interleaved (torch, opcheck, torch, ...), each importing torch
(untimed) and timing its first check of ``torch.sin`` on a 5x4 float64 input, with no warm-up at
all, so each tool pays the first backward's set-up in its own call, and opcheck its import (which
loads the package's shell: the engine's modules load in the first call, and are timed with it); the
medians and their difference (target: opcheck within 50 ms of torch).

    python benchmarks/bench_auto_sets.py                      # all of the above (about 3 minutes, 2 cores)
    python benchmarks/bench_auto_sets.py --set random --seed 3 --count 200
    python benchmarks/bench_auto_sets.py --set ops104 --ops sin,matmul --json /tmp/sets.json
    python benchmarks/bench_auto_sets.py --set tiny --count 50 --warm
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict

import torch
import torch.autograd.forward_ad as fwAD

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Neither module imports opcheck: the worker's first opcheck call must be the one that does.
from _results import write_json  # noqa: E402
from bench_opdb import CallTimeout, groups, limit_memory, time_limit  # noqa: E402
from bench_opinfo import (  # noqa: E402
    OPS,
    auto_vs_slow,
    build_check,
    describe_sample,
    fresh_args,
    geomean,
    gradcheck_calls,
    make_samples,
    op_key,
    ratio,
    short,
)

SETS = ("ops104", "opdb", "random", "tiny")
DTYPES = (torch.float64, torch.complex128)
TOOLS = ("torch", "opcheck")

TINY_ELEMENTS = 20
"""tiny set: a sample is tiny when its gradcheck inputs hold at most this many elements together."""
TINY_SAMPLES = 10
"""tiny set: at most this many tiny samples of one op (its first ones)."""

SLOW_MAX_ENTRIES = 2**22
"""torch's slow mode is the reference only where (perturbed input elements) x (output elements)
is at most this: beyond, its full Jacobian takes seconds to minutes a sample."""

EXCLUDED: dict[str, str] = {}
"""op_db ops (op keys) left out of the opdb and random sets, with the reason: none so far, every op
runs to a verdict (or to the time limit) in a worker."""

FIRST_CALL_TARGET_MS = 50.0

FIRST_CALL_CODE = """\
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
torch.manual_seed(0)
x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
t0 = time.perf_counter()
if sys.argv[1] == "opcheck":
    import opcheck
    t1 = time.perf_counter()
    ok = opcheck.gradcheck(torch.sin, (x,), fast_mode="auto")
else:
    t1 = t0
    ok = torch.autograd.gradcheck(torch.sin, (x,), fast_mode=True)
t2 = time.perf_counter()
print(json.dumps({"tool": sys.argv[1], "ms": (t2 - t0) * 1e3, "import_ms": (t1 - t0) * 1e3, "passed": ok is True}))
"""
"""One fresh process's first check of torch.sin on 5x4 (argv: tool, threads); torch's import untimed."""


# ---------------------------------------------------------------------------------------
# worker: one set of samples, in a process of its own
# ---------------------------------------------------------------------------------------
class OpcheckAuto:
    """``opcheck.gradcheck(..., fast_mode="auto")``, with opcheck imported by its first call.

    The import sits inside the caller's timed region, so the process's first opcheck call is charged
    for it, as a test suite's first test is; ``import_s`` keeps its share.
    """

    def __init__(self):
        self.import_s: float | None = None

    def __call__(self, fn, inputs, **kwargs):
        if self.import_s is None:
            t0 = time.perf_counter()
            import opcheck

            self.import_s = time.perf_counter() - t0
        import opcheck

        return opcheck.gradcheck(fn, inputs, **kwargs)


def run_calls(check, fn, args, calls, limit: float) -> tuple[float, object, str]:
    """Each of torch's test calls once, on fresh copies of args -> (seconds, verdict, message).

    verdict: True, or "test: GradcheckError" / "test: <exception class>" / "test: Timeout" for the
    first call that did not pass. Every call runs after torch.manual_seed(0), with the cyclic GC off
    (a collection inside one tool's call would be charged to it; garbage is collected between calls).
    """
    from torch.autograd.gradcheck import GradcheckError

    total, verdict, msg = 0.0, True, ""
    for test, kwargs in calls:
        fresh = fresh_args(args)
        gc.collect()
        torch.manual_seed(0)
        gc.disable()
        t0 = time.perf_counter()
        try:
            with time_limit(limit):
                t0 = time.perf_counter()
                try:
                    r = check(fn, fresh, **kwargs)
                    v, m = (True, "") if r is True else (repr(r), "")
                except CallTimeout:
                    raise
                except GradcheckError as e:  # opcheck.GradcheckError subclasses torch's
                    v, m = "GradcheckError", str(e)
                except Exception as e:  # noqa: BLE001 - any exception is a verdict here
                    v, m = type(e).__name__, str(e)
                dt = time.perf_counter() - t0
        except CallTimeout as e:
            dt, v, m = time.perf_counter() - t0, "Timeout", str(e)
        gc.enable()
        total += dt
        if v is not True and verdict is True:
            verdict, msg = f"{test}: {v}", m
    return total, verdict, msg


def jacobian_entries(fn, args, limit: float) -> int | None:
    """(perturbed input elements) x (output elements of one forward call): the size of the Jacobian
    torch's slow mode computes in full. None where the forward call raises or runs past the limit
    (the slow call then says what is wrong)."""
    try:
        with time_limit(limit), torch.no_grad():
            out = fn(*fresh_args(args))
    except Exception:  # noqa: BLE001 - CallTimeout included
        return None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    m = sum(o.numel() for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))
    return sum(a.numel() for a in args) * m


def select(set_name: str, ops_filter: set[str] | None, args) -> tuple[list[tuple], list[tuple[str, str]]]:
    """The set's samples: [(op, key, dtype, sample indices, samples to build)], and the skipped
    [(op or pair, reason)]."""
    from torch.testing._internal.common_methods_invocations import op_db

    def wanted(op) -> bool:
        key = op_key(op.name, op.variant_test_name)
        return not ops_filter or key in ops_filter or op.name in ops_filter

    skipped = []
    if set_name == "ops104":
        by_key = {}
        for op in op_db:
            by_key.setdefault(op_key(op.name, op.variant_test_name), op)
        items = []
        for _, name, variant in OPS:
            key = op_key(name, variant)
            op = by_key.get(key)
            if op is None:
                skipped.append((key, "not in op_db"))
            elif wanted(op):
                if torch.float64 not in op.supported_backward_dtypes("cpu") or not gradcheck_calls(op, True):
                    skipped.append((key, "no float64 autograd on the cpu"))
                    continue
                n = len(make_samples(op, torch.float64, args.max_samples))
                items.append((op, key, torch.float64, list(range(n)), args.max_samples))
        return items, skipped

    pairs = []
    for op, dtype in groups(ops_filter, DTYPES, kinds=("grad", "fwd")):
        key = op_key(op.name, op.variant_test_name)
        if key in EXCLUDED:
            skipped.append((f"{key}|{dtype_name(dtype)}", f"excluded: {EXCLUDED[key]}"))
        elif gradcheck_calls(op, True):
            pairs.append((op, key, dtype))
    if set_name == "opdb":
        return [(op, key, dtype, [0], 1) for op, key, dtype in pairs], skipped
    if set_name == "tiny":
        return tiny_items([p for p in pairs if p[2] == torch.float64], args, skipped), skipped
    rng = random.Random(args.seed)
    items = []
    for op, key, dtype in rng.sample(pairs, min(args.count, len(pairs))):
        try:
            n = len(make_samples(op, dtype, None))
        except Exception as e:  # noqa: BLE001 - an op_db entry that cannot make samples here
            skipped.append((f"{key}|{dtype_name(dtype)}", f"sample_inputs failed: {type(e).__name__}"))
            continue
        if n == 0:
            skipped.append((f"{key}|{dtype_name(dtype)}", "no samples"))
            continue
        i = rng.randrange(n)
        items.append((op, key, dtype, [i], i + 1))
    return items, skipped


def set_calls(op, fast_mode: bool, flags: str) -> list[tuple[str, dict]]:
    """The gradcheck calls of one sample: torch's own gradient tests' (``--flags tests``), or one
    call with gradcheck's defaults (``--flags defaults``: ``gradcheck(fn, inputs)`` as a user calls
    it, no batched gradients, no forward AD)."""
    if flags == "defaults":
        return [("gradcheck", {"fast_mode": fast_mode})] if op.supports_autograd else []
    return gradcheck_calls(op, fast_mode)


def tiny_items(pairs, args, skipped) -> list[tuple]:
    """tiny set: ``--count`` float64 ops drawn with ``random.Random(--seed)`` among those with tiny
    samples, each with its first TINY_SAMPLES tiny samples."""
    rng = random.Random(args.seed)
    rng.shuffle(pairs)
    items = []
    for op, key, dtype in pairs:
        if len(items) == args.count:
            break
        try:
            samples = make_samples(op, dtype, None)
        except Exception as e:  # noqa: BLE001 - an op_db entry that cannot make samples here
            skipped.append((f"{key}|{dtype_name(dtype)}", f"sample_inputs failed: {type(e).__name__}"))
            continue
        tiny = []
        for i, sample in enumerate(samples):
            try:
                _, ga = build_check(op, sample)
            except Exception:  # noqa: BLE001 - the harness cannot build this one: not in the set
                continue
            if 0 < sum(a.numel() for a in ga) <= TINY_ELEMENTS:
                tiny.append(i)
            if len(tiny) == TINY_SAMPLES:
                break
        if tiny:
            items.append((op, key, dtype, tiny, tiny[-1] + 1))
    return items


def describe(sample) -> str:
    """bench_opinfo's describe_sample, or shapes and layouts where it cannot read a tensor (is_contiguous
    of a sparse compressed tensor raises)."""
    try:
        return describe_sample(sample)
    except Exception:  # noqa: BLE001
        ts = [sample.input, *sample.args, *sample.kwargs.values()]
        return (
            "("
            + ", ".join(
                f"T[{'x'.join(map(str, t.shape))},{str(t.layout).replace('torch.', '')}]"
                if isinstance(t, torch.Tensor)
                else type(t).__name__
                for t in ts
            )
            + ")"
        )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def worker(args) -> dict:
    """Run one set in this (fresh) process and return its records."""
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    if args.limit_memory and os.path.exists("/proc/self/statm"):
        limit_memory(args.limit_memory)
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: F401 - imported untimed

    # The one shared warm-up, what any autograd user pays once and neither tool owns: the process's
    # first backward sets autograd up, and its first forward-AD dual tensor loads torch's jvp
    # decompositions (torch._decomp.decompositions_for_jvp, about 0.25 s of TorchScript here),
    # which the first forward-AD call of either tool would otherwise pay for both.
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    torch.autograd.grad(x.sin().sum(), x)
    with fwAD.dual_level():
        fwAD.unpack_dual(fwAD.make_dual(x.detach(), torch.ones_like(x)).sin())
    preloaded = "opcheck" in sys.modules
    gc.collect()
    gc.freeze()  # op_db's objects: the collections between calls need not walk them

    set_name = args.set[0]
    label = f"random:{args.seed}" if set_name == "random" else set_name
    ops_filter = set(args.ops) if args.ops else None
    items, skipped = select(set_name, ops_filter, args)
    total = sum(len(idx) for *_, idx, _ in items)
    opcheck_auto = OpcheckAuto()
    checks = {"torch": torch.autograd.gradcheck, "opcheck": opcheck_auto}
    records = []
    k = 0
    for op, key, dtype, indices, limit in items:
        calls = {
            "torch": set_calls(op, True, args.flags),
            "opcheck": [(t, {**kw, "fast_mode": "auto"}) for t, kw in set_calls(op, True, args.flags)],
        }
        slow_calls = set_calls(op, False, args.flags)
        try:
            # each tool's own build (and the slow reference's): no tensor is shared between them
            built = {t: make_samples(op, dtype, limit) for t in (*TOOLS, "slow", *(("full",) if args.full else ()))}
        except Exception as e:  # noqa: BLE001 - an op_db entry that cannot make samples here
            skipped.append((f"{key}|{dtype_name(dtype)}", f"sample_inputs failed: {type(e).__name__}"))
            continue
        for i in indices:
            order = ("opcheck", "torch") if k % 2 == 0 else ("torch", "opcheck")
            try:
                rec = check_sample(op, key, dtype, limit, i, built, order, checks, calls, slow_calls, args)
            except Exception as e:  # noqa: BLE001 - the harness's own failure on an odd sample: say so, go on
                rec = None
                skipped.append(
                    (f"{key}|{dtype_name(dtype)} #{i}", f"harness error: {type(e).__name__}: {short(str(e), 200)}")
                )
            k += 1
            if rec is not None:
                rec = {"set": label, **rec, "first_call": k == 1}
                if k == 1:
                    rec["import_s"] = opcheck_auto.import_s
                records.append(rec)
                if rec["vs_torch_slow"] not in ("agree", "both fail", "no reference"):
                    print(
                        f"[{label}] {key} {rec['dtype']} sample {i}: {rec['vs_torch_slow'].upper()} "
                        f"(opcheck {rec['opcheck_verdict']}, torch slow {rec.get('torch_slow_verdict')})",
                        file=sys.stderr,
                        flush=True,
                    )
            if args.verbose or k % 100 == 0 or k == total:
                print(
                    f"[{label}] {k}/{total} samples ({key} {dtype_name(dtype)}), {time.perf_counter() - t_start:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
    return {
        "set": label,
        "records": records,
        "skipped": [{"what": w, "reason": r} for w, r in skipped],
        "opcheck_imported_before_loop": preloaded,
        "wall_s": time.perf_counter() - t_start,
    }


def check_sample(op, key, dtype, limit, i, built, order, checks, calls, slow_calls, args) -> dict:
    """Sample i through both tools in this order, each on its own build, then torch's slow mode."""
    res = {}
    if args.warm:  # both tools once on the sample, untimed: the timed calls find everything set up
        for tool in order:
            fn, ga = build_check(op, built[tool][i])
            run_calls(checks[tool], fn, ga, calls[tool], args.limit_seconds)
    for tool in order:
        fn, ga = build_check(op, built[tool][i])
        res[tool] = run_calls(checks[tool], fn, ga, calls[tool], args.limit_seconds)
    fn, ga = build_check(op, built["slow"][i])
    rec = {
        "op": key,
        "dtype": dtype_name(dtype),
        "sample": i,
        "desc": describe(built["slow"][i]),
        "numel": sum(a.numel() for a in ga),
        "calls": [test for test, _ in calls["torch"]],
        "first": order[0],
        "torch_s": res["torch"][0],
        "opcheck_s": res["opcheck"][0],
        "torch_verdict": res["torch"][1],
        "opcheck_verdict": res["opcheck"][1],
        "differs_from_torch_fast": res["torch"][1] != res["opcheck"][1],
    }
    for t in TOOLS:
        if res[t][1] is not True:
            rec[f"{t}_msg"] = short(res[t][2], 2000)
    rec.update(reference(op, dtype, limit, i, fn, ga, slow_calls, res["opcheck"][1], args))
    if args.full and rec.get("slow_ref") == "ran":
        rec.update(full_mode(op, built["full"][i], checks["opcheck"], slow_calls, rec, args))
    return rec


def full_mode(op, sample, check, slow_calls, rec, args) -> dict:
    """opcheck's full mode on the sample (its own build), right after torch's slow mode: its time,
    its verdict, and whether that is torch's."""
    if args.warm:
        fn, ga = build_check(op, sample)
        run_calls(torch.autograd.gradcheck, fn, ga, slow_calls, args.limit_seconds)
        run_calls(check, fn, ga, slow_calls, args.limit_seconds)
    fn, ga = build_check(op, sample)
    seconds, verdict, msg = run_calls(check, fn, ga, slow_calls, args.limit_seconds)
    out = {"opcheck_full_s": seconds, "opcheck_full_verdict": verdict}
    if verdict != rec["torch_slow_verdict"]:
        out["opcheck_full_msg"] = short(msg, 2000)
    return out


def reference(op, dtype, limit, i, fn, ga, slow_calls, auto_verdict, args) -> dict:
    """torch's slow mode on the sample (its own build), timed apart, and opcheck's verdict against it."""
    if args.no_slow:
        return {"torch_slow_verdict": None, "slow_ref": "not run (--no-slow)", "vs_torch_slow": "no reference"}
    entries = jacobian_entries(fn, ga, args.limit_seconds)
    out: dict = {"jacobian_entries": entries}
    if isinstance(auto_verdict, str) and auto_verdict.endswith(": Timeout"):
        return {**out, "torch_slow_verdict": None, "slow_ref": "opcheck timed out", "vs_torch_slow": "timeout"}
    if entries is not None and entries > SLOW_MAX_ENTRIES:
        return {
            **out,
            "torch_slow_verdict": None,
            "slow_ref": f"too large ({entries} > {SLOW_MAX_ENTRIES} entries)",
            "vs_torch_slow": "no reference",
        }
    ss, sv, sm = run_calls(torch.autograd.gradcheck, fn, ga, slow_calls, args.limit_seconds)
    out.update(torch_slow_s=ss, torch_slow_verdict=sv)
    if sv is not True:
        out["torch_slow_msg"] = short(sm, 2000)
    if isinstance(sv, str) and sv.endswith(": Timeout"):
        return {**out, "torch_slow_verdict": None, "slow_ref": "timed out", "vs_torch_slow": "no reference"}
    out["slow_ref"] = "ran"
    kind = auto_vs_slow(auto_verdict, sv)
    if kind in ("false alarm", "miss"):
        # torch's slow mode again, on a new build: does it agree with itself?
        fn2, ga2 = build_check(op, make_samples(op, dtype, limit)[i])
        again = run_calls(torch.autograd.gradcheck, fn2, ga2, slow_calls, args.limit_seconds)[1]
        if again != sv:
            out["torch_slow_again_verdict"] = again
            kind = "nondeterministic"
    out["vs_torch_slow"] = kind
    return out


# ---------------------------------------------------------------------------------------
# parent: the first-call measurement, the workers, the table
# ---------------------------------------------------------------------------------------
@functools.cache
def child_env() -> dict[str, str]:
    """The environment of the measured processes: with bytecode caches, as an installed package has.

    A package installed by pip has its modules compiled at install time; run from a checkout with
    PYTHONDONTWRITEBYTECODE set (as some CI machines do), every import would compile opcheck's source
    again and charge that to its first call. So opcheck's modules are compiled once here, and the
    children may read and write caches.
    """
    import compileall

    import opcheck

    compileall.compile_dir(os.path.dirname(opcheck.__file__), quiet=2)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def first_call(repeat: int, threads: int) -> dict:
    """`repeat` fresh processes per tool, interleaved, each timing its first check of torch.sin 5x4."""
    runs: dict[str, list[dict]] = {t: [] for t in TOOLS}
    for _ in range(repeat):
        for tool in TOOLS:
            proc = subprocess.run(
                [sys.executable, "-c", FIRST_CALL_CODE, tool, str(threads)],
                capture_output=True,
                text=True,
                env=child_env(),
            )
            if proc.returncode != 0:
                raise SystemExit(f"first-call measurement ({tool}) failed:\n{proc.stderr[-3000:]}")
            runs[tool].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    med = {t: statistics.median(r["ms"] for r in runs[t]) for t in TOOLS}
    return {
        "repeat": repeat,
        "torch_ms": med["torch"],
        "opcheck_ms": med["opcheck"],
        "difference_ms": med["opcheck"] - med["torch"],
        "opcheck_import_ms": statistics.median(r["import_ms"] for r in runs["opcheck"]),
        "target_ms": FIRST_CALL_TARGET_MS,
        "within_target": med["opcheck"] - med["torch"] <= FIRST_CALL_TARGET_MS,
        "passed": all(r["passed"] for t in TOOLS for r in runs[t]),
        "runs": runs,
    }


def run_worker(set_name: str, args) -> dict:
    """The set in a fresh worker process; its JSON comes back through a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "worker.json")
        argv = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--set",
            set_name,
            "--worker-out",
            path,
            "--seed",
            str(args.seed),
            "--count",
            str(args.count),
            "--threads",
            str(args.threads),
            "--limit-seconds",
            str(args.limit_seconds),
            "--limit-memory",
            str(args.limit_memory),
        ]
        if args.max_samples is not None:
            argv += ["--max-samples", str(args.max_samples)]
        if args.ops:
            argv += ["--ops", ",".join(args.ops)]
        if args.no_slow:
            argv.append("--no-slow")
        if args.verbose:
            argv.append("--verbose")
        if args.warm:
            argv.append("--warm")
        if args.full:
            argv.append("--full")
        argv += ["--flags", args.flags]
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=child_env())
        if proc.returncode != 0 or not os.path.exists(path):
            raise SystemExit(
                f"worker for set {set_name} failed (exit status {proc.returncode}):\n{proc.stdout[-3000:]}"
            )
        with open(path) as f:
            return json.load(f)


KINDS = (
    "agree",
    "both fail",
    "false alarm",
    "miss",
    "different failure",
    "nondeterministic",
    "timeout",
    "no reference",
)


def summarize(result: dict) -> dict:
    recs = result["records"]
    st = sum(r["torch_s"] for r in recs)
    so = sum(r["opcheck_s"] for r in recs)
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in recs:
        per_op[r["op"]][0] += r["torch_s"]
        per_op[r["op"]][1] += r["opcheck_s"]
    excess = sorted(((o - t, op, t, o) for op, (t, o) in per_op.items()), reverse=True)
    first = next((r for r in recs if r["first_call"]), None)
    counts = {k: sum(1 for r in recs if r["vs_torch_slow"] == k) for k in KINDS}
    full = [r for r in recs if "opcheck_full_s" in r]
    full_per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in full:
        full_per_op[r["op"]][0] += r["torch_slow_s"]
        full_per_op[r["op"]][1] += r["opcheck_full_s"]
    full_torch_s = sum(r["torch_slow_s"] for r in full)
    full_opcheck_s = sum(r["opcheck_full_s"] for r in full)
    tiny = [r for r in recs if 0 < r["numel"] <= TINY_ELEMENTS]  # all of the tiny set's; some of the others'
    tiny_torch_s, tiny_opcheck_s = sum(r["torch_s"] for r in tiny), sum(r["opcheck_s"] for r in tiny)
    return {
        "ops": len(per_op),
        "samples": len(recs),
        "torch_s": st,
        "opcheck_s": so,
        "aggregate_ratio": ratio(so, st),
        "geomean_ratio": geomean([ratio(o, t) for t, o in per_op.values()]),
        "first_call_torch_ms": first["torch_s"] * 1e3 if first else None,
        "first_call_opcheck_ms": first["opcheck_s"] * 1e3 if first else None,
        "first_call_import_ms": first["import_s"] * 1e3 if first and first.get("import_s") is not None else None,
        "false_alarms": counts["false alarm"],
        "misses": counts["miss"],
        "no_reference": counts["no reference"],
        "verdicts": counts,
        "differs_from_torch_fast": sum(1 for r in recs if r["differs_from_torch_fast"]),
        "torch_slow_s": sum(r.get("torch_slow_s", 0.0) for r in recs),
        "full_samples": len(full),
        "full_torch_slow_s": full_torch_s,
        "full_opcheck_s": full_opcheck_s,
        "full_ratio": ratio(full_opcheck_s, full_torch_s) if full else None,
        "full_geomean_ratio": geomean([ratio(o, t) for t, o in full_per_op.values()]) if full else None,
        "full_verdicts_differ": sum(1 for r in full if r["opcheck_full_verdict"] != r["torch_slow_verdict"]),
        "tiny_samples": len(tiny),
        "tiny_torch_s": tiny_torch_s,
        "tiny_opcheck_s": tiny_opcheck_s,
        "tiny_ratio": ratio(tiny_opcheck_s, tiny_torch_s) if tiny else None,
        "excess_s": sum(e for e, *_ in excess if e > 0),
        "ops_with_excess": sum(1 for e, *_ in excess if e > 0),
        "top_excess": [{"op": op, "excess_s": e, "torch_s": t, "opcheck_s": o} for e, op, t, o in excess[:10]],
        "skipped": result["skipped"],
        "opcheck_imported_before_loop": result["opcheck_imported_before_loop"],
        "wall_s": result["wall_s"],
    }


def print_table(summaries: dict[str, dict], fc: dict | None) -> None:
    hdr = (
        f"{'set':10s} {'ops':>4s}  {'samples':>7s}  {'torch fast s':>12s}  {'opcheck auto s':>14s}  "
        f"{'auto/torch':>10s}  {'first calls (torch, opcheck ms)':>31s}  {'false alarms':>12s}  "
        f"{'misses':>6s}  {'no ref':>6s}"
    )
    print(hdr)
    for label, s in summaries.items():
        firsts = (
            f"{s['first_call_torch_ms']:.1f}, {s['first_call_opcheck_ms']:.1f}"
            if s["first_call_torch_ms"] is not None
            else "-"
        )
        print(
            f"{label:10s} {s['ops']:4d}  {s['samples']:7d}  {s['torch_s']:12.2f}  {s['opcheck_s']:14.2f}  "
            f"{s['aggregate_ratio']:10.2f}  {firsts:>31s}  {s['false_alarms']:12d}  {s['misses']:6d}  "
            f"{s['no_reference']:6d}"
        )
    for label, s in summaries.items():
        if s["tiny_samples"] and s["tiny_samples"] < s["samples"]:
            print(
                f"{label}: its {s['tiny_samples']} tiny samples (at most {TINY_ELEMENTS} input elements): "
                f"torch fast {s['tiny_torch_s']:.2f} s, opcheck auto {s['tiny_opcheck_s']:.2f} s, "
                f"auto/torch {s['tiny_ratio']:.2f}"
            )
    for label, s in summaries.items():
        if s["full_samples"]:
            print(
                f"{label}: full mode, opcheck fast_mode=False {s['full_opcheck_s']:.2f} s against torch's slow mode "
                f"{s['full_torch_slow_s']:.2f} s over {s['full_samples']} samples: opcheck/torch {s['full_ratio']:.2f} "
                f"(geomean per op {s['full_geomean_ratio']:.2f}); verdicts differ on {s['full_verdicts_differ']}"
            )
    if fc:
        print(
            f"first call in a fresh process (sin 5x4, median of {fc['repeat']}): torch {fc['torch_ms']:.1f} ms, "
            f"opcheck {fc['opcheck_ms']:.1f} ms, difference {fc['difference_ms']:+.1f} ms "
            f"(target <= {fc['target_ms']:g} ms{'' if fc['within_target'] else ': OVER'}; "
            f"opcheck's import {fc['opcheck_import_ms']:.1f} ms of it)"
        )


def print_details(summaries: dict[str, dict], records: list[dict]) -> None:
    for label, s in summaries.items():
        v = s["verdicts"]
        print(
            f"\n[{label}] wall {s['wall_s']:.1f}s, torch slow (apart) {s['torch_slow_s']:.1f}s | geomean per-op "
            f"opcheck/torch {s['geomean_ratio']:.2f} | vs torch slow: "
            + ", ".join(f"{k} {v[k]}" for k in KINDS)
            + f" | differs from torch fast on {s['differs_from_torch_fast']}"
            + (
                f" | first opcheck call {s['first_call_opcheck_ms']:.1f} ms, "
                f"of it import {s['first_call_import_ms']:.2f} ms"
                if s["first_call_import_ms"] is not None
                else ""
            )
        )
        if s["opcheck_imported_before_loop"]:
            print(f"[{label}] WARNING: opcheck was imported before the timed loop; its first call is not the import")
        print(
            f"[{label}] excess opcheck - torch: +{s['excess_s']:.2f}s over the {s['ops_with_excess']} ops "
            f"where opcheck takes longer (net {s['opcheck_s'] - s['torch_s']:+.2f}s); the largest:"
        )
        for e in s["top_excess"]:
            print(
                f"    {e['op']:45s} {e['excess_s']:+8.3f}s  (torch {e['torch_s']:.3f}s, opcheck {e['opcheck_s']:.3f}s)"
            )
        if s["skipped"]:
            print(f"[{label}] skipped: " + "; ".join(f"{x['what']} ({x['reason']})" for x in s["skipped"]))
        too_large = [
            r for r in records if r["set"] == label and r.get("slow_ref", "ran") not in ("ran", "not run (--no-slow)")
        ]
        if too_large:
            print(
                f"[{label}] no torch slow reference: "
                + "; ".join(f"{r['op']} {r['dtype']} #{r['sample']} ({r['slow_ref']})" for r in too_large[:40])
                + (" ..." if len(too_large) > 40 else "")
            )
    odd = [
        r
        for r in records
        if r["vs_torch_slow"] in ("false alarm", "miss", "different failure", "nondeterministic", "timeout")
    ]
    for r in records:
        if "opcheck_full_verdict" in r and r["opcheck_full_verdict"] != r["torch_slow_verdict"]:
            print(
                f"\n-- [{r['set']}] {r['op']} {r['dtype']} sample #{r['sample']} {r['desc']}: FULL MODE DIFFERS "
                f"(opcheck full {r['opcheck_full_verdict']}, torch slow {r['torch_slow_verdict']})"
            )
            if r.get("opcheck_full_msg"):
                print("      " + short(r["opcheck_full_msg"], 400).replace("\n", "\n      "))
    if odd:
        print(f"\n== {len(odd)} sample(s) where opcheck auto and torch's slow mode do not simply agree:")
        for r in odd:
            print(
                f"\n-- [{r['set']}] {r['op']} {r['dtype']} sample #{r['sample']} {r['desc']}: "
                f"{r['vs_torch_slow'].upper()}"
            )
            for who, v, m in (
                ("opcheck auto", r["opcheck_verdict"], r.get("opcheck_msg")),
                ("torch fast", r["torch_verdict"], r.get("torch_msg")),
                ("torch slow", r.get("torch_slow_verdict"), r.get("torch_slow_msg")),
            ):
                print(f"   {who}: {v}")
                if m:
                    print("      " + short(m, 400).replace("\n", "\n      "))
            if "torch_slow_again_verdict" in r:
                print(f"   torch slow, again: {r['torch_slow_again_verdict']}")


def parse_sets(values) -> list[str]:
    sets = []
    for v in values or []:
        for s in v.split(","):
            s = s.strip()
            if s and s not in SETS:
                raise SystemExit(f"--set {s}: not one of {', '.join(SETS)}")
            if s and s not in sets:
                sets.append(s)
    return sets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", action="append", help=f"{', '.join(SETS)} (repeatable, or a comma list; default: all)")
    p.add_argument("--seed", type=int, default=0, help="random set: the draw's seed (default 0)")
    p.add_argument("--count", type=int, default=80, help="random and tiny sets: (op, dtype) pairs drawn (default 80)")
    p.add_argument("--max-samples", type=int, default=None, metavar="N", help="ops104: at most N samples per op")
    p.add_argument("--ops", default=None, help="comma list of op keys (NAME or NAME:VARIANT): every set only these")
    p.add_argument("--json", default=None, metavar="PATH", help="write every record and the summary to PATH")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--no-slow", action="store_true", help="no torch slow reference (no false alarms or misses)")
    p.add_argument("--first-call", action="store_true", help="the first-call measurement (with --set: as well)")
    p.add_argument("--repeat", type=int, default=5, help="first-call measurement: processes per tool (default 5)")
    p.add_argument("--limit-seconds", type=float, default=120.0, help="CPU seconds per gradcheck call (default 120)")
    p.add_argument("--limit-memory", type=float, default=10.0, help="GiB a worker may map beyond its start (0: none)")
    p.add_argument("--verbose", action="store_true", help="a progress line per sample")
    p.add_argument("--warm", action="store_true", help="each sample through both tools once, untimed, first")
    p.add_argument("--full", action="store_true", help="opcheck's full mode beside torch's slow mode, timed too")
    p.add_argument(
        "--flags",
        choices=("tests", "defaults"),
        default="tests",
        help="tests: torch's gradient tests' calls (default); defaults: one call with gradcheck's defaults",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ops = [s.strip() for s in args.ops.split(",") if s.strip()] if args.ops else None
    sets = parse_sets(args.set)

    if args.worker:
        args.set = sets
        result = worker(args)
        with open(args.worker_out, "w") as f:
            json.dump(result, f, default=str)
        # No interpreter teardown: the triton bindings op_db imports print leak reports at exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    t_start = time.perf_counter()
    if not sets and not args.first_call:
        sets, args.first_call = list(SETS), True
    cmd = shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    print(f"command: {cmd}")
    from importlib.metadata import version

    print(
        f"torch {torch.__version__} | opcheck {version('opcheck')} | python {platform.python_version()} | "
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {args.threads}",
        flush=True,
    )
    fc = first_call(args.repeat, args.threads) if args.first_call else None
    results = [run_worker(s, args) for s in sets]
    summaries = {r["set"]: summarize(r) for r in results}
    records = [rec for r in results for rec in r["records"]]
    print()
    print_table(summaries, fc)
    print_details(summaries, records)
    wall = time.perf_counter() - t_start
    print(f"\nwall time {wall:.1f}s")
    false_alarms = sum(s["false_alarms"] for s in summaries.values())
    misses = sum(s["misses"] for s in summaries.values())
    full_differ = sum(s["full_verdicts_differ"] for s in summaries.values())
    if args.json:
        summary = {
            "sets": summaries,
            "first_call": fc,
            "false_alarms": false_alarms,
            "misses": misses,
            "full_verdicts_differ": full_differ,
            "wall_s": wall,
        }
        write_json(args.json, cmd, args.threads, summary=summary, records=records)
    return 1 if false_alarms or misses or full_differ else 0


if __name__ == "__main__":
    sys.exit(main())
