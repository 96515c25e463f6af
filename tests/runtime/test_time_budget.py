"""The per-test time budget (opcheck.runtime.budget): run_check past its budget stops, and says where
the time went and what to change; without a budget nothing is wrapped or armed."""

from __future__ import annotations

import re
import signal
import sys
import time

import budget_ops
import pytest

from opcheck.runtime import budget, run_check, samples
from opcheck.runtime import devices as budget_devices
from opcheck.runtime.budget import TimeBudget, TimeBudgetExceeded, current_budget
from opcheck.runtime.context import ItemContext, Settings, current_item
from opcheck.spec.model import GradcheckFlags, GradgradcheckFlags, Location, OpSpec, Sample, TensorArg

NODEID = "generated_tests/test_x.py::test_gradcheck[cpu-float64-vec]"
VEC = Sample("vec", args=(TensorArg(shape=(3,)),), location=Location("op_specs/x.yaml", 7, 5))
needs_signals = pytest.mark.skipif(budget.INTERRUPT_SIGNAL is None, reason="threads cannot be signalled here")


ROW = Sample("row", args=(TensorArg(shape=(8,)),), location=Location("op_specs/x.yaml", 9, 5))


def spec(op: str, **fields) -> OpSpec:
    fields.setdefault("gradgradcheck", GradgradcheckFlags(enabled=False))
    return OpSpec(name="x", op=f"budget_ops:{op}", source="op_specs/x.yaml", sha256="0", samples=(VEC, ROW), **fields)


@pytest.fixture
def within():
    """Run checks as the plugin does: under an item, with `seconds` of budget."""
    tokens = []

    def enter(seconds: float, settings: Settings | None = None) -> None:
        ctx = ItemContext(nodeid=NODEID, rerun=f"pytest '{NODEID}'", settings=settings or Settings())
        tokens.append((current_item, current_item.set(ctx)))
        tokens.append((current_budget, current_budget.set(TimeBudget(seconds, "--opcheck-time-budget"))))

    yield enter
    for var, token in reversed(tokens):
        var.reset(token)


def stopped(op: str, sample: str = "vec", **fields) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(TimeBudgetExceeded) as info:
        run_check(spec(op, **fields), "gradcheck", "cpu", "float64", sample)
    return str(info.value), time.monotonic() - start


@needs_signals
def test_a_sleeping_op_is_stopped_and_the_message_says_where_and_what_to_change(within):
    within(0.3)
    message, took = stopped("sleeps")
    assert took < 5
    first = message.splitlines()[0]
    assert first == (
        "opcheck gradcheck exceeded its time budget of 300 ms (--opcheck-time-budget) for budget_ops:sleeps on "
        "cpu/float64, sample 'vec'"
    )
    assert "check path:  VJP" in message and "rerun:       pytest 'generated_tests/test_x.py" in message
    assert "where the time went: " in message and "in gradcheck (VJP, fast_mode auto from the spec)" in message
    assert "the op's first call had run" in message and "was still running" in message, message
    assert "stopped at (innermost first):" in message and "budget_ops.py:" in message and "in sleeps" in message


@needs_signals
def test_a_call_that_never_returns_is_a_hang_with_hints_that_fit_one(within):
    """No smaller sample or fast_mode makes one call return: the hints name the call instead."""
    within(0.3)
    message, _ = stopped("sleeps")
    assert "was still running (a hang: " in message and "% of the budget in one call, not a cost)" in message
    hints = [line for line in message.splitlines() if line.startswith("hint: ")]
    assert hints[0].startswith(
        "hint: a call of the op (its first) on cpu/float64 with inputs [3] (sample 'vec' at op_specs/x.yaml:7:5) "
        "had not returned after "
    )
    assert "a loop in the kernel that never ends" in hints[0] and "a deadlock" in hints[0]
    assert hints[1].startswith("hint: rerun this test alone to see whether that call returns at all; the op's 0 call")
    assert hints[-1].startswith("hint: a longer budget, if one call is only this slow: --opcheck-time-budget 60")
    assert "smaller sample" not in message and "fast_mode: true" not in message


@needs_signals
def test_a_backward_that_never_returns_is_a_hang_of_the_op_s_backward(within, monkeypatch):
    monkeypatch.setitem(budget_ops.SEEN, "backward_seconds", 0)
    within(60)
    run_check(spec("slow_backward"), "gradcheck", "cpu", "float64", "vec")  # the engine's first use imports
    monkeypatch.setitem(budget_ops.SEEN, "backward_seconds", 30)
    within(0.3)
    message, took = stopped("slow_backward")
    assert took < 5
    assert (
        "one more backward had run " in message and "(a hang: " in message and "in one backward, not a cost" in message
    )
    hints = [line for line in message.splitlines() if line.startswith("hint: ")]
    assert hints[0].startswith("hint: the op's backward on cpu/float64 with inputs [3]"), hints


def test_the_op_s_backward_is_counted_as_the_op_s_time(within):
    """A kernel's backward runs in autograd, after its call returned: its time is still the op's."""
    within(0.25)  # a VJP per output row, 60 ms each
    message, _ = stopped("slow_backward", "row", gradcheck=GradcheckFlags(fast_mode="false", check_batched_grad=False))
    assert re.search(r"its backward ran \d+ times?, [\d.]+ m?s in all", message), message
    assert "forward AD" not in message  # a VJP check makes no forward-mode calls


def test_a_slow_check_gets_a_cheaper_check_and_only_devices_this_machine_has(within, monkeypatch):
    within(0.25)
    slow = GradcheckFlags(fast_mode="false", check_batched_grad=False)
    monkeypatch.setattr(budget_devices, "unavailable_reason", lambda device: f"{device} is not here")
    message, _ = stopped("slow_calls", "row", gradcheck=slow)
    hints = [line for line in message.splitlines() if line.startswith("hint: ")]
    assert hints[0].startswith("hint: a smaller sample: 'row' at op_specs/x.yaml:9:5 ([8])")
    assert "`fast_mode: true` under `gradcheck:` in op_specs/x.yaml" in hints[1]
    assert "a hang" not in message and not any("device" in h for h in hints), hints
    assert hints[-1].startswith("hint: a longer budget, if this is the test's normal time: --opcheck-time-budget 60")
    monkeypatch.setattr(budget_devices, "unavailable_reason", lambda device: None if device == "cuda" else "no")
    message, _ = stopped("slow_calls", "row", gradcheck=slow)
    assert "hint: another device this machine has: the spec lists cuda (--opcheck-device cuda)" in message


def test_a_python_loop_is_stopped(within):
    within(0.3)
    message, took = stopped("loops")
    assert took < 5 and "in loops" in message


@needs_signals
def test_except_exception_in_the_op_does_not_swallow_the_interrupt(within):
    within(0.3)
    _, took = stopped("swallows")
    assert took < 5


@needs_signals
def test_an_import_is_never_interrupted(within, tmp_path, monkeypatch):
    """A module left half imported would break every later test of the process."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(1)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(budget_ops.SEEN, "module", "slow_to_import")
    within(0.3)
    message, took = stopped("imports_slowly")
    assert sys.modules["slow_to_import"].DONE and "in loops" in message and took >= 1


@needs_signals
def test_a_forward_ad_check_says_its_jvps_ran_inside_the_op_s_calls(within):
    within(0.25)  # the forward-AD check calls the op once per input element or more, 50 ms each
    flags = GradcheckFlags(fast_mode="false", check_batched_grad=False, check_forward_ad=True)
    with pytest.raises(TimeBudgetExceeded) as info:
        run_check(spec("slow_calls", gradcheck=flags), "forward_ad", "cpu", "float64", "row")
    assert " calls (forward AD runs inside them), " in str(info.value), str(info.value)


def test_the_op_calls_are_counted(within):
    within(0.25)  # the full check of 8 elements calls the op 17 times or more, 50 ms each
    message, _ = stopped("slow_calls", "row", gradcheck=GradcheckFlags(fast_mode="false", check_batched_grad=False))
    assert "the op returned from " in message and " calls, " in message
    assert " per call, the slowest " in message


def test_the_policy_given_on_the_command_line_is_named(within):
    within(0.25, Settings(policy="full"))
    message, _ = stopped("slow_calls", "row")  # slow, not hung: a cheaper check helps
    assert "in gradcheck (VJP, --opcheck-policy full)" in message
    assert "`fast_mode: true`" in message  # a spec change still helps the next runs


def test_a_stopped_test_leaves_nothing_armed(within):
    within(0.3)
    stopped("loops")
    time.sleep(budget.REPEAT + 0.5)  # a stray interrupt would land here
    within(60)
    run_check(spec("slow_calls"), "gradcheck", "cpu", "float64", "vec")
    assert samples.OP_WRAPPER.get() is None


def test_without_a_budget_the_op_is_not_wrapped_and_nothing_is_armed(monkeypatch):
    seen = []
    monkeypatch.setattr(budget, "_metering", lambda meter: seen.append(meter))
    run_check(spec("slow_calls"), "gradcheck", "cpu", "float64", "vec")
    assert seen == [] and samples.OP_WRAPPER.get() is None


def test_a_check_within_its_budget_passes_and_restores_the_op_resolution(within):
    within(60)
    run_check(spec("slow_calls"), "gradcheck", "cpu", "float64", "vec")
    assert samples.OP_WRAPPER.get() is None


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="no SIGALRM here")
def test_sigalrm_is_left_to_pytest_timeout(within):
    """pytest-timeout's signal method arms SIGALRM with setitimer; the budget uses neither."""
    within(60)
    before = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    run_check(spec("watches_alarm"), "gradcheck", "cpu", "float64", "vec")
    assert (budget_ops.SEEN["handler"], budget_ops.SEEN["timer"]) == before
    assert budget.INTERRUPT_SIGNAL != signal.SIGALRM


_OFF_THE_MAIN_THREAD = """
import sys, threading
sys.path[:0] = [HERE]
from test_time_budget import NODEID, spec
from opcheck.runtime import run_check
from opcheck.runtime.budget import TimeBudget, TimeBudgetExceeded, current_budget
from opcheck.runtime.context import ItemContext, Settings, current_item
outcome = {}

def run():
    current_item.set(ItemContext(nodeid=NODEID, rerun="", settings=Settings()))
    current_budget.set(TimeBudget(0.3))
    try:
        run_check(spec("loops"), "gradcheck", "cpu", "float64", "vec")
    except TimeBudgetExceeded as e:
        outcome["error"] = e

thread = threading.Thread(target=run)
thread.start()
thread.join(10)
print("alive" if thread.is_alive() else str(outcome.get("error")))
"""


def test_a_check_off_the_main_thread_is_stopped_too():
    """Signals reach the main thread only; elsewhere an asynchronous exception stops Python loops.

    In a process of its own: after it, a later test of the same process that runs a module under
    sys.setprofile (tests/codegen/test_hostile_modules.py) spun without end."""
    import subprocess
    from pathlib import Path

    here = str(Path(__file__).parent)
    code = _OFF_THE_MAIN_THREAD.replace("[HERE]", f"[{here!r}]")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert "exceeded its time budget of 300 ms (default)" in done.stdout, done.stdout + done.stderr


def test_the_overdue_listener_hears_where_the_time_went(within):
    heard = []
    budget.set_overdue_listener(lambda nodeid, account: heard.append((nodeid, account)))
    try:
        within(0.3)
        stopped("loops")
    finally:
        budget.set_overdue_listener(None)
    ((nodeid, account),) = heard
    assert nodeid == NODEID and " in gradcheck (VJP, fast_mode auto from the spec): " in account


@pytest.mark.parametrize(
    "seconds, shown", [(0.0123, "12.3 ms"), (2, "2 s"), (2.5, "2.5 s"), (90, "90 s"), (600, "600 s")]
)
def test_format_seconds(seconds, shown):
    assert budget.format_seconds(seconds) == shown


def test_the_interrupt_is_not_an_exception_and_the_failure_is_an_assertion():
    assert not issubclass(budget._Interrupt, Exception) and issubclass(TimeBudgetExceeded, AssertionError)
