"""Which tests ran a kernel through the interpreter, and what a failure says about it.

A failure's header names the interpreter, and its rerun line sets TRITON_INTERPRET=1, only where
the failing test launched an interpreted kernel: other tests' messages stay as they are.
"""

from __future__ import annotations

import os
import sys

from opcheck.triton._patch import Patch, is_patched, mark, require

INTERPRET_ENV = "TRITON_INTERPRET"
_interpreted: set[str] = set()
"""Node ids of the tests (as opcheck.runtime.context knows them) that launched an interpreted kernel."""


def _current_test() -> str | None:
    context = sys.modules.get("opcheck.runtime.context")
    item = context.current_item.get() if context is not None else None
    return getattr(item, "nodeid", None)


def _recording(original):
    def __call__(self, *args, **kwargs):
        test = _current_test()
        if test is not None:
            _interpreted.add(test)
        return original(self, *args, **kwargs)

    return mark(__call__, wraps=original)


def _apply() -> None:
    from triton.runtime import interpreter

    # Every interpreted launch, autotuned or not, goes through a GridExecutor call.
    executor = getattr(interpreter, "GridExecutor", None)
    require(isinstance(executor, type) and "__call__" in vars(executor), "the interpreter has no GridExecutor")
    assert executor is not None  # for the type checker: the guard above raised otherwise
    if not is_patched(executor.__call__):
        executor.__call__ = _recording(executor.__call__)


def ran_interpreted(nodeid: str | None) -> bool:
    """Whether the test `nodeid` launched a kernel through the interpreter in this process."""
    return nodeid is not None and nodeid in _interpreted


def interpreter_note(nodeid: str | None) -> str | None:
    """The failure header's line about the interpreter, or None where the test ran no interpreted kernel."""
    if not ran_interpreted(nodeid):
        return None
    from opcheck.triton import status

    how = "set by opcheck: torch sees no GPU" if status().set_by_opcheck else "set in the environment"
    return f"Triton kernels ran in Triton's interpreter on the CPU ({INTERPRET_ENV}=1, {how})"


def rerun_prefix(nodeid: str | None) -> str:
    """`TRITON_INTERPRET=1 ` before the rerun command of a test that ran interpreted kernels."""
    return f"{INTERPRET_ENV}=1 " if ran_interpreted(nodeid) else ""


DRIVER_ERRORS = ("active drivers", "Pointer argument cannot be accessed from Triton (cpu tensor?)")


def hint(error: BaseException) -> str:
    """What to do about a Triton kernel that was compiled for a GPU but got CPU tensors, or found no GPU
    ("": not that)."""
    message = str(error)
    if "triton" not in sys.modules or not any(text in message for text in DRIVER_ERRORS):
        return ""
    setting = os.environ.get(INTERPRET_ENV)
    why = (
        f"{INTERPRET_ENV}={setting} in the environment turned the interpreter off"
        if setting not in (None, "", "1")
        else "the kernel was made before the interpreter was turned on, or the project turned it off "
        "([tool.opcheck] triton_interpret = false)"
    )
    return (
        "this Triton kernel was compiled for a GPU, and it got CPU tensors or found no GPU driver. "
        f"Without a GPU, Triton kernels run on CPU tensors through Triton's interpreter, which opcheck turns on "
        f"by itself; here {why}. Run with {INTERPRET_ENV}=1 (or call opcheck.triton.setup() before the kernels "
        f"are defined), or run the tests on a GPU (--opcheck-device cuda)."
    )


PATCHES = (
    Patch(
        "failure notes",
        "a failing test that ran interpreted kernels says so, and its rerun line sets TRITON_INTERPRET=1",
        _apply,
    ),
)
