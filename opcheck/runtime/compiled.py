"""The compile check: one generated test = the op under torch.compile against eager, for one
(spec, device, dtype, sample), under each backend the spec's `compile.backends` lists.

Each backend compares (opcheck.engine.compiled) the sample as written, then the cases where
compile is known to go wrong, each on unless `compile.cases_off` says why not:

- aliased: the same tensor for the first two tensor inputs of one shape, dtype and requires_grad;
- noncontiguous: every tensor as a strided view (transposed, or every other element) of equal values;
- written: the inputs the op writes into, after the call, against eager's;
- dynamic: one function compiled with dynamic shapes, run on the sample and then on the next
  sample of another size (a recompile there is reported; a wrong result fails);
- partial_grad: only the first of several inputs requiring grad keeps requires_grad;
- backward_state: the Python numbers the backward reads and compile binds (found from dynamo's
  guards and a custom op's registered backward), changed before the forward and again before the
  backward; once, under aot_eager, since dynamo and AOTAutograd bind them whatever the backend.

A case a sample cannot make (one tensor input: nothing to alias) is left out and listed in the
test's report. The compiled function of each (backend, case) is kept across the tests of a spec
and takes the sample's arguments as inputs, so the samples of one spec reuse its graphs where
shapes allow (opcheck list --cost counts a compile per case). Graph breaks and recompiles show in
the report with dynamo's reasons; `fullgraph: true` makes a break a failure.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from opcheck.engine.compiled import CompiledFunction, CompileReport, backward_reads, compile_report, state_report
from opcheck.runtime.context import Settings, current_item
from opcheck.runtime.outcomes import CheckFailure, CheckSkipped
from opcheck.runtime.report import Case, format_failure
from opcheck.runtime.samples import SampleCall, build_calls, unmetered_op
from opcheck.runtime.tolerances import resolve_lowprec_criterion
from opcheck.spec.model import GRAD_DTYPES, CompileCase, CompileFlags, OpSpec
from opcheck.spec.oppath import resolve_op


class CompiledMismatch(CheckFailure):
    """The op under torch.compile differs from eager."""


class CompiledUnsupported(CheckFailure):
    """fullgraph: true, and dynamo broke the graph (or could not compile the op)."""


@dataclass(frozen=True)
class Tried:
    """One comparison the test made: the backend, the case (None: the sample as written), the report."""

    backend: str
    case: CompileCase | None
    report: CompileReport

    @property
    def label(self) -> str:
        return f"{self.backend}, {_words(self.case)}"


def run_compile(case: Case, settings: Settings) -> None:
    """The generated `compile` test."""
    __tracebackhide__ = True
    with _quiet_torch_trace(), _recompile_limits():
        _run(case)


RECOMPILE_LIMIT = 256


def _recompile_limits() -> contextlib.AbstractContextManager[None]:
    """dynamo's recompile limit, raised while the check runs. It is kept per code object, and where
    the op breaks the graph, dynamo compiles the frames below the break one by one: opcheck's own
    call frames, shared by every test, would reach the default 8 and then run eagerly, so that a
    later test would compare eager with eager. The limit only bounds compile time."""
    config = torch._dynamo.config
    names = [n for n in ("recompile_limit", "accumulated_recompile_limit") if hasattr(config, n)]
    names = names or [n for n in ("cache_size_limit", "accumulated_cache_size_limit") if hasattr(config, n)]
    return config.patch(**{n: max(RECOMPILE_LIMIT, getattr(config, n)) for n in names})


def _run(case: Case) -> None:
    __tracebackhide__ = True
    from opcheck.runtime.checks import _calls, _crash

    if case.spec.name in _UNTRACEABLE:
        raise CheckSkipped(_UNTRACEABLE[case.spec.name])
    if "triton" in case.spec.requires and _interpreting_triton():
        raise CheckSkipped(TRITON_INTERPRETED)  # known before dynamo spends seconds failing to trace it
    flags = case.spec.compile or CompileFlags()
    tried: list[Tried] = []
    not_tried: list[str] = []
    for call in _calls(case):
        call = replace(call, op=unmetered_op(case.spec))
        planned, skipped = comparisons(case, call)
        not_tried += skipped
        for backend in flags.backends:
            _skip_unrunnable(backend, case.device)
            for which, made in planned:
                if which is CompileCase.BACKWARD_STATE:
                    continue
                compiled = _compiled(case, call, backend, which, flags.fullgraph)
                try:
                    with _quiet_warnings():
                        report = _compare(case, call, compiled, made)
                except _FullgraphBreak as e:
                    raise CompiledUnsupported(
                        _failure(case, call, backend, which, e.text, compiled, "graph break")
                    ) from None
                except Exception as e:
                    raise _crash(case, call, e, f"the eager run ({_words(which)})") from e
                tried.append(Tried(backend, which, report))
                if not report.passed:
                    raise CompiledMismatch(_mismatch(case, call, tried[-1]))
        for which, made in planned:
            if which is CompileCase.BACKWARD_STATE:
                state = _backward_state(case, call, made, flags.fullgraph)
                if isinstance(state, str):
                    not_tried.append(f"{which.words}: {state}")
                    continue
                tried.append(state)
                if not state.report.passed:
                    raise CompiledMismatch(_mismatch(case, call, state))
    _announce(case, tried, list(dict.fromkeys(not_tried)))


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        # torch.jit's deprecation, met by inductor's imports; AOTAutograd traces the backward in
        # anomaly mode, which repeats as a warning an error the report holds
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        warnings.filterwarnings("ignore", message="Error detected in ", category=UserWarning)
        yield


STATE_BACKEND = "aot_eager"
"""The backend of the backward_state case: dynamo and AOTAutograd bind what the backward reads,
before any backend sees the graph."""


def _backward_state(case: Case, call: SampleCall, made: _Inputs, fullgraph: bool) -> Tried | str:
    """The backward_state comparison, or why it was not made."""
    __tracebackhide__ = True
    skeleton, tensors, _ = made
    eager = functools.partial(_eager, call, skeleton)
    try:
        with _quiet_warnings():
            reads = backward_reads(eager, tensors)
    except Exception as e:
        return f"dynamo's trace of the op raised {type(e).__name__}"
    if not reads:
        return "the backward reads no Python number the forward does not (bools and UPPER_CASE constants aside)"
    compiled = _compiled(case, call, STATE_BACKEND, CompileCase.BACKWARD_STATE, fullgraph)
    try:
        with _quiet_warnings():
            report = state_report(
                eager,
                tensors,
                compiled=compiled,
                reads=reads,
                leading=(skeleton,),
                generator=torch.Generator().manual_seed(case.seed),
            )
    except Exception as e:  # a value the op cannot take (a size moved by one): not the op's fault
        names = ", ".join(r.name for r in reads)
        return f"with {names} changed, a run raised {type(e).__name__}: {e}"
    return Tried(STATE_BACKEND, CompileCase.BACKWARD_STATE, report)


def comparisons(case: Case, call: SampleCall) -> tuple[list[tuple[CompileCase | None, _Inputs]], list[str]]:
    """What each backend compares for this call: (case, the compiled function's arguments), the
    sample as written first; and the cases not tried, each with why."""
    off = dict((case.spec.compile or CompileFlags()).cases_off)
    planned: list[tuple[CompileCase | None, _Inputs]] = []
    not_tried = [f"{CompileCase(k).words}: {reason}" for k, reason in off.items()]
    for which in (None, *CompileCase):
        if which is CompileCase.WRITTEN or (which is not None and which.value in off):
            continue  # the written inputs are compared in every case
        made = _case_inputs(case, call, which)
        if isinstance(made, str):
            not_tried.append(f"{_words(which)}: {made}")
            continue
        planned.append((which, made))
        if which is CompileCase.DYNAMIC and made[2] is None:
            not_tried.append(
                "dynamic shapes at a second size: no other sample of the spec has the same arguments at other sizes"
            )
    return planned, not_tried


def _words(which: CompileCase | None) -> str:
    return which.words if which is not None else "the sample as written"


@contextlib.contextmanager
def _quiet_torch_trace() -> Iterator[None]:
    """torch writes its structured trace (tlparse's input, thousands of debug records per compile)
    whenever that logger has a handler; pytest 9 hands its log capture to every logger that does
    not propagate, this one too, so that a failure's report would drown in them. The handlers that
    are not torch's own (TORCH_TRACE's) are set aside while the check runs."""
    trace = logging.getLogger("torch.__trace")
    kept = list(trace.handlers)
    trace.handlers = [h for h in kept if type(h).__module__.startswith("torch.")]
    try:
        yield
    finally:
        trace.handlers = kept


# ------------------------------------------------------------------------------------ the cases
_Inputs = tuple[Any, list[torch.Tensor], Any]  # (skeleton, tensors, partner: (skeleton, tensors) or None)


def _case_inputs(case: Case, call: SampleCall, which: CompileCase | None) -> _Inputs | str:
    """The compiled function's arguments for one case, or why the sample cannot make the case."""
    skeleton, tensors = call.tensor_slots()
    if which is None:
        return skeleton, tensors, None
    if which is CompileCase.ALIASED:
        pair = _alias_pair(tensors)
        if pair is None:
            return "no two tensor inputs of one shape, dtype and requires_grad"
        i, j = pair
        return skeleton, [tensors[i] if k == j else t for k, t in enumerate(tensors)], None
    if which is CompileCase.NONCONTIGUOUS:
        changed = [_strided_view(t) for t in tensors]
        if all(a is b for a, b in zip(changed, tensors)):
            return "no contiguous tensor input with more than one element"
        return skeleton, changed, None
    if which is CompileCase.PARTIAL_GRAD:
        grad = [k for k, t in enumerate(tensors) if t.requires_grad]
        if len(grad) < 2:
            return "fewer than two inputs require grad"
        return skeleton, [t.detach() if k in grad[1:] else t for k, t in enumerate(tensors)], None
    if which is CompileCase.BACKWARD_STATE:
        return skeleton, tensors, None
    partner = _partner(case, call)
    return skeleton, tensors, partner


def _alias_pair(tensors: list[torch.Tensor]) -> tuple[int, int] | None:
    for j, b in enumerate(tensors):
        for i, a in enumerate(tensors[:j]):
            same = (a.shape, a.dtype, a.device, a.layout, a.requires_grad) == (
                b.shape,
                b.dtype,
                b.device,
                b.layout,
                b.requires_grad,
            )
            if same and a.layout == torch.strided and a is not b:
                return i, j
    return None


def _strided_view(t: torch.Tensor) -> torch.Tensor:
    """t's values in a non-contiguous layout: the last two dims transposed in memory, or (1-d) every
    other element; t itself when it is not contiguous already or has one element."""
    if t.layout != torch.strided or t.numel() <= 1 or not t.is_contiguous():
        return t
    base = t.detach()
    if base.dim() >= 2 and base.shape[-1] > 1 and base.shape[-2] > 1:
        view = base.transpose(-1, -2).contiguous().transpose(-1, -2)
    else:
        buf = torch.zeros(*base.shape[:-1], 2 * base.shape[-1], dtype=base.dtype, device=base.device)
        buf[..., ::2] = base
        view = buf[..., ::2]
    return view.requires_grad_(t.requires_grad)


def _partner(case: Case, call: SampleCall) -> tuple[Any, list[torch.Tensor]] | None:
    """The first other sample of the spec whose call has the same arguments but for the tensors'
    sizes (same count, ranks and dtypes), built at this test's device and dtype."""
    _, tensors = call.tensor_slots()
    kinds = [(t.dim(), t.dtype, t.requires_grad) for t in tensors]
    for other in case.spec.samples:
        if other.name == case.sample.name or other.opinfo or other.generator:
            continue
        try:
            built = build_calls(case.spec, other, case.device, case.dtype, case.seed)
        except Exception:  # a sample this dtype cannot build is no partner
            continue
        skeleton, others = built[0].tensor_slots()
        if [(t.dim(), t.dtype, t.requires_grad) for t in others] != kinds:
            continue
        if [t.shape for t in others] != [t.shape for t in tensors]:
            return skeleton, others
    return None


# ------------------------------------------------------------------------------------ compiling
_CACHE: dict[tuple[Any, ...], CompiledFunction] = {}
_CACHE_SPEC: list[tuple[str, str]] = []


def _compiled(
    case: Case, call: SampleCall, backend: str, which: CompileCase | None, fullgraph: bool
) -> CompiledFunction:
    """The compiled function of this spec, device, dtype, backend and case: kept while the spec's
    tests run (the next spec's first test drops them and dynamo's caches)."""
    spec = (case.spec.name, case.spec.sha256)
    if _CACHE_SPEC != [spec]:
        _CACHE.clear()
        torch._dynamo.reset()
        _CACHE_SPEC[:] = [spec]
    dynamic = True if which is CompileCase.DYNAMIC else None
    key = (case.device, case.dtype, backend, which, fullgraph, call.label == "", call.post is None)
    if key not in _CACHE:
        _CACHE[key] = CompiledFunction(_invoke(call), backend, dynamic=dynamic, fullgraph=fullgraph)
    return _CACHE[key]


def _invoke(call: SampleCall) -> Callable[..., Any]:
    """f(skeleton, *tensors): _eager's outputs, compiled."""

    def invoke(skeleton: Any, *tensors: torch.Tensor) -> Any:
        return _eager(call, skeleton, *tensors)

    return invoke


def _eager(call: SampleCall, skeleton: Any, *tensors: torch.Tensor) -> tuple[Any, ...]:
    """The op's outputs, then for each floating one its entries weighted by their position and
    summed: in a compiled graph, the reading of the output by the next kernel, which a wrong
    `register_fake` layout or size sends to the wrong entries."""
    out = call.with_tensors(skeleton, tensors).run()
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return outs + tuple(_weighted_sum(o) for o in outs if _floating(o))


def _floating(o: Any) -> bool:
    return isinstance(o, torch.Tensor) and o.layout == torch.strided and (o.is_floating_point() or o.is_complex())


def _weighted_sum(o: torch.Tensor) -> torch.Tensor:
    weights = torch.arange(1, o.numel() + 1, device=o.device, dtype=o.real.dtype).reshape(o.shape) / max(1, o.numel())
    return (o * weights).sum()


class _FullgraphBreak(Exception):
    def __init__(self, text: str) -> None:
        self.text = text


def _compare(case: Case, call: SampleCall, compiled: CompiledFunction, made: _Inputs) -> CompileReport:
    __tracebackhide__ = True
    skeleton, tensors, partner = made
    flags = case.spec.compile or CompileFlags()
    # inductor's graphs carry no forward-AD tangents (torch's limitation, not the op's): JVP under aot_eager
    forward = case.spec.gradcheck.check_forward_ad and case.spec.supports_forward_ad and compiled.backend != "inductor"
    criterion = resolve_lowprec_criterion(case.spec, case.device, case.dtype, case.sample.name).criterion
    reference = _reference(case.spec)
    runs = [(skeleton, tensors)] + ([partner] if partner is not None else [])
    report = None
    for k, (skel, ts) in enumerate(runs):
        graphs_before = compiled.graphs.compiled
        eager = functools.partial(_eager, call, skel)
        report = compile_report(
            eager,
            ts,
            compiled=compiled,
            leading=(skel,),
            check_forward_ad=forward,
            generator=torch.Generator().manual_seed(case.seed + k),
            criterion=criterion,
            reference=functools.partial(_eager, replace(call, op=reference), skel) if reference else None,
            clone_inputs=case.spec.clone_inputs,
            compare_written=CompileCase.WRITTEN.value not in dict(flags.cases_off),
        )
        if report.raised is not None and compiled.fullgraph and _is_break(report.raised):
            raise _FullgraphBreak(report.error or "")
        if report.raised is not None and _in_triton_interpreter(report.raised):
            _UNTRACEABLE[case.spec.name] = TRITON_INTERPRETED
            raise CheckSkipped(TRITON_INTERPRETED)
        if k == 1:  # the partner: what dynamic shapes did at its size
            shapes = ", ".join(str(list(t.shape)) for t in ts)
            recompiled = compiled.graphs.compiled > graphs_before
            note = (
                f"recompiled for the second size ({shapes}): the graph of the first was specialized to its sizes"
                if recompiled
                else f"the second size ({shapes}) ran the first size's graph"
            )
            if recompiled or not report.passed:
                report = replace(report, notes=(*report.notes, note))
        if not report.passed:
            return report
    assert report is not None
    return report


def _reference(spec: OpSpec) -> Callable[..., Any] | None:
    return resolve_op(spec.reference, imports=spec.imports) if spec.reference else None


TRITON_INTERPRETED = (
    "dynamo cannot trace a Triton kernel that runs in Triton's interpreter (TRITON_INTERPRET=1, as on a "
    "machine without a GPU): the compile check of a Triton kernel runs where the kernel is compiled for a GPU"
)
_UNTRACEABLE: dict[str, str] = {}
"""Specs whose op dynamo was found unable to trace in this process, and why: their later tests skip at once."""


def _interpreting_triton() -> bool:
    from opcheck.triton import status

    return status().interpreting


def _in_triton_interpreter(e: BaseException) -> bool:
    """Whether `e` (or what caused it) came out of Triton's interpreter."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        err = stack.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if type(err).__name__ == "InterpreterError" or "triton/runtime/interpreter" in str(err):
            return True
        tb = err.__traceback__
        while tb is not None:
            if "triton/runtime/interpreter" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
                return True
            tb = tb.tb_next
        stack += [err.__cause__, err.__context__]
    return False


def _is_break(e: BaseException) -> bool:
    unsupported = getattr(getattr(torch._dynamo, "exc", None), "Unsupported", None)
    return unsupported is not None and isinstance(e, unsupported)


def _skip_unrunnable(backend: str, device: str) -> None:
    if backend == "inductor" and device == "cpu" and not _cpp_compiler():
        raise CheckSkipped("inductor on CPU needs a C++ compiler (g++ or clang++ on PATH, or $CXX); none is installed")


@functools.cache
def _cpp_compiler() -> bool:
    import os
    import shutil

    return any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if c)


# ------------------------------------------------------------------------------------ reporting
def _mismatch(case: Case, call: SampleCall, tried: Tried) -> str:
    report = tried.report
    found = (
        f"the compiled call raised {type(report.raised).__name__}"
        if report.raised is not None
        else f"{report.what} differs from eager"
    )
    headline = (
        f"opcheck compile failed for {case.spec.op} on {case.device}/{case.dtype}, sample "
        f"{case.sample.name!r}: under torch.compile(backend={tried.backend!r}), {found} "
        f"({_words(tried.case)})"
    )
    return _failure(case, call, tried.backend, tried.case, report.error or "", None, headline, report)


def _failure(
    case: Case,
    call: SampleCall,
    backend: str,
    which: CompileCase | None,
    text: str,
    compiled: CompiledFunction | None,
    headline: str,
    report: CompileReport | None = None,
) -> str:
    graphs = report.graphs if report is not None else compiled.graphs if compiled is not None else None
    body = [text]
    if report is not None and report.notes:
        body += [f"note: {n}" for n in report.notes]
    if graphs is not None:
        body.append(f"dynamo: {graphs.describe()}")
    if headline == "graph break":
        headline = (
            f"opcheck compile failed for {case.spec.op} on {case.device}/{case.dtype}, sample "
            f"{case.sample.name!r}: fullgraph: true, and dynamo broke the graph under backend {backend!r}"
        )
    judged = (
        "the low-precision criterion against the float64 eager run"
        if backend == "inductor" and case.dtype not in GRAD_DTYPES
        else "eager at the same dtype, up to rounding order"
    )
    return format_failure(
        case,
        headline=headline,
        body="\n".join(body),
        call=call,
        path=f"torch.compile(backend={backend!r}) against {judged}; case: {_words(which)}",
    )


def _headline(reason: str) -> str:
    """dynamo's break reason and its explanation, without the hints and debug context (a failure
    shows them whole)."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return " ".join(lines[:1] + [line for line in lines[1:2] if line.startswith("Explanation:")])


def _announce(case: Case, tried: list[Tried], left_out: list[str]) -> None:
    """What the passing test saw: graphs, breaks and recompiles per backend, the cases left out."""
    lines = []
    for t in tried:
        extra = []
        # the breaks of the compiled function this comparison ran (dynamo breaks a frame once)
        breaks = t.report.graphs.breaks
        if breaks:
            extra.append(f"graph breaks: {'; '.join(_headline(reason) for reason in breaks)}")
        extra += list(t.report.notes)
        if extra:
            lines.append(f"{t.label}: {', '.join(extra)}")
    lines += [f"not tried: {x}" for x in left_out]
    if tried and not any(t.report.ran_compiled for t in tried):
        reasons = sorted({_headline(b) for t in tried for b in t.report.graphs.breaks})
        raise CheckSkipped(
            f"{case.spec.op} never ran as a compiled graph (dynamo ran it eagerly"
            + (f": {'; '.join(reasons)}" if reasons else "")
            + "); set `compile: {fullgraph: true}` to make that a failure"
        )
    text = "\n".join(lines)
    if not text:
        return
    print(f"opcheck compile: {text}")
    item = current_item.get()
    if item is not None:
        item.user_properties.append(("opcheck_compile", text))
        if item.add_report_section is not None:
            item.add_report_section("call", "opcheck compile", text)
