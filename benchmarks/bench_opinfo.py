#!/usr/bin/env python
"""Side-by-side benchmark: opcheck.gradcheck vs torch.autograd.gradcheck on OpInfo samples.

Both tools run in ONE process on the same samples of torch's own OpInfo database
(``torch.testing._internal.common_methods_invocations.op_db``), with the gradcheck
function and arguments built exactly the way torch's test helper
``TestGradients._check_helper`` (torch/testing/_internal/common_utils.py) builds them,
and with the flags torch's own gradient tests pass to ``gradcheck``: one reverse-mode call
(``test_ops_gradients.test_fn_grad``) and one forward-mode call
(``test_ops_fwd_gradients.test_forward_mode_AD``) per sample.

Modes (each timed side by side, per sample):

* ``full``: opcheck ``fast_mode=False`` vs torch ``fast_mode=False`` (torch's slow mode,
  the full numerical Jacobian);
* ``fast``: opcheck ``fast_mode=True`` vs torch ``fast_mode=True``;
* ``auto`` (``--mode auto`` or ``all``): opcheck's default policy, the engine's
  ``fast_mode="auto"`` with its default budget (the full check up to 128 input and output
  elements, entrywise projections beyond, decided by the full check up to 2**20 Jacobian entries
  when they do not pass), vs torch's fast mode: the price of full strength. Its verdicts
  are compared with torch's slow mode (from the ``full`` mode of the same run, or else from an
  extra torch slow call per sample, timed apart): "false alarms" (auto fails where torch slow
  passes) and "misses" (auto passes where torch slow fails) are the disagreements of this mode;
  a verdict that differs from torch's fast mode only is reported, not counted;
* ``fixed`` (``--mode fixed``, ``ceiling`` = full and fixed, or ``all``): full mode with both tools'
  Jacobian comparison replaced by a no-op. What remains (the batched-grad, zero and undefined
  grad_output checks, the first call) is the same work in both tools, so opcheck's fixed time
  bounds the full-mode ratio: torch full / opcheck fixed.

The samples are built on ``--device`` (default cpu; OpInfo's own ``sample_inputs(device, ...)``).
The clock waits for the device before it is read, and on a device with memory statistics each
sample's checks by each tool have their peak device memory recorded (torch.cuda.max_memory_allocated,
reset before them): per op in the table, the largest in the summary, beside the process's peak
host RSS (on the CPU the device memory reads n/a).

Every check's verdict (``True``, ``"GradcheckError"`` or the class name of any other
exception) is recorded; any sample on which the two tools disagree is printed in detail at
the end and makes the script exit with status 1.

Run ``python benchmarks/bench_opinfo.py --help`` for the options; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import shlex
import sys
import time
import warnings
from itertools import chain

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _device import (  # noqa: E402
    add_device_option,
    clock,
    describe,
    fmt_mb,
    host_peak_rss_mb,
    parse_device,
    peak_memory_mb,
    reset_peak_memory,
)
from _results import write_json  # noqa: E402

# ---------------------------------------------------------------------------------------
# The op list.  Entries are (category, OpInfo name, OpInfo variant_test_name).  Fixed on
# purpose, so numbers are comparable from run to run; chosen for diversity of the code
# paths a gradcheck has to handle (many tiny samples vs a few large ones, broadcasting,
# integer/bool side inputs, tensor lists, multiple and complex outputs, ops with
# nondifferentiable outputs, ...).  Every op here supports autograd and float64 on CPU.
#
# Left out of the default list on purpose:
#   * ops whose forward is random (nn.functional.dropout*, nn.functional.rrelu,
#     bernoulli, ...): a verdict could then depend on how many times and in which order a
#     tool calls the function, i.e. be flaky, rather than on the tool.
#     nn.functional.multi_head_attention_forward is one of them; it also fails torch's own
#     gradcheck here (GradcheckError: random op inside vmap in the batched-grad check;
#     torch's test suite skips it), so it is no speed benchmark.
#     (Fast-mode probe vectors are not a source of flakiness: torch draws them from a
#     private torch.Generator() with its fixed default seed, so its verdicts reproduce.)
#   * the HEAVY_OPS below, which alone would take minutes in torch's slow mode; run them
#     with --heavy (or name them in --ops).
# ---------------------------------------------------------------------------------------
OPS: list[tuple[str, str, str]] = [
    # unary pointwise
    ("unary", "sin", ""),
    ("unary", "exp", ""),
    ("unary", "tanh", ""),
    ("unary", "abs", ""),
    ("unary", "sqrt", ""),
    ("unary", "erf", ""),
    ("unary", "digamma", ""),
    ("unary", "clamp", ""),
    ("unary", "nn.functional.relu", ""),
    # binary / ternary, broadcasting
    ("binary", "add", ""),
    ("binary", "mul", ""),
    ("binary", "div", "no_rounding_mode"),
    ("binary", "pow", ""),
    ("binary", "atan2", ""),
    ("binary", "maximum", ""),
    ("binary", "where", ""),
    ("binary", "addcmul", ""),
    ("binary", "lerp", ""),
    # reductions
    ("reduction", "sum", ""),
    ("reduction", "mean", ""),
    ("reduction", "prod", ""),
    ("reduction", "amax", ""),
    ("reduction", "std", ""),
    ("reduction", "logsumexp", ""),
    ("reduction", "norm", ""),
    ("reduction", "median", ""),
    # linear algebra
    ("linalg", "matmul", ""),
    ("linalg", "addmm", ""),
    ("linalg", "bmm", ""),
    ("linalg", "einsum", ""),
    ("linalg", "linalg.det", ""),
    ("linalg", "linalg.inv", ""),
    ("linalg", "linalg.solve", ""),
    ("linalg", "linalg.cholesky", ""),
    ("linalg", "triangular_solve", ""),
    ("linalg", "linalg.vector_norm", ""),
    ("linalg", "linalg.matrix_norm", ""),
    ("linalg", "cdist", ""),
    # torch.nn.functional
    ("nn", "softmax", ""),
    ("nn", "log_softmax", ""),
    ("nn", "nn.functional.conv1d", ""),
    ("nn", "nn.functional.conv2d", ""),
    ("nn", "nn.functional.linear", ""),
    ("nn", "nn.functional.layer_norm", ""),
    ("nn", "nn.functional.group_norm", ""),
    ("nn", "nn.functional.batch_norm", ""),
    ("nn", "nn.functional.gelu", ""),
    ("nn", "nn.functional.mse_loss", ""),
    ("nn", "nn.functional.cross_entropy", ""),
    ("nn", "nn.functional.nll_loss", ""),
    ("nn", "nn.functional.binary_cross_entropy", ""),
    ("nn", "nn.functional.avg_pool2d", ""),
    ("nn", "nn.functional.max_pool1d", ""),
    ("nn", "nn.functional.pad", "constant"),
    ("nn", "nn.functional.interpolate", "bilinear"),
    ("nn", "nn.functional.embedding", ""),
    ("nn", "nn.functional.normalize", ""),
    ("nn", "nn.functional.cosine_similarity", ""),
    # indexing / gather / scatter
    ("indexing", "gather", ""),
    ("indexing", "scatter", ""),
    ("indexing", "scatter_add", ""),
    ("indexing", "scatter_reduce", "amax"),
    ("indexing", "index_select", ""),
    ("indexing", "index_add", ""),
    ("indexing", "index_put", ""),
    ("indexing", "take_along_dim", ""),
    ("indexing", "masked_fill", ""),
    ("indexing", "masked_select", ""),
    ("indexing", "__getitem__", ""),
    ("indexing", "put", ""),
    # shape / view ops
    ("shape", "reshape", ""),
    ("shape", "permute", ""),
    ("shape", "transpose", ""),
    ("shape", "cat", ""),
    ("shape", "stack", ""),
    ("shape", "flip", ""),
    ("shape", "roll", ""),
    ("shape", "repeat", ""),
    ("shape", "expand", ""),
    ("shape", "narrow", ""),
    ("shape", "tril", ""),
    ("shape", "diagonal", ""),
    ("shape", "movedim", ""),
    # cumulative
    ("cumulative", "cumsum", ""),
    ("cumulative", "cumprod", ""),
    ("cumulative", "logcumsumexp", ""),
    ("cumulative", "cummax", ""),
    # multiple outputs (tuples, tensor lists, nondifferentiable index outputs)
    ("multi-output", "topk", ""),
    ("multi-output", "max", "reduction_with_dim"),
    ("multi-output", "aminmax", ""),
    ("multi-output", "var_mean", ""),
    ("multi-output", "kthvalue", ""),
    ("multi-output", "split", ""),
    ("multi-output", "unbind", ""),
    ("multi-output", "linalg.slogdet", ""),
    ("multi-output", "linalg.qr", ""),
    ("multi-output", "linalg.eigh", ""),
    ("multi-output", "linalg.svd", ""),
    # complex-supporting ops with complex outputs from real inputs (complex code paths
    # in float64 runs; use --dtype complex128 for complex inputs)
    ("complex", "complex", ""),
    ("complex", "polar", ""),
    ("complex", "angle", ""),
    ("complex", "fft.fft", ""),
    ("complex", "fft.rfft", ""),
    ("complex", "linalg.eig", ""),
]

# Expensive in torch's slow mode (1 thread, torch 2.13, 2-core x86 box): sort has one
# 8000-element sample (an 8000x8000 Jacobian, ~40 s), nn.functional.max_pool2d has 1440
# samples (~25 s), nn.functional.scaled_dot_product_attention ~30 s,
# nn.functional.unfold ~5 s, unfold ~3 s.  Left out so the default run (which includes
# torch's slow mode) stays under ~2 minutes; added with --heavy (or name them in --ops).
HEAVY_OPS: list[tuple[str, str, str]] = [
    ("multi-output", "sort", ""),
    ("nn", "nn.functional.max_pool2d", ""),
    ("nn", "nn.functional.scaled_dot_product_attention", ""),
    ("nn", "nn.functional.unfold", ""),
    ("shape", "unfold", ""),
]

MODES = ("full", "fast")
TOOLS = ("torch", "opcheck")
SAMPLE_SEED = 0
CPU = torch.device("cpu")


SIZE_BUCKETS = [(0, 8), (8, 64), (64, 256), (256, math.inf)]


def op_key(name: str, variant: str) -> str:
    return f"{name}:{variant}" if variant else name


# ---------------------------------------------------------------------------------------
# gradcheck function / arguments, as in torch's TestGradients._check_helper
# ---------------------------------------------------------------------------------------
def _is_iterable_of_tensors(x) -> bool:
    from torch.testing._internal.common_utils import is_iterable_of_tensors

    return is_iterable_of_tensors(x)


def build_check(op, sample):
    """Return (fn, gradcheck_args) for one SampleInput, exactly like _check_helper."""
    if _is_iterable_of_tensors(sample.input):
        all_args = chain(sample.input, sample.args, sample.kwargs.values())
    else:
        all_args = tuple(chain((sample.input,), sample.args, sample.kwargs.values()))
    gradcheck_args = tuple(x for x in all_args if isinstance(x, torch.Tensor) and x.requires_grad)

    def _input_recomposition_helper(inputs, inp, input_idx):
        if _is_iterable_of_tensors(inp):
            tensor_list = []
            for x in inp:
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    tensor_list.append(inputs[input_idx])
                    input_idx = input_idx + 1
                else:
                    tensor_list.append(x)
            return tensor_list, input_idx
        elif isinstance(inp, torch.Tensor) and inp.requires_grad:
            return inputs[input_idx], input_idx + 1
        else:
            return inp, input_idx

    variant = op.get_op()

    def fn(*inputs):
        positional_args = []
        input_idx = 0
        inp, input_idx = _input_recomposition_helper(inputs, sample.input, input_idx)
        positional_args.append(inp)
        for x in sample.args:
            inp, input_idx = _input_recomposition_helper(inputs, x, input_idx)
            positional_args.append(inp)
        kwargs = {}
        for k, v in sample.kwargs.items():
            inp, input_idx = _input_recomposition_helper(inputs, v, input_idx)
            kwargs[k] = inp
        output = op.gradcheck_wrapper(variant, *positional_args, **kwargs)
        if sample.output_process_fn_grad is not None:
            return sample.output_process_fn_grad(output)
        return output

    return fn, gradcheck_args


def gradcheck_calls(op, fast_mode: bool) -> list[tuple[str, dict]]:
    """The gradcheck calls torch's own gradient tests make per sample, with their flags.

    test_ops_gradients.test_fn_grad checks reverse mode; test_ops_fwd_gradients.test_forward_mode_AD
    checks forward mode in a separate call (fast_mode is the benchmark's).
    """
    calls = []
    if op.supports_autograd:
        calls.append(
            (
                "test_fn_grad",
                dict(
                    check_batched_grad=op.check_batched_grad,
                    check_grad_dtypes=True,
                    nondet_tol=op.gradcheck_nondet_tol,
                    check_undefined_grad=True,
                    check_forward_ad=False,
                    check_backward_ad=True,
                    check_batched_forward_grad=False,
                    fast_mode=fast_mode,
                ),
            )
        )
    if op.supports_forward_ad:
        calls.append(
            (
                "test_forward_mode_AD",
                dict(
                    check_batched_grad=False,
                    check_grad_dtypes=True,
                    nondet_tol=op.gradcheck_nondet_tol,
                    check_undefined_grad=True,
                    check_forward_ad=True,
                    check_backward_ad=False,
                    check_batched_forward_grad=op.check_batched_forward_grad,
                    fast_mode=fast_mode,
                ),
            )
        )
    return calls


def make_samples(op, dtype, limit, device="cpu"):
    """Freshly built samples on `device` (same seed, so same values and strides every call).

    Every (tool, mode) pair gets its own build, so the two tools never share a tensor,
    its .grad or its version counter.
    """
    torch.manual_seed(SAMPLE_SEED)
    include_conjugated_inputs = op.test_conjugated_samples and dtype.is_complex
    it = op.sample_inputs(str(device), dtype, requires_grad=True, include_conjugated_inputs=include_conjugated_inputs)
    out = []
    for s in it:
        if limit is not None and len(out) >= limit:
            break
        out.append(s)
    return out


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """t.clone().detach().requires_grad_(), keeping t's exact layout.

    A plain clone() would make OpInfo's non-contiguous samples (strided views such as
    make_tensor(noncontiguous=True) returns) contiguous and resolve conjugate views, which
    changes the sample; so the values are copied into a fresh buffer viewed with t's
    sizes, strides, storage offset and conj bit.
    """
    src = t.detach()
    conj = src.is_conj()
    if conj:
        src = src.conj()  # the physical values; the conj bit is re-applied below
    if src.layout != torch.strided or src.is_neg():
        out = src.clone()
    else:
        n = src.untyped_storage().nbytes() // src.element_size()
        out = torch.empty(n, dtype=src.dtype, device=src.device).as_strided(
            src.shape, src.stride(), src.storage_offset()
        )
        out.copy_(src)
    if conj:
        out = out.conj()
    return out.requires_grad_(t.requires_grad)


def fresh_args(args):
    # Each tool already gets its own fresh sample build; this extra copy (see _fresh) makes
    # sure nothing is shared, e.g. a tensor reused by several SampleInputs.
    return tuple(_fresh(a) for a in args)


def same_tensors(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if (
            x.shape != y.shape
            or x.dtype != y.dtype
            or x.stride() != y.stride()
            or x.is_conj() != y.is_conj()
            or x.requires_grad != y.requires_grad
        ):
            return False
        x, y = x.detach(), y.detach()
        if not torch.equal(x, y) and not bool(((x == y) | (x.isnan() & y.isnan())).all()):
            return False
    return True


def describe_sample(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            s = "x".join(map(str, x.shape)) or "scalar"
            return (
                f"T[{s}{',' + str(x.dtype).replace('torch.', '') if x.dtype != torch.float64 else ''}"
                f"{',grad' if x.requires_grad else ''}{',noncontig' if not x.is_contiguous() else ''}"
                f"{',conj' if x.is_conj() else ''}]"
            )
        if _is_iterable_of_tensors(x):
            return "[" + ", ".join(d(t) for t in x) + "]"
        r = repr(x)
        return r if len(r) <= 40 else r[:37] + "..."

    parts = [d(sample.input)] + [d(a) for a in sample.args] + [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    return "(" + ", ".join(parts) + ")"


# ---------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------
def run_one(check, fn, args, calls, device=CPU):
    """Run each of torch's test calls on fresh copies of args.

    -> (seconds, verdict, message, peak device MB of the calls or None). verdict: True, or
    "test: GradcheckError" / "test: <exception class>" for the first call that did not pass.
    """
    from torch.autograd.gradcheck import GradcheckError

    total, verdict, msg = 0.0, True, ""
    reset_peak_memory(device)
    for test, kwargs in calls:
        fresh = fresh_args(args)
        # The cyclic GC is off while a check runs (a collection that happens to fall inside one
        # tool's call would be charged to it); garbage is collected between calls, untimed.
        gc.collect()
        gc.disable()
        t0 = clock(device)
        try:
            r = check(fn, fresh, **kwargs)
            v, m = (True, "") if r is True else (repr(r), "")
        except GradcheckError as e:  # opcheck.GradcheckError subclasses torch's
            v, m = "GradcheckError", str(e)
        except Exception as e:  # noqa: BLE001 - any exception is a verdict here
            v, m = type(e).__name__, str(e)
        total += clock(device) - t0
        gc.enable()
        if v is not True and verdict is True:
            verdict, msg = f"{test}: {v}", m
    return total, verdict, msg, peak_memory_mb(device)


def without_jacobian_comparison(check):
    """`check` with the full Jacobian comparison (numerical vs analytical, reentrancy, the
    no-differentiable-output check) replaced by a no-op, in opcheck and in torch alike: what remains
    is the cost of the other checks, which no way of computing Jacobians can remove."""
    import opcheck.engine.api as opcheck_api

    torch_gradcheck_module = sys.modules["torch.autograd.gradcheck"]

    def run(func, inputs, **kwargs):
        saved = opcheck_api.full_check, torch_gradcheck_module._slow_gradcheck
        opcheck_api.full_check = torch_gradcheck_module._slow_gradcheck = lambda *a, **k: True
        try:
            return check(func, inputs, **kwargs)
        finally:
            opcheck_api.full_check, torch_gradcheck_module._slow_gradcheck = saved

    return run


def auto_vs_slow(auto, slow) -> str:
    """Classify opcheck auto's verdict against torch's slow mode (the full-strength reference)."""
    if auto is True and slow is True:
        return "agree"
    if slow is True:
        return "false alarm"
    if auto is True:
        return "miss"
    return "both fail" if auto == slow else "different failure"


def short(msg: str, n: int = 600) -> str:
    msg = msg.strip()
    return msg if len(msg) <= n else msg[:n] + " [...]"


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def geomean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--mode",
        choices=("full", "fast", "auto", "fixed", "ceiling", "both", "all"),
        default="both",
        help="both = full and fast; ceiling = full and fixed; all = full, fast, auto (opcheck's auto policy vs torch's "
        "fast mode) and fixed (full mode with both tools' Jacobian comparison replaced by a "
        "no-op: the cost of everything else, which bounds the full-mode ratio)",
    )
    p.add_argument(
        "--ops",
        default=None,
        help="comma-separated OpInfo names (NAME or NAME:VARIANT_TEST_NAME) to run "
        "instead of the default list; any op in op_db may be named",
    )
    p.add_argument(
        "--heavy",
        action="store_true",
        help="also run the heavy ops (" + ", ".join(op_key(n, v) for _, n, v in HEAVY_OPS) + ")",
    )
    p.add_argument(
        "--max-samples", type=int, default=None, metavar="N", help="at most the first N samples per op (default: all)"
    )
    p.add_argument("--dtype", choices=("float64", "complex128"), default="float64")
    add_device_option(p)
    p.add_argument("--json", default=None, metavar="PATH", help="dump raw per-sample results to PATH")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="ENTRIES",
        help="--mode auto: the engine's jacobian_budget (default: its own, 2**20); 0 runs the "
        "projection checks on every sample and lets their verdict stand",
    )
    p.add_argument("--list-ops", action="store_true", help="print the default op list and exit")
    p.add_argument(
        "--self-test",
        action="store_true",
        help="harness check: the 'opcheck' column calls torch.autograd.gradcheck too, so "
        "ratios must be ~1.0 and there must be zero disagreements",
    )
    args = p.parse_args(argv)

    if args.list_ops:
        for cat, n, v in OPS:
            print(f"{cat:13s} {op_key(n, v)}")
        for cat, n, v in HEAVY_OPS:
            print(f"{cat:13s} {op_key(n, v)}  (heavy: --heavy)")
        return 0

    t_start = time.perf_counter()
    device = parse_device(args.device)
    torch.set_num_threads(args.threads)
    # Warnings (deprecations, "input is not double precision", ...) are ignored for both
    # tools alike: printing them is not what is being measured.
    warnings.simplefilter("ignore")
    dtype = getattr(torch, args.dtype)
    modes = {"both": MODES, "ceiling": ("full", "fixed"), "all": MODES + ("auto", "fixed")}.get(args.mode, (args.mode,))

    cmd = shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    print(f"command: {cmd}")
    import opcheck

    print(
        f"torch {torch.__version__} | opcheck {getattr(opcheck, '__version__', '?')} "
        f"({os.path.dirname(opcheck.__file__)}) | python {platform.python_version()} | "
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()} | "
        f"device {describe(device)}"
    )

    if args.self_test:
        print("SELF-TEST: the 'opcheck' column runs torch.autograd.gradcheck (harness validation)")

        def opcheck_gradcheck(func, inputs, **kwargs):
            return torch.autograd.gradcheck(func, inputs, **kwargs)
    else:
        opcheck_gradcheck = opcheck.gradcheck

    auto_paths: list[str] = []  # stats.auto_paths of the latest opcheck auto call

    def opcheck_auto(func, inputs, **kwargs):
        """The engine's fast_mode="auto" with its default jacobian_budget (what a generated test
        runs by default). gradcheck_report is opcheck.gradcheck plus its stats (which path each
        comparison took); a failure is re-raised as the GradcheckError gradcheck would raise."""
        kwargs["fast_mode"] = "auto"
        if args.budget is not None:
            kwargs["jacobian_budget"] = args.budget
        if args.self_test:  # torch has no auto mode: its fast mode stands in
            kwargs.pop("jacobian_budget", None)
            kwargs["fast_mode"] = True
            return opcheck_gradcheck(func, inputs, **kwargs)
        r = opcheck.gradcheck_report(func, inputs, **kwargs)
        auto_paths.extend(r.stats.auto_paths)
        if not r.passed:
            raise r.error
        return True

    t0 = time.perf_counter()
    from torch.testing._internal.common_methods_invocations import op_db

    print(
        f"op_db: {len(op_db)} OpInfos (import {time.perf_counter() - t0:.1f}s) | dtype {args.dtype} | "
        f"modes {', '.join(modes)} | samples per op: "
        + (f"first {args.max_samples} (capped by --max-samples)" if args.max_samples else "all (no cap)")
    )

    # op_db is ~10^6 long-lived objects: move them (and everything else alive now) out of
    # the collector's reach, so the gc.collect() between timed calls stays cheap.
    gc.collect()
    gc.freeze()

    by_key = {}
    for op in op_db:
        by_key.setdefault(op_key(op.name, op.variant_test_name), op)

    if args.ops:
        wanted = [s.strip() for s in args.ops.split(",") if s.strip()]
        entries = []
        known = {op_key(n, v): c for c, n, v in OPS + HEAVY_OPS}
        for w in wanted:
            name, _, variant = w.partition(":")
            entries.append((known.get(w, "-"), name, variant))
    else:
        entries = list(OPS) + (list(HEAVY_OPS) if args.heavy else [])

    skipped = []  # (key, reason)
    selected = []
    for cat, name, variant in entries:
        key = op_key(name, variant)
        op = by_key.get(key)
        if op is None:
            variants = sorted(k for k in by_key if k.split(":")[0] == name)
            skipped.append((key, "not found in op_db" + (f" (variants: {', '.join(variants)})" if variants else "")))
            continue
        if not op.supports_autograd:
            skipped.append((key, "does not support autograd"))
            continue
        if dtype not in op.supported_backward_dtypes(device.type):
            skipped.append((key, f"no {device.type} autograd support for {args.dtype}"))
            continue
        selected.append((cat, key, op))
    if not args.ops and not args.heavy:
        print("heavy ops not run (add --heavy): " + ", ".join(op_key(n, v) for _, n, v in HEAVY_OPS))
    for key, why in skipped:
        print(f"SKIPPED {key}: {why}")
    print(f"{len(selected)} ops selected\n")

    # table header
    w = max([len(k) for _, k, _ in selected] + [20])
    hdr = f"{'op':{w}s} {'n':>4s}"
    for m in modes:
        hdr += f" | {m + ' torch':>11s} {'opcheck':>9s} {'ratio':>6s}"
    device_memory = peak_memory_mb(device) is not None  # a device with memory statistics
    if device_memory:  # the largest peak of one sample's checks, over the op's samples and modes
        hdr += f" | {'dev MB torch':>12s} {'opcheck':>7s}"
    print(hdr + " | notes")
    print("-" * (len(hdr) + 8))

    records = []  # per-sample raw results
    per_op = []  # per-op totals
    disagreements = []
    # torch slow-mode verdicts, the reference for auto mode: (op key, sample) -> (secs, verdict, msg, peak MB)
    slow_ref: dict[tuple[str, int], tuple] = {}
    slow_source = "the full mode of this run" if "full" in modes else "a torch slow call per sample (timed apart)"
    for op_index, (cat, key, op) in enumerate(selected):
        # alternate which tool runs first per op
        order = TOOLS if op_index % 2 == 0 else TOOLS[::-1]
        checks_by_mode = {
            "full": {"torch": torch.autograd.gradcheck, "opcheck": opcheck_gradcheck},
            "fast": {"torch": torch.autograd.gradcheck, "opcheck": opcheck_gradcheck},
            "auto": {"torch": torch.autograd.gradcheck, "opcheck": opcheck_auto},
            "fixed": {
                "torch": without_jacobian_comparison(torch.autograd.gradcheck),
                "opcheck": without_jacobian_comparison(opcheck_gradcheck),
            },
        }
        note = []
        try:
            ref = make_samples(op, dtype, args.max_samples, device)
        except Exception as e:  # noqa: BLE001
            skipped.append((key, f"sample_inputs failed: {type(e).__name__}: {short(str(e), 200)}"))
            print(f"{key:{w}s}  SKIPPED: sample_inputs failed ({type(e).__name__})")
            continue
        n = len(ref)
        if n == 0:
            skipped.append((key, "no samples"))
            print(f"{key:{w}s}  SKIPPED: no samples")
            continue
        ref_args = [build_check(op, s)[1] for s in ref]
        descs = [describe_sample(s) for s in ref]
        numels = [sum(a.numel() for a in ga) for ga in ref_args]

        totals = {(m, t): 0.0 for m in modes for t in TOOLS}
        peaks: dict[str, float] = {}  # tool -> largest peak device MB of one sample's checks
        verdict_counts = {}
        auto_counts = {}  # auto vs torch slow: "false alarm" / "miss" / "different failure" -> count
        for mode in modes:
            checks = checks_by_mode[mode]
            kw = gradcheck_calls(op, fast_mode=(mode not in ("full", "fixed")))
            # Warm-up, untimed: the smallest sample (by input numel) through both tools, so
            # lazy initialisation (kernels, dispatch caches, vmap rules) biases neither side.
            warm_idx = min(range(n), key=lambda i: sum(a.numel() for a in ref_args[i]))
            for tool in order:
                s = make_samples(op, dtype, warm_idx + 1, device)[warm_idx]
                fn, ga = build_check(op, s)
                run_one(checks[tool], fn, ga, kw, device)

            built = {t: make_samples(op, dtype, args.max_samples, device) for t in TOOLS}
            slow_kw = gradcheck_calls(op, fast_mode=False)
            need_slow = mode == "auto" and "full" not in modes
            if need_slow:
                built["torch slow"] = make_samples(op, dtype, args.max_samples, device)
            for t in built:
                if len(built[t]) != n or not all(
                    same_tensors(build_check(op, s)[1], a) for s, a in zip(built[t], ref_args)
                ):
                    note.append(f"{mode}/{t}: rebuilt samples differ, using clones")
                    built[t] = None
            for i in range(n):
                res = {}
                for tool in order:
                    if built[tool] is not None:
                        fn, ga = build_check(op, built[tool][i])
                    else:  # fall back to clones of the reference sample
                        fn, ga = build_check(op, ref[i])
                    auto_paths.clear()
                    res[tool] = run_one(checks[tool], fn, ga, kw, device)
                    totals[(mode, tool)] += res[tool][0]
                    if res[tool][3] is not None:
                        peaks[tool] = max(peaks.get(tool, 0.0), res[tool][3])
                    if mode == "auto" and tool == "opcheck":
                        paths = list(auto_paths)
                if mode == "full":
                    slow_ref[(key, i)] = res["torch"]
                if need_slow:
                    s_ = built["torch slow"]
                    fn, ga = build_check(op, s_[i] if s_ is not None else ref[i])
                    slow_ref[(key, i)] = run_one(torch.autograd.gradcheck, fn, ga, slow_kw, device)
                rec = {
                    "op": key,
                    "category": cat,
                    "mode": mode,
                    "sample": i,
                    "desc": descs[i],
                    "numel": numels[i],
                    "torch_s": res["torch"][0],
                    "opcheck_s": res["opcheck"][0],
                    "torch_verdict": res["torch"][1],
                    "opcheck_verdict": res["opcheck"][1],
                    "first": order[0],
                }
                if device_memory:
                    rec.update(torch_peak_device_mb=res["torch"][3], opcheck_peak_device_mb=res["opcheck"][3])
                if res["torch"][1] is not True:
                    rec["torch_msg"] = short(res["torch"][2], 2000)
                if res["opcheck"][1] is not True:
                    rec["opcheck_msg"] = short(res["opcheck"][2], 2000)
                if mode == "auto":
                    ss, sv, sm, _ = slow_ref[(key, i)]
                    rec.update(
                        torch_slow_s=ss,
                        torch_slow_verdict=sv,
                        auto_paths=paths,
                        vs_torch_slow=auto_vs_slow(res["opcheck"][1], sv),
                        differs_from_torch_fast=res["opcheck"][1] != res["torch"][1],
                    )
                    if sv is not True:
                        rec["torch_slow_msg"] = short(sm, 2000)
                        verdict_counts[(mode, "torch slow", sv)] = verdict_counts.get((mode, "torch slow", sv), 0) + 1
                    if rec["vs_torch_slow"] not in ("agree", "both fail"):
                        auto_counts[rec["vs_torch_slow"]] = auto_counts.get(rec["vs_torch_slow"], 0) + 1
                records.append(rec)
                for t in TOOLS:
                    if res[t][1] is not True:
                        verdict_counts[(mode, t, res[t][1])] = verdict_counts.get((mode, t, res[t][1]), 0) + 1
                if (
                    rec["vs_torch_slow"] not in ("agree", "both fail")
                    if mode == "auto"
                    else res["torch"][1] != res["opcheck"][1]
                ):
                    disagreements.append(rec)

        row = f"{key:{w}s} {n:4d}"
        for m in modes:
            tt, to = totals[(m, "torch")], totals[(m, "opcheck")]
            row += f" | {tt:11.3f} {to:9.3f} {ratio(tt, to):6.2f}"
        if device_memory:
            row += f" | {fmt_mb(peaks.get('torch'), 12)} {fmt_mb(peaks.get('opcheck'), 7)}"
        dis = sum(1 for d in disagreements if d["op"] == key)
        if dis:
            note.append(f"{dis} DISAGREEMENT(S)")
        for kind, c in sorted(auto_counts.items()):
            note.append(f"auto vs torch slow: {c} {kind.upper()}(S)")
        for (m, t, v), c in sorted(verdict_counts.items(), key=str):
            note.append(f"{m}/{t}: {c}x {v}")
        print(row + " | " + "; ".join(note), flush=True)
        per_op.append(
            {"op": key, "category": cat, "samples": n, **{f"{m}_{t}_s": totals[(m, t)] for m in modes for t in TOOLS}}
        )
        if device_memory:
            per_op[-1].update({f"{t}_peak_device_mb": peaks.get(t) for t in TOOLS})

    # ---- summary --------------------------------------------------------------------
    print()
    n_ops = len(per_op)
    n_samples = sum(r["samples"] for r in per_op)
    summary = {"ops": n_ops, "samples_per_mode": n_samples, "disagreements": len(disagreements)}
    print(
        f"== summary: {n_ops} ops, {n_samples} samples per mode, dtype {args.dtype}, "
        f"torch threads {torch.get_num_threads()}"
        + (f", at most {args.max_samples} samples per op" if args.max_samples else ", all samples")
    )
    for m in modes:
        st = sum(r[f"{m}_torch_s"] for r in per_op)
        so = sum(r[f"{m}_opcheck_s"] for r in per_op)
        gm = geomean([ratio(r[f"{m}_torch_s"], r[f"{m}_opcheck_s"]) for r in per_op])
        nd = sum(1 for d in disagreements if d["mode"] == m)
        what = {
            "full": "fast_mode=False (torch slow mode)",
            "fast": "fast_mode=True",
            "auto": "opcheck fast_mode='auto' (default budget) vs torch fast_mode=True",
            "fixed": "fast_mode=False, Jacobian comparison replaced by a no-op in both tools",
        }[m]
        print(
            f"[{m}] {what}: torch {st:.2f}s, opcheck {so:.2f}s | aggregate ratio torch/opcheck "
            f"{ratio(st, so):.2f}x | geomean per-op ratio {gm:.2f}x | ops {n_ops}, samples {n_samples}, "
            f"disagreements {nd}"
        )
        summary[m] = {
            "torch_s": st,
            "opcheck_s": so,
            "aggregate_ratio": ratio(st, so),
            "geomean_ratio": gm,
            "disagreements": nd,
        }
        if m == "auto":
            print(
                f"[auto] cost of opcheck's default policy against torch's fast mode: opcheck / torch = "
                f"{ratio(so, st):.2f}x (geomean per op {1 / gm if gm else math.inf:.2f}x)"
            )
            ar = [r for r in records if r["mode"] == "auto"]
            kinds = {
                k: sum(1 for r in ar if r["vs_torch_slow"] == k)
                for k in ("agree", "both fail", "false alarm", "miss", "different failure")
            }
            ts = sum(r["torch_slow_s"] for r in ar)
            fast_diff = sum(1 for r in ar if r["differs_from_torch_fast"])
            path_counts = {}
            for r in ar:
                for pth in r["auto_paths"]:
                    pth = "projected" if pth.startswith("projected") else pth
                    path_counts[pth] = path_counts.get(pth, 0) + 1
            print(
                f"[auto] verdicts against torch slow mode (from {slow_source}; torch slow {ts:.2f}s): "
                f"{len(ar)} samples, {kinds['agree']} agree ({kinds['both fail']} of them both fail), "
                f"false alarms {kinds['false alarm']}, misses {kinds['miss']}, different failures "
                f"{kinds['different failure']} | differs from torch fast on {fast_diff} sample(s) | auto paths: "
                + (", ".join(f"{k} {v}" for k, v in sorted(path_counts.items())) or "-")
            )
            summary[m].update(
                false_alarms=kinds["false alarm"],
                misses=kinds["miss"],
                different_failures=kinds["different failure"],
                torch_slow_s=ts,
                torch_slow_source=slow_source,
                differs_from_torch_fast=fast_diff,
                opcheck_over_torch_fast=ratio(so, st),
                auto_paths=path_counts,
            )
    for m in modes:
        # Where the time goes: samples grouped by how many input elements gradcheck perturbs.
        parts = []
        for lo, hi in SIZE_BUCKETS:
            rs = [r for r in records if r["mode"] == m and lo <= r["numel"] < hi]
            if rs:
                st, so = sum(r["torch_s"] for r in rs), sum(r["opcheck_s"] for r in rs)
                label = f"{lo}-{hi - 1}" if hi != math.inf else f">={lo}"
                parts.append(f"{label}: {len(rs)} samples, torch {st:.2f}s / opcheck {so:.2f}s = {ratio(st, so):.2f}x")
                summary.setdefault(f"{m}_by_numel", {})[label] = {"samples": len(rs), "torch_s": st, "opcheck_s": so}
        print(f"[{m}] by input numel: " + "; ".join(parts))
    if "full" in modes and "fast" in modes:
        of = sum(r["full_opcheck_s"] for r in per_op)
        tf = sum(r["fast_torch_s"] for r in per_op)
        gm = geomean([ratio(r["full_opcheck_s"], r["fast_torch_s"]) for r in per_op])
        print(
            f"[cost of full strength] opcheck full / torch fast: {of:.2f}s / {tf:.2f}s = {ratio(of, tf):.2f}x "
            f"(geomean per-op {gm:.2f}x; < 1 means opcheck's full Jacobian check is cheaper than "
            f"torch's fast mode)"
        )
        summary["opcheck_full_over_torch_fast"] = {"aggregate": ratio(of, tf), "geomean": gm}
    if "full" in modes and "fixed" in modes:
        tf = sum(r["full_torch_s"] for r in per_op)
        ox = sum(r["fixed_opcheck_s"] for r in per_op)
        print(
            f"[ceiling] the checks besides the Jacobian comparison (batched grad, zero and undefined "
            f"grad_output, the first call; the same checks as torch's) take opcheck {ox:.2f}s, so even a free "
            f"Jacobian comparison gives at most torch full / opcheck fixed = {tf:.2f}s / {ox:.2f}s = "
            f"{ratio(tf, ox):.2f}x in full mode"
        )
        summary["full_ratio_ceiling"] = ratio(tf, ox)
    device_peaks = {
        t: max((r[f"{t}_peak_device_mb"] or 0.0 for r in per_op), default=None) if device_memory else None
        for t in TOOLS
    }
    rss = host_peak_rss_mb()
    print(
        f"[memory] peak host RSS of this process {rss:.0f} MB | peak device memory of one sample's checks "
        f"({device}): " + ", ".join(f"{t} {fmt_mb(v, unit=True)}" for t, v in device_peaks.items())
    )
    summary["memory"] = {"host_peak_rss_mb": rss, "device": str(device), "device_peak_mb": device_peaks}
    if skipped:
        print(f"skipped ops ({len(skipped)}): " + "; ".join(f"{k} ({why})" for k, why in skipped))
    wall = time.perf_counter() - t_start
    print(f"wall time {wall:.1f}s")
    summary["wall_s"] = wall

    if args.json:
        write_json(
            args.json,
            cmd,
            torch.get_num_threads(),
            opcheck=getattr(opcheck, "__version__", None),
            dtype=args.dtype,
            device=str(device),
            modes=list(modes),
            max_samples=args.max_samples,
            skipped=[{"op": k, "reason": r} for k, r in skipped],
            per_op=per_op,
            summary=summary,
            samples=records,
        )

    if disagreements:
        print(f"\n== {len(disagreements)} DISAGREEMENT(S) between torch.autograd.gradcheck and opcheck.gradcheck:")
        for d in disagreements:
            print(f"\n-- {d['op']} [{d['mode']}] sample #{d['sample']} {d['desc']}")
            print(f"   torch:   {d['torch_verdict']}")
            if d.get("torch_msg"):
                print("            " + short(d["torch_msg"]).replace("\n", "\n            "))
            print(f"   opcheck: {d['opcheck_verdict']}")
            if d.get("opcheck_msg"):
                print("            " + short(d["opcheck_msg"]).replace("\n", "\n            "))
            if d["mode"] == "auto":
                print(
                    f"   auto vs torch slow: {d['vs_torch_slow'].upper()}; torch slow: {d['torch_slow_verdict']}"
                    f"; auto paths: {', '.join(d['auto_paths']) or '-'}"
                )
                if d.get("torch_slow_msg"):
                    print("            " + short(d["torch_slow_msg"]).replace("\n", "\n            "))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
