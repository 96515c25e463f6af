"""The per-test time budget: a generated test that runs past it is stopped, and fails saying where the
time went and what to change.

The plugin puts the budget of each generated test (`--opcheck-time-budget`, `[tool.opcheck]
time_budget`) in `current_budget` around its call; `run_check` runs the check inside
`within_time_budget(case)`, which

- meters the op: every call of the op the sample's calls make goes through `OpMeter.wrap` (set
  as samples.OP_WRAPPER while the check runs, it wraps the op `samples.op_callable` returns), which
  counts the calls and their seconds: two clock reads per call. Forward AD runs inside those calls
  (a tangent is computed as the op runs), so its time is the op's; the op's backward runs later, in
  autograd, so the meter hooks the autograd nodes the call made (up to MAX_BACKWARD_NODES of them,
  hooks that go with the graph) and adds the time inside them to the op's;
- arms one watchdog thread, shared by every test of the process (arming is an assignment under a
  lock, no thread per test). At the deadline the watchdog interrupts the thread running the check:
  a signal of its own sent to that thread (`INTERRUPT_SIGNAL`, a real-time signal on Linux, never
  SIGALRM, which pytest-timeout's signal method uses), whose handler raises at the next Python
  bytecode, which ends pure-Python loops and `time.sleep`; without `pthread_kill` (Windows) or off
  the main thread, an asynchronous exception, which ends Python loops only. The interrupt is a
  BaseException, so an `except Exception` in the op or the engine does not swallow it; it is sent
  again every REPEAT seconds while the test goes on. It never lands inside an import (a module left
  half imported would break every later test of the process): it waits for the import to end;
- turns the interrupt into `TimeBudgetExceeded`, an AssertionError whose message names the check,
  its derivative path and policy, the op's calls and backward passes (how many, their seconds, the
  one running when the test was stopped), where the interrupt landed, and the changes that make the
  test fit (a smaller sample, `fast_mode: true`, another device this machine has, a longer budget).
  A call of the op (or its backward) still running at the deadline after half the budget or more is
  a hang, not a cost: the hints then name that call and what makes a kernel never return.

Nothing here imports torch: the process that supervises a run, which must start fast, uses it.

Code that never returns to Python (a deadlock inside a C++ or CUDA kernel) ignores the signal;
`set_overdue_listener` lets the process that supervises this one (opcheck.isolation) hear the
watchdog's account when the budget runs out, and end the process after a grace period.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from opcheck.failure_facts import FailureFacts, hint_lines
from opcheck.runtime.outcomes import CheckFailure

if TYPE_CHECKING:
    from opcheck.runtime.report import Case

_GRADIENT_CHECKS = ("gradcheck", "forward_ad", "gradgradcheck", "fwgrad_bwgrad")
"""The checks whose cost `fast_mode` sets."""

METER_FILE = __file__
"""Where OpMeter's wrapper is defined: stacks that show where a test was leave its frame out."""

REPEAT = 0.25
"""Seconds between interrupts of a test that goes on after the first: one that swallowed it, or
one that was importing a module (an import is never interrupted: the module would stay half made)."""

HANG_SHARE = 0.5
"""A call of the op, or its backward, still running at the deadline after this share of the budget is
named a hang: no smaller sample or fast_mode makes one call return (a check makes many calls)."""

HANG_WORDS = "a hang:"
"""How the account names a hang (the supervisor's hints, chosen from the account it heard, look for it)."""

MAX_BACKWARD_NODES = 64
"""Autograd nodes of one call of the op whose time counts as its backward's (a composite op's graph
beyond these: its time is the check's)."""

INTERRUPT_SIGNAL: int | None = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else getattr(signal, "SIGUSR2", None)
"""The signal the watchdog sends; None where threads cannot be signalled (Windows)."""


@dataclass(frozen=True)
class TimeBudget:
    """Seconds a test may run, and where that number was set (for the message)."""

    seconds: float
    source: str = "default"

    def describe(self) -> str:
        return f"{format_seconds(self.seconds)} ({self.source})"


current_budget: ContextVar[TimeBudget | None] = ContextVar("opcheck_time_budget", default=None)
"""The budget of the test running in this context; None: no budget (outside pytest, or off)."""


class TimeBudgetExceeded(CheckFailure):
    """A test ran past its time budget; the message says where the time went and what to change."""


class _Interrupt(BaseException):
    """Raised in the check's thread at the deadline; a BaseException so that `except Exception` lets it by."""

    def __init__(self, stack: list[str] | None = None, account: str = "") -> None:
        super().__init__("time budget exceeded")
        self.stack = stack or []
        self.account = account  # where the time went, when the interrupt landed


# ------------------------------------------------------------------------------------ metering
class OpMeter:
    """How many times the op was called, and for how long (a vmapped call counts once); how many
    times its backward ran, and for how long."""

    __slots__ = (
        "calls",
        "seconds",
        "slowest",
        "running_since",
        "shapes",
        "backward_passes",
        "backward_seconds",
        "backward_since",
        "_depth",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self.slowest = 0.0
        self.running_since: float | None = None  # perf_counter() when the call in progress started
        self.shapes: list[tuple[int, ...]] | None = None  # the tensors of the first call
        self.backward_passes = 0
        self.backward_seconds = 0.0
        self.backward_since: float | None = None  # perf_counter() when the op's backward node in progress started
        self._depth = 0  # the op's backward nodes in progress (one inside another: a nested backward)

    def wrap(self, op: Callable) -> Callable:
        meter = self

        def metered(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            if meter.shapes is None:
                meter.shapes = [tuple(a.shape) for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
            # A forward call: no backward of the op is in progress (one that raised left no end behind)
            meter.backward_since, meter._depth = None, 0
            start = time.perf_counter()
            meter.running_since = start
            try:
                out = op(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                meter.running_since = None
                meter.calls += 1
                meter.seconds += elapsed
                if elapsed > meter.slowest:
                    meter.slowest = elapsed
            meter.hook_backward(args, out)
            return out

        metered.__name__ = getattr(op, "__name__", "op")
        metered.__qualname__ = getattr(op, "__qualname__", metered.__name__)
        metered.__doc__ = getattr(op, "__doc__", None)
        return metered

    def hook_backward(self, args: tuple[Any, ...], out: Any) -> None:
        """Time the autograd nodes this call of the op made when a backward runs them (the hooks
        live on the nodes, and go with the graph)."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.is_grad_enabled():
            return
        try:
            nodes = _backward_nodes(args, out)
            for k, node in enumerate(nodes):
                if k == 0:  # the first output's node runs once per backward pass through the op
                    node.register_prehook(self._pass_starts)
                node.register_prehook(self._node_starts)
                node.register_hook(self._node_ends)
        except Exception:  # noqa: BLE001 - a graph the hooks cannot reach (a transform's wrapper): untimed
            return

    def _pass_starts(self, grad_outputs: Any) -> None:
        self.backward_passes += 1

    def _node_starts(self, grad_outputs: Any) -> None:
        if self._depth == 0:
            self.backward_since = time.perf_counter()
        self._depth += 1

    def _node_ends(self, grad_inputs: Any, grad_outputs: Any) -> None:
        self._depth = max(0, self._depth - 1)
        since = self.backward_since
        if self._depth == 0 and since is not None:
            self.backward_seconds += time.perf_counter() - since
            self.backward_since = None

    def running(self) -> tuple[str, float] | None:
        """What of the op is running now (its "call" or its "backward"), and for how many seconds."""
        now = time.perf_counter()
        if self.running_since is not None:
            return "call", now - self.running_since
        if self.backward_since is not None:
            return "backward", now - self.backward_since
        return None


def _backward_nodes(args: tuple[Any, ...], out: Any) -> list[Any]:
    """The autograd nodes a call of the op made: from its outputs' nodes back to its inputs' (never
    past them), at most MAX_BACKWARD_NODES, the first output's first."""
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    roots = [o.grad_fn for o in outputs if getattr(o, "grad_fn", None) is not None]
    if not roots:
        return []
    before = {id(a.grad_fn) for a in args if getattr(a, "grad_fn", None) is not None}
    found: list[Any] = []
    seen: set[int] = set()
    todo = list(roots)
    while todo and len(found) < MAX_BACKWARD_NODES:
        node = todo.pop(0)
        if node is None or id(node) in seen or id(node) in before or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(id(node))
        found.append(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return found


@contextlib.contextmanager
def _metering(meter: OpMeter) -> Iterator[None]:
    """Every op that samples.op_callable resolves while the block runs is `meter.wrap`ped."""
    from opcheck.runtime.samples import OP_WRAPPER

    token = OP_WRAPPER.set(meter.wrap)
    try:
        yield
    finally:
        OP_WRAPPER.reset(token)


# ------------------------------------------------------------------------------------ the watchdog
@dataclass(eq=False)
class _Watch:
    """One test under a budget, as the watchdog sees it."""

    budget: TimeBudget
    meter: OpMeter
    case: Case
    thread: int  # threading.get_ident() of the thread running the check
    signals: bool  # whether that thread can be interrupted by INTERRUPT_SIGNAL
    test_id: str  # the pytest node id, else the case's own id
    policy: str | None  # how the check's fast_mode was chosen, for gradient checks
    started: float  # time.monotonic()
    deadline: float
    armed: bool = True
    fired: bool = False
    account: str = ""  # where the time went, when its time ran out
    hang: tuple[str, float, int] | None = None  # the op's call or backward not returned at the deadline: _hang


_listener: Callable[[str, str], None] | None = None


def set_overdue_listener(listener: Callable[[str, str], None] | None) -> None:
    """`listener(test id, account)` is called from the watchdog thread when a test runs out of time."""
    global _listener
    _listener = listener


class _Watchdog:
    """One daemon thread that interrupts the test armed in it at its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._watch: _Watch | None = None
        self._thread: threading.Thread | None = None
        self._waking_at: float | None = None  # the deadline the thread sleeps towards; None: until notified

    def arm(self, watch: _Watch) -> None:
        with self._lock:
            self._watch = watch
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="opcheck-time-budget", daemon=True)
                self._thread.start()
            elif self._waking_at is None or watch.deadline < self._waking_at:
                self._lock.notify()  # else it wakes before this deadline anyway, and sleeps on towards it

    def disarm(self, watch: _Watch) -> None:
        watch.armed = False  # first: a signal already on its way finds the test gone
        with self._lock:  # the thread interrupts under this lock: none is in flight past it
            if self._watch is watch:
                self._watch = None
            if watch.fired and not watch.signals:  # an asynchronous exception not raised yet is dropped
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(watch.thread), None)

    def current(self, thread: int) -> _Watch | None:
        """The armed test running on `thread` whose budget ran out (read by the signal handler, lock-free)."""
        watch = self._watch
        if watch is not None and watch.armed and watch.fired and watch.thread == thread:
            return watch
        return None

    def _run(self) -> None:
        with self._lock:
            while True:
                watch = self._watch
                if watch is None or not watch.armed:
                    self._waking_at = None
                    self._lock.wait()
                    continue
                now = time.monotonic()
                if now < watch.deadline:
                    self._waking_at = watch.deadline
                    self._lock.wait(watch.deadline - now)
                    continue
                if not watch.fired:
                    watch.hang = _hang(watch)
                    watch.account = account(watch, now)
                    watch.fired = True
                    if _listener is not None:
                        with contextlib.suppress(Exception):
                            _listener(watch.test_id, watch.account)
                watch.deadline = now + REPEAT
                _interrupt(watch)


_WATCHDOG = _Watchdog()
_installed: dict[str, Any] = {}  # "previous": the handler INTERRUPT_SIGNAL had before opcheck's


def _test_id(case: Case) -> str:
    from opcheck.runtime.context import current_item

    item = current_item.get()
    return item.nodeid if item is not None else case.id.nodeid()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    watch = _WATCHDOG.current(threading.get_ident())
    if watch is None:  # not ours: a test that ended as the signal came, or someone else's use of it
        previous = _installed.get("previous")
        if callable(previous):
            previous(signum, frame)
        return
    if _importing(frame):  # the watchdog tries again in REPEAT seconds
        return
    watch.hang = _hang(watch)  # what runs where the test is stopped (the deadline may have found it elsewhere)
    raise _Interrupt(_stack(frame), account(watch))


def _importing(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside an import (importlib's bootstrap is on its stack)."""
    depth = 0
    while frame is not None and depth < 500:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
        depth += 1
    return False


def _signals_usable() -> bool:
    """Whether the watchdog can interrupt this thread with INTERRUPT_SIGNAL (installing the handler once)."""
    if INTERRUPT_SIGNAL is None or not hasattr(signal, "pthread_kill"):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False  # Python runs signal handlers in the main thread only
    if "previous" not in _installed:
        _installed["previous"] = signal.signal(INTERRUPT_SIGNAL, _on_signal)
    elif signal.getsignal(INTERRUPT_SIGNAL) is not _on_signal:  # someone replaced it: take it back
        _installed["previous"] = signal.signal(INTERRUPT_SIGNAL, _on_signal)
    return True


def _interrupt(watch: _Watch) -> None:
    """Called by the watchdog thread: raise _Interrupt in the thread running the check."""
    if watch.signals:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pthread_kill(watch.thread, INTERRUPT_SIGNAL)  # type: ignore[arg-type]
        return
    if _importing(sys._current_frames().get(watch.thread)):
        return
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async(ctypes.c_ulong(watch.thread), ctypes.py_object(_Interrupt))


# ------------------------------------------------------------------------------------ running a check
class within_time_budget:  # noqa: N801 - used as a context manager, like contextlib's
    """Run the block (a check of `case`) within current_budget; past it, raise TimeBudgetExceeded."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.watch: _Watch | None = None
        self._metering: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> None:
        budget = current_budget.get()
        if budget is None:
            return
        meter = OpMeter()
        started = time.monotonic()
        self.watch = _Watch(
            budget,
            meter,
            self.case,
            threading.get_ident(),
            signals=_signals_usable(),
            test_id=_test_id(self.case),
            policy=_policy(self.case),
            started=started,
            deadline=started + budget.seconds,
        )
        self._metering = _metering(meter)
        self._metering.__enter__()
        _WATCHDOG.arm(self.watch)

    def __exit__(self, kind, error, trace) -> None:
        __tracebackhide__ = True
        watch = self.watch
        if watch is None:
            return
        _WATCHDOG.disarm(watch)
        if self._metering is not None:
            self._metering.__exit__(None, None, None)
        if isinstance(error, _Interrupt):
            message = budget_message(watch, error.stack, error.account or watch.account)
            raise TimeBudgetExceeded(message, FailureFacts(hints=tuple(hints(watch)))) from None


# ------------------------------------------------------------------------------------ the message
def format_seconds(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1000:.3g} ms"


def _path(case: Case) -> str:
    from opcheck.spec.model import LOWPREC, Check

    check = Check.parse(case.check)
    return f"{check.path}, at {case.dtype}" if check is LOWPREC else check.path


def _policy(case: Case) -> str | None:
    from opcheck.runtime.context import current_settings

    if case.check not in _GRADIENT_CHECKS:
        return None
    override = current_settings().policy
    if override:
        return f"--opcheck-policy {override}"
    return f"fast_mode {case.spec.gradcheck.fast_mode} from the spec"


def _hang(watch: _Watch) -> tuple[str, float, int] | None:
    """The op's call or backward still running at the deadline after HANG_SHARE of the budget or more:
    ("call" or "backward", its seconds, the op's calls that returned before it)."""
    running = watch.meter.running()
    if running is not None and running[1] >= HANG_SHARE * watch.budget.seconds:
        return (*running, watch.meter.calls)
    return None


def account(watch: _Watch, now: float | None = None) -> str:
    """Where the time went: the check, the op's calls and its backward, as of `now`."""
    now = time.monotonic() if now is None else now
    elapsed = now - watch.started
    case, meter, policy = watch.case, watch.meter, watch.policy
    where = f"{case.check} ({_path(case)}{', ' + policy if policy else ''})"
    running = meter.running()
    parts = [_op_calls(meter, running, _checks_forward_ad(case))]
    if meter.backward_passes or meter.backward_seconds:
        passes = meter.backward_passes
        parts.append(
            f"its backward ran {passes} time{'s' if passes != 1 else ''}, {format_seconds(meter.backward_seconds)} "
            "in all"
        )
    hang = watch.hang
    if running is not None:
        what = "backward" if running[0] == "backward" else "call"
        if meter.calls == 0 and what == "call":
            parts[0] = f"the op's first call had run {format_seconds(running[1])} and was still running"
        else:
            parts.append(f"one more {what} had run {format_seconds(running[1])} and was still running")
        if hang is not None:
            parts[-1] += f" ({_hang_words(watch, hang)})"
    op_seconds = meter.seconds + meter.backward_seconds + (running[1] if running is not None else 0.0)
    rest = max(elapsed - op_seconds, 0.0)
    return (
        f"{format_seconds(elapsed)} in {where}: {'; '.join(parts)}; the check's own work (autograd outside the "
        f"op, finite differences, comparisons) took the other {format_seconds(rest)}"
    )


def _checks_forward_ad(case: Case) -> bool:
    """Whether the check's forward-mode calls (JVPs) are among the op's calls: they run inside them."""
    from opcheck.spec.model import Check

    return Check.parse(case.check).forward_ad


def _op_calls(meter: OpMeter, running: tuple[str, float] | None, forward_ad: bool) -> str:
    if meter.calls == 0:
        return "the op was not called yet"
    inside = " (forward AD runs inside them)" if forward_ad else ""
    return (
        f"the op returned from {meter.calls} call{'s' if meter.calls != 1 else ''}{inside}, "
        f"{format_seconds(meter.seconds)} in all ({format_seconds(meter.seconds / meter.calls)} per call, "
        f"the slowest {format_seconds(meter.slowest)})"
    )


def _hang_words(watch: _Watch, hang: tuple[str, float, int]) -> str:
    share, what = hang[1] / watch.budget.seconds, "backward" if hang[0] == "backward" else "call"
    return f"{HANG_WORDS} {share:.0%} of the budget in one {what}, not a cost"


def _stack(frame: FrameType | None, limit: int = 8) -> list[str]:
    """`file:line in function`, innermost first, of the frames the interrupt landed in (budget.py's left out)."""
    lines = []
    for summary in reversed(traceback.extract_stack(frame, limit=limit + 4)):
        if summary.filename == __file__:
            continue
        lines.append(f"{_shown(summary.filename)}:{summary.lineno} in {summary.name}")
    return lines[:limit]


def _shown(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def budget_message(watch: _Watch, stack: list[str], text: str) -> str:
    from opcheck.runtime.report import format_failure

    case, budget = watch.case, watch.budget
    body = [f"where the time went: {text or account(watch)}"]
    if stack:
        body.append("stopped at (innermost first):")
        body += [f"  {line}" for line in stack]
    body += hint_lines(hints(watch))
    return format_failure(
        case,
        headline=f"opcheck {case.check} exceeded its time budget of {budget.describe()} for {case.spec.op} on "
        f"{case.device}/{case.dtype}, sample {case.sample.name!r}",
        body="\n".join(body),
        path=_path(case),
        policy=watch.policy,
    )


def hints(watch: _Watch) -> list[str]:
    """Concrete changes that make the test fit its budget, or, for a hang, what to look at."""
    case, meter = watch.case, watch.meter
    shapes = ", ".join(str(list(s)) for s in meter.shapes or []) or "its tensors"
    if watch.hang is not None:
        return _hang_hints(watch, shapes) + [_longer_budget(watch, "if one call is only this slow")]
    out = [
        f"a smaller sample: {case.sample.name!r} at {case.location} ({shapes}); a gradient check calls the op "
        f"about twice per input element for the full Jacobian, and its cost grows with input x output elements"
    ]
    if case.check in _GRADIENT_CHECKS and case.spec.gradcheck.fast_mode != "true":
        out.append(
            f"`fast_mode: true` under `gradcheck:` in {case.spec.source}: one random projection per input/output "
            f"pair (torch's fast mode, a few calls of the op, which misses errors in a few entries); it applies to "
            f"every sample, so give {case.sample.name!r} a spec of its own to keep the others' full check, or run "
            f"with --opcheck-policy fast once"
        )
    faster = _other_devices_here(case)
    if case.device == "cpu" and faster:
        listed = ", ".join(faster)
        out.append(f"another device this machine has: the spec lists {listed} (--opcheck-device {faster[0]})")
    out.append("`opcheck list --cost` estimates each test's calls and seconds before a run, and what makes it cheaper")
    out.append(_longer_budget(watch, "if this is the test's normal time"))
    return out


def _hang_hints(watch: _Watch, shapes: str) -> list[str]:
    """What a call that does not return asks for: not a cheaper check (a smaller sample, fast_mode still
    make that call), but the call itself."""
    case, (what, seconds, returned) = watch.case, watch.hang or ("call", 0.0, 0)
    call = "the op's backward" if what == "backward" else "a call of the op"
    first = " (its first)" if what == "call" and returned == 0 else ""
    return [
        f"{call}{first} on {case.device}/{case.dtype} with inputs {shapes} (sample {case.sample.name!r} at "
        f"{case.location}) had not returned after {format_seconds(seconds)}: a loop in the kernel that never ends "
        f"(a bound or mask that does not advance, a while loop on a value that never changes), a deadlock (a lock, "
        f"a barrier or a wait on another stream or process), or input the kernel never finishes on; the stack "
        f"above is where it was",
        f"rerun this test alone to see whether that call returns at all; the op's {returned} call(s) before it "
        "returned",
    ]


def _longer_budget(watch: _Watch, when: str) -> str:
    from opcheck.config import TABLE

    suggestion = int(max(watch.budget.seconds * 4, 60))
    return (
        f"a longer budget, {when}: --opcheck-time-budget {suggestion}, or time_budget = {suggestion} in {TABLE} "
        "(off: no budget)"
    )


def _other_devices_here(case: Case) -> list[str]:
    """The devices the spec lists, other than the cpu and the test's, that this machine has."""
    from opcheck.runtime.devices import unavailable_reason

    return [d for d in case.spec.devices if d not in (case.device, "cpu") and unavailable_reason(d) is None]
