"""What one interpreter patch is and what applying it gave: the record setup() returns and the
README lists, one line each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar


class NotApplicable(Exception):
    """A patch's guard found what it patches missing or shaped otherwise; the message says what."""


@dataclass(frozen=True)
class Patch:
    """One change to Triton's interpreter (or to torch's device queries) for CPU runs.

    `apply` patches, or raises NotApplicable saying why this triton cannot take it; it is called
    at most once per process (setup() remembers what it did).
    """

    name: str
    description: str
    apply: Callable[[], None]


@dataclass(frozen=True)
class PatchResult:
    name: str
    description: str
    applied: bool
    reason: str = ""  # why it was not applied

    def describe(self) -> str:
        if self.applied:
            return f"{self.name}: {self.description}"
        return f"{self.name}: NOT applied ({self.reason})"


def run_patch(patch: Patch) -> PatchResult:
    try:
        patch.apply()
    except NotApplicable as e:
        return PatchResult(patch.name, patch.description, applied=False, reason=str(e))
    return PatchResult(patch.name, patch.description, applied=True)


def require(condition: bool, what: str) -> None:
    """The guard of a patch: `what` names the shape found where the patch expected another."""
    if not condition:
        import triton

        raise NotApplicable(f"triton {triton.__version__}: {what}")


def parameters(fn: object) -> list[str]:
    """The parameter names of `fn` ([] when it has no signature): the shape a guard checks."""
    import inspect

    try:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []


PATCHED = "__opcheck_patched__"
"""Set on each function opcheck puts in place, so that a second setup() does not wrap it twice."""


WRAPPED = "__wrapped__"
"""The function a replacement calls, as functools.wraps names it: what undoing the patch puts back."""

_F = TypeVar("_F", bound=Callable)


def mark(fn: _F, wraps: Callable | None = None) -> _F:
    """`fn`, marked as opcheck's; `wraps`: the function it replaces and calls."""
    setattr(fn, PATCHED, True)
    if wraps is not None:
        setattr(fn, WRAPPED, wraps)
    return fn


def is_patched(fn: object) -> bool:
    return getattr(fn, PATCHED, False) is True


def source_of(fn) -> str:
    """fn's source text, or "" where it cannot be read (a builtin, a function made at run time)."""
    import inspect

    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""
