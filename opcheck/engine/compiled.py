"""compile_report: an op run under torch.compile against the same op run eagerly.

One comparison calls fn(*inputs) eagerly and through a compiled function, each on its own copies of
the inputs (their strides, the gaps between their elements and their aliasing kept: the same tensor
passed twice stays one tensor), and compares, part by part:

- the outputs (count, shapes and dtypes first, then values);
- the VJP for one random cotangent, the same for both runs, taken outside the compiled region as
  training takes it (the backend compiles the backward graph);
- the JVP for one random tangent, where the op supports forward AD (`check_forward_ad`);
- the inputs the op wrote into, eagerly and compiled.

A backward may also read Python numbers (a module's global, an object's attribute, a dict's item)
that its forward does not. dynamo traces the backward while it compiles the forward and binds what
it read then; eagerly, autograd reads them when the backward runs. backward_reads finds them from
dynamo's own guards (those of a trace with grad, less those of a trace without), and
state_report changes them before the forward and again before the backward of both runs.

How values are judged depends on what compile may change. A backend that runs the same kernels
(`aot_eager`), and any backend at float64, may only reorder rounding: each entry is held to
ROUNDING_ULPS units of the dtype's epsilon, scaled by the entry and by the largest entry of its
tensor. A backend that fuses and generates kernels (`inductor`) at float32 and narrower computes
differently on purpose: it is judged by the low-precision criterion against the float64 eager run
(opcheck.engine.lowprec), so that honest rounding passes and a wrong gradient fails.

The compiled function counts the graphs dynamo hands the backend and the runs of them, and the
graph breaks with dynamo's reasons: a report says whether the op ran compiled at all.
"""

from __future__ import annotations

import contextlib
import math
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field, replace
from typing import Any

import torch

from opcheck._records import record
from opcheck.engine._util import load_forward_ad_decompositions, make_dual, unpack_dual
from opcheck.engine.lowprec.criterion import Criterion
from opcheck.engine.lowprec.numbers import _is_float, _num, _outputs, _random_like, _scalar, _unravel

ROUNDING_ULPS = 16
"""How many units of the dtype's epsilon (times the entry's size plus its tensor's largest) a
compiled entry may differ from the eager one where only the order of rounding may change."""
BACKENDS = ("aot_eager", "inductor")
"""The backends compile_report knows how to judge; `inductor` by the low-precision criterion below
float64, every other by rounding order."""
GRADIENT_DTYPES = (torch.float64, torch.complex128)
WORST_SHOWN = 5


# ------------------------------------------------------------------------------------ compiling
@record(frozen=False)
class Graphs:
    """What dynamo did: graphs compiled by the backend, runs of them, graph breaks and why."""

    compiled: int = 0
    ran: int = 0
    breaks: Counter[str] = field(default_factory=Counter)

    def describe(self) -> str:
        text = f"{self.compiled} graph(s) compiled, {self.ran} run(s)"
        if self.breaks:
            reasons = "; ".join(f"{reason} (x{n})" if n > 1 else reason for reason, n in self.breaks.items())
            text += f", {sum(self.breaks.values())} graph break(s): {reasons}"
        return text


class CompiledFunction:
    """fn under torch.compile, through a backend that counts what it compiles and runs.

    Each instance compiles a code object of its own, so that dynamo's cache and recompile limit
    (kept per code object) hold this function's graphs alone: a limit reached elsewhere never
    turns it into an eager call that compares equal to itself.
    """

    def __init__(self, fn: Callable[..., Any], backend: str, *, dynamic: bool | None, fullgraph: bool) -> None:
        from torch._dynamo.backends.registry import lookup_backend

        self.backend, self.dynamic, self.fullgraph = backend, dynamic, fullgraph
        self.graphs = Graphs()
        inner = lookup_backend(backend)
        graphs = self.graphs

        def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            graphs.compiled += 1
            compiled = inner(gm, example_inputs)
            boxed = getattr(compiled, "_boxed_call", False)

            def run(*args: Any) -> Any:
                graphs.ran += 1
                return compiled(*args)

            run._boxed_call = boxed  # type: ignore[attr-defined]  # dynamo's calling convention
            return run

        self._compiled = torch.compile(_own_code(fn), backend=counting, dynamic=dynamic, fullgraph=fullgraph)

    def __call__(self, *args: Any) -> Any:
        from torch._dynamo.utils import counters

        before = Counter(counters["graph_break"])
        try:
            return self._compiled(*args)
        finally:
            self.graphs.breaks.update(Counter(counters["graph_break"]) - before)


def _own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    def compiled_call(*args: Any) -> Any:
        return fn(*args)

    code = compiled_call.__code__.replace()  # a new code object: dynamo caches per code object
    return types.FunctionType(code, compiled_call.__globals__, code.co_name, None, compiled_call.__closure__)


# ------------------------------------------------------------------------------------ evaluating
@record(frozen=False)
class Evaluation:
    """One run: its outputs, the VJP per distinct input requiring grad, the JVP per output, and
    the inputs that do not require grad as they were after the call."""

    outputs: list[Any]
    vjp: list[torch.Tensor | None]
    jvp: list[torch.Tensor | None]
    after: list[torch.Tensor | None]


def copies(inputs: Sequence[Any]) -> list[Any]:
    """Copies of the tensors among `inputs`, each a leaf with the original's requires_grad, strides
    and storage offset in a copy of its whole storage; the same tensor twice gives one copy twice."""
    memo: dict[int, torch.Tensor] = {}
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            if id(x) not in memo:
                memo[id(x)] = _copy(x)
            out.append(memo[id(x)])
        else:
            out.append(x)
    return out


def _copy(x: torch.Tensor) -> torch.Tensor:
    if x.layout != torch.strided:
        return x.detach().clone().requires_grad_(x.requires_grad)
    storage = x.detach().untyped_storage().clone()  # type: ignore[no-untyped-call]
    t = torch.empty(0, dtype=x.dtype, device=x.device)
    t.set_(storage, x.storage_offset(), x.shape, x.stride())
    return t.requires_grad_(x.requires_grad)


def _differentiable(inputs: Sequence[Any]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            seen.setdefault(id(x), x)
    return list(seen.values())


def evaluate(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    cotangents: Callable[[list[Any]], list[torch.Tensor]],
    tangents: list[torch.Tensor] | None,
    around: Between | None = None,
    between: Between | None = None,
) -> Evaluation:
    """fn's outputs, VJP and (with tangents) JVP on copies of `inputs`; the forward and the VJP
    inside `around()`, the VJP inside `between()` too, where given."""
    with around() if around is not None else contextlib.nullcontext():
        return _evaluate(fn, inputs, cotangents, tangents, between)


def _evaluate(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    cotangents: Callable[[list[Any]], list[torch.Tensor]],
    tangents: list[torch.Tensor] | None,
    between: Between | None,
) -> Evaluation:
    __tracebackhide__ = True
    xs = copies(inputs)
    outs = _outputs(fn(*xs))
    leaves = _differentiable(xs)
    diff_outs = [o for o in outs if _is_float(o) and o.requires_grad]
    vjp: list[torch.Tensor | None] = []
    cots = cotangents(outs)
    if leaves and diff_outs:
        with between() if between is not None else contextlib.nullcontext():
            grads = torch.autograd.grad(diff_outs, leaves, [c.clone() for c in cots], allow_unused=True)
        vjp = [None if g is None else g.detach() for g in grads]
    after = [None if not isinstance(x, torch.Tensor) or x.requires_grad else x.detach() for x in xs]
    jvp: list[torch.Tensor | None] = []
    if tangents is not None:
        jvp = _jvp(fn, inputs, tangents)
    return Evaluation([o.detach() if isinstance(o, torch.Tensor) else o for o in outs], vjp, jvp, after)


def _jvp(fn: Callable[..., Any], inputs: Sequence[Any], tangents: list[torch.Tensor]) -> list[torch.Tensor | None]:
    __tracebackhide__ = True
    load_forward_ad_decompositions()  # this checks the op's forward AD (see _util.make_dual)
    xs = copies(inputs)
    leaves = {id(x): t.clone() for x, t in zip(_differentiable(xs), tangents)}
    with torch.autograd.forward_ad.dual_level():
        duals: dict[int, torch.Tensor] = {}
        args = []
        for x in xs:
            if isinstance(x, torch.Tensor) and id(x) in leaves:
                if id(x) not in duals:
                    duals[id(x)] = make_dual(x.detach(), leaves[id(x)])
                args.append(duals[id(x)])
            else:
                args.append(x)
        outs = _outputs(fn(*args))
        found: list[torch.Tensor | None] = []
        for o in outs:
            if _is_float(o):
                tangent = unpack_dual(o)[1]
                found.append(None if tangent is None else tangent.detach().clone())
        return found


# ------------------------------------------------------------------------------------ Python state
Between = Callable[[], contextlib.AbstractContextManager[None]]
"""A context that evaluate runs a part of the call in (see evaluate)."""

_VALUE_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH")  # dynamo's guards on a Python value


@record
class StateRead:
    """A Python number that the op's backward reads, where it lives: `holder[key]` (a dict's item,
    a module's globals) or `holder.key` (an attribute)."""

    name: str  # as the user spells it: corpus.reversal_weight, config.CFG['scale']
    value: Any  # an int or float (while a source is walked: the module, object or dict on the way)
    holder: Any
    key: Any
    attribute: bool

    def changed(self, step: int) -> int | float:
        """The value moved `step` times: by one for an int, by half its size (at least 0.5) for a float."""
        if isinstance(self.value, int):
            return int(self.value) + step
        return float(self.value) + 0.5 * step * max(abs(float(self.value)), 1.0)

    def set(self, value: int | float) -> None:
        if self.attribute:
            setattr(self.holder, self.key, value)
        else:
            self.holder[self.key] = value


@contextlib.contextmanager
def state_changed(reads: Sequence[StateRead], step: int) -> Iterator[None]:
    """Each read's value moved `step` times, then put back."""
    before = [getattr(r.holder, r.key) if r.attribute else r.holder[r.key] for r in reads]
    try:
        for r in reads:
            r.set(r.changed(step))
        yield
    finally:
        for r, value in zip(reads, before):
            r.set(value)


def backward_reads(fn: Callable[..., Any], inputs: Sequence[Any]) -> list[StateRead]:
    """The Python numbers (not bools, not UPPER_CASE constants) that fn's backward reads and
    compile binds when it compiles:

    - where dynamo traces the backward (an autograd.Function's), those its guards name with grad
      and not without: read by the backward or setup_context, not by the forward;
    - where AOTAutograd traces it without guards (a torch.library.custom_op's registered backward
      and setup_context), the globals, their attributes and items those functions read."""
    root, forward = _guards(fn, inputs, grad=False)
    _, both = _guards(fn, inputs, grad=True)
    seen = {g.name for g in forward}
    reads: dict[str, StateRead] = {}
    for guard in both:
        if guard.name in seen or guard.create_fn_name() not in _VALUE_GUARDS:
            continue
        read = _where(guard.originating_source, root)
        if read is not None:
            reads.setdefault(read.name, read)
    for f in _registered_backwards(fn, inputs):
        for read in _globals_read(f):
            reads.setdefault(read.name, read)
    return [r for r in reads.values() if _is_state(r)]


def _is_state(read: StateRead) -> bool:
    constant = isinstance(read.key, str) and read.key.isupper()  # PEP 8's spelling of a constant
    return type(read.value) in (int, float) and math.isfinite(read.value) and not constant


def _guards(fn: Callable[..., Any], inputs: Sequence[Any], *, grad: bool) -> tuple[dict[str, Any], list[Any]]:
    found: list[Any] = []
    traced = _own_code(fn)
    run = torch._dynamo.optimize("eager", guard_export_fn=found.extend)(traced)
    with torch.set_grad_enabled(grad):
        run(*copies(inputs))
    return traced.__globals__, found


_MISSING = object()


def _where(source: Any, root: dict[str, Any]) -> StateRead | None:
    """Where a guard's source lives, from the traced frame's globals down: a global, an attribute,
    a dict's item; None for anything else (a local, a closure cell, a tensor's property)."""
    kind = type(source).__name__
    if kind == "GlobalSource":
        return _read(root, source.global_name, False, source.global_name)
    base = getattr(source, "base", None)
    outer = _where(base, root) if base is not None else None
    if outer is None:
        return None
    if kind == "AttrSource":
        return _read(outer.value, source.member, True, f"{outer.name}.{source.member}")
    if kind == "DictGetItemSource" and isinstance(outer.value, dict):
        return _read(outer.value, source.index, False, f"{outer.name}[{source.index!r}]")
    return None


def _read(holder: Any, key: Any, attribute: bool, name: str) -> StateRead | None:
    try:
        value = getattr(holder, key, _MISSING) if attribute else holder.get(key, _MISSING)
    except Exception:  # a holder that is not what the source says (a dict subclass, a property raising)
        return None
    if value is _MISSING:
        return None
    if isinstance(value, types.ModuleType):
        name = value.__name__  # dynamo's alias of an imported module (G['__import_corpus']) as its name
    return StateRead(name, value, holder, key, attribute)


def _registered_backwards(fn: Callable[..., Any], inputs: Sequence[Any]) -> list[types.FunctionType]:
    """The backward and setup_context functions of the torch.library.custom_ops that fn(*inputs)
    calls, as registered with register_autograd."""
    from torch.utils._python_dispatch import TorchDispatchMode

    opdefs = getattr(getattr(torch._library, "custom_ops", None), "OPDEFS", {})
    called: dict[str, None] = {}

    class Called(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            called[func._schema.name] = None
            return func(*args, **(kwargs or {}))

    if not opdefs:
        return []
    with torch.no_grad(), Called():  # type: ignore[no-untyped-call]
        fn(*copies(inputs))
    found = []
    for name in called:
        opdef = opdefs.get(name)
        for f in (getattr(opdef, "_backward_fn", None), getattr(opdef, "_setup_context_fn", None)):
            if isinstance(f, types.FunctionType):
                found.append(f)
    return found


def _globals_read(f: types.FunctionType) -> list[StateRead]:
    """The globals f's own code reads, and the attributes (`g.x`) and constant-keyed items
    (`g["x"]`) it reads of them."""
    import dis

    module = f.__module__ or "?"
    ins = list(dis.get_instructions(f))
    reads = []
    for i, op in enumerate(ins):
        if op.opname != "LOAD_GLOBAL" or op.argval not in f.__globals__:
            continue
        read = _read(f.__globals__, op.argval, False, f"{module}.{op.argval}")
        nxt = ins[i + 1 : i + 3]
        if read is not None and nxt and nxt[0].opname == "LOAD_ATTR":
            read = _read(read.value, nxt[0].argval, True, f"{read.name}.{nxt[0].argval}")
        elif read is not None and len(nxt) == 2 and nxt[0].opname == "LOAD_CONST" and nxt[1].opname == "BINARY_SUBSCR":
            if isinstance(read.value, dict):
                read = _read(read.value, nxt[0].argval, False, f"{read.name}[{nxt[0].argval!r}]")
        if read is not None:
            reads.append(read)
    return reads


def state_report(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    compiled: CompiledFunction,
    reads: Sequence[StateRead],
    leading: tuple[Any, ...] = (),
    generator: torch.Generator | None = None,
) -> CompileReport:
    """fn's outputs and VJP eagerly and through `compiled`, with the Python numbers its backward
    reads changed: `compiled` runs once as they are, then each run takes its forward with every
    read moved once and its backward with every read moved twice, as a schedule that steps a
    value before a forward, or between a forward and its backward, would. Held to eager up to
    rounding order: eagerly the backward reads what is there when it runs; compile binds what it
    saw when it compiled."""
    __tracebackhide__ = True
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    run = _Bound(compiled, leading)
    warm = copies(inputs)
    outs = [o for o in _outputs(run(*warm)) if _is_float(o) and o.requires_grad]
    if outs and _differentiable(warm):
        torch.autograd.grad(outs, _differentiable(warm), [torch.ones_like(o) for o in outs], allow_unused=True)
    report = _against_eager(
        fn,
        inputs,
        run,
        False,
        gen,
        False,
        around=lambda: state_changed(reads, 1),
        between=lambda: state_changed(reads, 2),
    )
    if report.passed:
        return report
    moved = ", ".join(f"{r.name} {r.value!r} -> {r.changed(1)!r} -> {r.changed(2)!r}" for r in reads)
    why = (
        f"with {moved} (before the forward, then between the forward and the backward), {report.error}\n"
        "Eagerly, the backward reads these values when it runs; under torch.compile it uses the ones "
        "seen when it was compiled. Read them in the forward and pass them to the op as arguments "
        "(or, in an autograd.Function, keep them on ctx in setup_context) so both see the same. A value "
        "that never changes while the model trains is a constant: spell it in UPPER_CASE, and it is left alone."
    )
    return replace(report, error=why)


# ------------------------------------------------------------------------------------ comparing
@record(frozen=False)
class CompileReport:
    """What one comparison found: `error` None when compiled and eager agree."""

    backend: str
    graphs: Graphs
    compared: tuple[str, ...] = ()  # "output 0", "VJP of input 1", ...
    notes: tuple[str, ...] = ()  # what differs without deciding (an output's strides)
    error: str | None = None
    what: str = ""  # the first part that differs: "output 0", "VJP of input 0", "input 1 after the call"
    raised: BaseException | None = field(default=None, compare=False)  # what the compiled call raised
    ran_compiled: bool = True  # False: no compiled graph ran (dynamo ran the call eagerly); nothing compared

    @property
    def passed(self) -> bool:
        return self.error is None


def compile_report(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    compiled: CompiledFunction,
    leading: tuple[Any, ...] = (),
    check_forward_ad: bool = False,
    generator: torch.Generator | None = None,
    compare_written: bool = True,
    criterion: Criterion | str = "baseline",
    reference: Callable[..., Any] | None = None,
    clone_inputs: bool = False,
) -> CompileReport:
    """fn(*inputs) through `compiled` against fn(*inputs) eagerly (see the module's docstring).

    `compiled` is called as compiled(*leading, *inputs) and may be reused across calls (a second
    size under dynamic shapes); its graphs show what this and earlier calls compiled.
    compare_written: compare the inputs after the call too. `criterion`, `reference` (the float64
    implementation where fn has none) and `clone_inputs` are the low-precision check's, for
    inductor below float64."""
    __tracebackhide__ = True
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    dtype = _test_dtype(inputs)
    run = _Bound(compiled, leading)
    if compiled.backend == "inductor" and dtype is not None and dtype not in GRADIENT_DTYPES:
        return _against_float64(fn, inputs, run, check_forward_ad, gen, criterion, reference, clone_inputs)
    return _against_eager(fn, inputs, run, check_forward_ad, gen, compare_written)


@record(frozen=False)
class _Bound:
    compiled: CompiledFunction
    leading: tuple[Any, ...]

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*self.leading, *args)

    @property
    def backend(self) -> str:
        return self.compiled.backend

    @property
    def graphs(self) -> Graphs:
        return self.compiled.graphs


def _test_dtype(inputs: Sequence[Any]) -> torch.dtype | None:
    return next((x.dtype for x in inputs if _is_float(x)), None)


def _against_eager(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    compiled: _Bound,
    check_forward_ad: bool,
    gen: torch.Generator,
    compare_written: bool,
    around: Between | None = None,
    between: Between | None = None,
) -> CompileReport:
    __tracebackhide__ = True
    drawn: list[torch.Tensor] = []

    def cotangents(outs: list[Any]) -> list[torch.Tensor]:
        if not drawn:
            drawn.extend(_random_like(o, gen) for o in outs if _is_float(o) and o.requires_grad)
        return drawn

    leaves = _differentiable(inputs)
    tangents = [_random_like(x, gen) for x in leaves] if check_forward_ad and leaves else None
    eager = evaluate(fn, inputs, cotangents, tangents, around, between)
    ran_before = compiled.graphs.ran
    try:
        got = evaluate(compiled, inputs, cotangents, None, around, between)
    except Exception as e:
        return _raised(compiled, e, "the compiled call raised, eagerly it did not")
    if compiled.graphs.ran == ran_before:
        return CompileReport(compiled.backend, compiled.graphs, ran_compiled=False)
    jvp_note = None
    if tangents is not None:
        try:
            got.jvp = _jvp(compiled, inputs, tangents)
        except Exception as e:  # compile's forward AD, not the op: what it lacks is reported, not judged
            jvp_note = f"forward AD through the compiled function raised {type(e).__name__}: {e}; JVP not compared"
            got.jvp = eager.jvp = []
    if not compare_written:
        got.after = eager.after = [None] * len(eager.after)
    report = _compare(eager, got, compiled)
    if jvp_note is not None:
        report = replace(report, notes=(*report.notes, jvp_note))
    return report


def _raised(compiled: _Bound, e: Exception, what: str) -> CompileReport:
    text = f"{type(e).__name__}: {e}".strip()
    return CompileReport(compiled.backend, compiled.graphs, error=f"{what}:\n{text}", what="the call", raised=e)


def _compare(eager: Evaluation, got: Evaluation, compiled: _Bound) -> CompileReport:
    compared: list[str] = []
    notes: list[str] = []
    if len(eager.outputs) != len(got.outputs):
        error = f"the compiled call returned {len(got.outputs)} output(s), eagerly {len(eager.outputs)}"
        return CompileReport(compiled.backend, compiled.graphs, error=error, what="the outputs")
    pairs: list[tuple[str, Any, Any]] = [
        (f"output {i}", e, g) for i, (e, g) in enumerate(zip(eager.outputs, got.outputs))
    ]
    pairs += [(f"VJP of input {i}", e, g) for i, (e, g) in enumerate(zip(eager.vjp, got.vjp))]
    pairs += [(f"JVP of output {i}", e, g) for i, (e, g) in enumerate(zip(eager.jvp, got.jvp))]
    pairs += [
        (f"input {i} after the call", e, g) for i, (e, g) in enumerate(zip(eager.after, got.after)) if e is not None
    ]
    for what, e, g in pairs:
        if what.startswith("JVP") and isinstance(e, torch.Tensor) and g is None:
            # compile's forward AD, not the op: inductor's graphs drop tangents (torch's limitation)
            notes.append(f"{what}: the compiled run carries no tangent, so forward AD was not compared")
            continue
        if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
            if (e is None) != (g is None) or (not isinstance(e, torch.Tensor) and e != g and e is not None):
                error = f"{what}: compiled {_brief(g)}, eagerly {_brief(e)}"
                return CompileReport(compiled.backend, compiled.graphs, tuple(compared), tuple(notes), error, what)
            continue
        differs = _differs(e, g)
        compared.append(what)
        if differs is not None:
            return CompileReport(
                compiled.backend, compiled.graphs, tuple(compared), tuple(notes), f"{what}: {differs}", what
            )
        if e.layout == torch.strided and g.layout == torch.strided and e.numel() > 1 and e.stride() != g.stride():
            notes.append(f"{what} has strides {list(g.stride())} compiled, {list(e.stride())} eagerly")
    return CompileReport(compiled.backend, compiled.graphs, tuple(compared), tuple(notes))


def _brief(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"Tensor{list(v.shape)} {str(v.dtype).replace('torch.', '')}"
    return "nothing" if v is None else repr(v)


def _differs(e: torch.Tensor, g: torch.Tensor) -> str | None:
    """Why g is not e up to rounding order, with its worst entries; None when it is."""
    if e.shape != g.shape or e.dtype != g.dtype:
        return f"compiled {_brief(g)}, eagerly {_brief(e)}"
    if e.layout != torch.strided:
        e, g = e.to_dense(), g.to_dense()
    if not (e.is_floating_point() or e.is_complex()):
        bad = e != g
        if not bool(bad.any()):
            return None
        return f"{int(bad.sum())} of {e.numel()} entries differ" + _worst(e, g, bad.to(torch.float64), None)
    e64, g64 = e.to(_wide(e.dtype)), g.to(_wide(e.dtype))
    nan_e, nan_g = e64.isnan(), g64.isnan()
    finite = e64.isfinite() & g64.isfinite()
    same_nonfinite = (nan_e & nan_g) | (~finite & (e64 == g64))
    err = (g64 - e64).abs()
    scale = float(e64[finite].abs().max()) if bool(finite.any()) else 0.0
    allowed = ROUNDING_ULPS * torch.finfo(e.dtype).eps * (e64.abs() + scale)
    bad = ~same_nonfinite & ~(finite & (err <= allowed))
    if not bool(bad.any()):
        return None
    dtype = str(e.dtype).replace("torch.", "")
    head = f"{int(bad.sum())} of {e.numel()} entries differ beyond rounding order ({ROUNDING_ULPS} ulps of {dtype})"
    return head + _worst(e64, g64, torch.where(bad, err.nan_to_num(nan=math.inf), 0), allowed)


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype.is_complex else torch.float64


def _worst(e: torch.Tensor, g: torch.Tensor, err: torch.Tensor, allowed: torch.Tensor | None) -> str:
    flat = err.reshape(-1).real if err.is_complex() else err.reshape(-1)
    k = min(WORST_SHOWN, int((flat > 0).sum()))
    lines = []
    for idx in torch.topk(flat, k).indices.tolist():
        at = list(_unravel(idx, e.shape))
        gi, ei = g.reshape(-1)[idx], e.reshape(-1)[idx]
        line = f"  {at}: compiled {_num(_scalar(gi))}, eagerly {_num(_scalar(ei))}"
        if allowed is not None:
            line += f", abs err {float((gi - ei).abs()):.4g}, allowed {float(allowed.reshape(-1)[idx]):.4g}"
        lines.append(line)
    return ":\n" + "\n".join(lines) if lines else ""


def _against_float64(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    compiled: _Bound,
    check_forward_ad: bool,
    gen: torch.Generator,
    criterion: Criterion | str,
    reference: Callable[..., Any] | None,
    clone_inputs: bool,
) -> CompileReport:
    """inductor below float64: the low-precision check with the compiled function as the op and
    the eager one, at float64, as the reference (its baseline is the eager op's rounding)."""
    __tracebackhide__ = True
    from opcheck.engine.lowprec.check import lowprec_report

    ran_before = compiled.graphs.ran
    try:
        report = lowprec_report(
            compiled,
            tuple(inputs),
            reference=reference if reference is not None else fn,
            check_forward_ad=check_forward_ad,
            criterion=criterion,
            clone_inputs=clone_inputs,
            generator=gen,
        )
    except Exception as e:
        return _raised(compiled, e, "the compiled call or the float64 eager run raised")
    if compiled.graphs.ran == ran_before:
        return CompileReport(compiled.backend, compiled.graphs, ran_compiled=False)
    compared = tuple(p.what for p in report.parts)
    if report.error is None:
        return CompileReport(compiled.backend, compiled.graphs, compared, report.notes)
    first = report.first_failure
    what = first.what if first is not None else "the call"
    return CompileReport(compiled.backend, compiled.graphs, compared, report.notes, report.message, what)
