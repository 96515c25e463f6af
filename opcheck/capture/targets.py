"""Which calls `opcheck capture` records: each `--op` selection as a matcher, in the child process.

A selection is written as specs write `op:`, plus two forms that name many ops at once:

- `torch.nn.functional.gelu`, `torch.softmax`, `torch.Tensor.matmul`: torch's own functions and
  methods, seen by a TorchFunctionMode at the call the user's code makes (the same function object,
  so `F.softmax` and `x.softmax` are two selections);
- `torch.ops.NS.OP` or `torch.ops.NS.OP.OVERLOAD`: a torch.library operator, seen when Python calls
  it (through torch.ops, or the function `torch.library.custom_op` returned); `torch.ops.NS` takes
  every operator of the namespace;
- `aten.OP` / `aten::OP` / `torch.ops.aten.OP[.OVERLOAD]`: an aten operator wherever it reaches the
  dispatcher, below every Python spelling (`x @ w` and `F.linear` both reach aten.mm/addmm), seen by
  a TorchDispatchMode;
- `pkg.mod:Attr.path` or a dotted path outside torch (`examples.ops:Square.apply`,
  `mypkg.kernels.rms_norm`): a Python callable or autograd.Function's `apply`, replaced for the run
  by a wrapper that records and calls it (in memory only: no file changes), in its module and in
  every loaded module that holds the same object.

Only the outermost recorded call counts: an op recorded inside another recorded op's call (a
custom op's implementation calling aten) is part of that call.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_ATEN_SHORT = re.compile(r"^aten(?:\.|::)(?P<op>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<overload>[A-Za-z_][A-Za-z0-9_]*))?$")
_TORCH_OPS = re.compile(
    r"^torch\.ops\.(?P<ns>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<op>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:\.(?P<overload>[A-Za-z_][A-Za-z0-9_]*))?)?$"
)


_MISSING = object()


class SelectionError(ValueError):
    """An `--op` that names nothing recordable (the message says which and why)."""


@dataclass(frozen=True)
class Selection:
    """One `--op`, parsed: how its calls are seen, and the spec `op:` path a call is written under."""

    text: str  # as the user wrote it
    kind: str  # "function" (TorchFunctionMode), "library" (torch.ops, function mode), "aten" (dispatch), "patch"
    path: str  # the op path: "torch.nn.functional.gelu", "torch.ops.ns.op", "pkg.mod:Square.apply"
    namespace: str | None = None  # library/aten: the namespace
    op: str | None = None  # library/aten: the operator (None: every operator of the namespace)
    overload: str | None = None  # library/aten: one overload only


def parse_selection(text: str) -> Selection:
    """The selection `--op text` names (without importing anything)."""
    text = text.strip()
    short = _ATEN_SHORT.match(text)
    if short:
        return _ops_selection(text, "aten", short["op"], short["overload"])
    ops = _TORCH_OPS.match(text)
    if ops:
        return _ops_selection(text, ops["ns"], ops["op"], ops["overload"])
    if text.startswith("torch.ops"):
        raise SelectionError(f"--op {text!r}: expected torch.ops.NAMESPACE[.OP[.OVERLOAD]]")
    if ":" in text or not text.startswith("torch."):
        return Selection(text, "patch", text)
    return Selection(text, "function", text)


def _ops_selection(text: str, namespace: str, op: str | None, overload: str | None) -> Selection:
    if namespace == "aten" and op is None:
        raise SelectionError(f"--op {text!r}: name aten operators one at a time (aten.mm), not the whole namespace")
    kind = "aten" if namespace == "aten" else "library"
    path = f"torch.ops.{namespace}" + (f".{op}" if op else "") + (f".{overload}" if overload else "")
    return Selection(text, kind, path, namespace, op, overload)


def ops_path(namespace: str, op: str, overload: str | None) -> str:
    """The spec path of a torch.ops operator: the packet for its default overload."""
    return f"torch.ops.{namespace}.{op}" + (f".{overload}" if overload and overload != "default" else "")


@dataclass
class FunctionMatcher:
    """Selections a TorchFunctionMode decides: torch functions by identity, torch.ops by name."""

    by_object: dict[int, tuple[Any, str]]  # id(function) -> (function, op path)
    library: list[Selection]

    def match(self, func: Any) -> str | None:
        """The op path a call of `func` is recorded under, or None."""
        found = self.by_object.get(id(func))
        if found is not None and found[0] is func:
            return found[1]
        if not self.library:
            return None
        name = _ops_name(func)
        if name is None:
            return None
        namespace, op, overload = name
        for sel in self.library:
            if sel.namespace == namespace and sel.op in (None, op) and sel.overload in (None, overload):
                return ops_path(namespace, op, sel.overload)
        return None


def _ops_name(func: Any) -> tuple[str, str, str | None] | None:
    """(namespace, operator, overload or None for a packet) of a torch.ops object, else None."""
    from torch._ops import OpOverload, OpOverloadPacket

    if isinstance(func, OpOverload):
        namespace, _, op = func._schema.name.partition("::")
        return namespace, op, func._overloadname
    if isinstance(func, OpOverloadPacket):
        namespace, _, op = func._qualified_op_name.partition("::")
        return namespace, op, None
    return None


def aten_match(selections: list[Selection]) -> Callable[[Any], str | None]:
    """What a TorchDispatchMode asks of each aten call: its op path if selected, else None."""
    wanted = {(s.op, s.overload) for s in selections}

    def match(func: Any) -> str | None:
        name = _ops_name(func)
        if name is None or name[0] != "aten":
            return None
        _, op, overload = name
        if (op, None) in wanted or (op, overload) in wanted:
            chosen = overload if (op, overload) in wanted else None
            return ops_path("aten", op, chosen)
        return None

    return match


def function_matcher(selections: list[Selection]) -> FunctionMatcher:
    """Resolve the torch function selections to their objects (SelectionError for one that is not
    a torch function or method)."""
    by_object: dict[int, tuple[Any, str]] = {}
    for sel in selections:
        if sel.kind == "function":
            obj = _resolved(sel)
            by_object[id(obj)] = (obj, sel.path)
    return FunctionMatcher(by_object, [s for s in selections if s.kind == "library"])


def _resolved(sel: Selection) -> Any:
    """The object a selection's path names, as a spec's `op:` would resolve it."""
    from opcheck.spec.oppath import OpPathError, resolve_op

    try:
        return resolve_op(sel.path)
    except OpPathError as e:
        raise SelectionError(f"--op {sel.text}: {e}") from None


@dataclass
class Patch:
    """One attribute replaced by a recording wrapper for the run."""

    owner: Any
    name: str
    original: Any


def install_patches(selections: list[Selection], wrap: Callable[[Any, str], Any]) -> list[Patch]:
    """Replace each patched selection's callable by wrap(original, op path), where its path names it
    and in every loaded module holding the same object; the replaced attributes, to restore."""
    patches: list[Patch] = []
    for sel in selections:
        if sel.kind != "patch":
            continue
        original = _resolved(sel)
        owner, name = _owner(sel.path)
        if isinstance(owner, type):
            stored = owner.__dict__.get(name, _MISSING)
            # A plain function in a class is a method: the wrapper binds `self` as it did. Bound
            # methods (classmethods, autograd.Function.apply) and static ones are called as resolved.
            wrapper: Any = wrap(original, sel.path)
            if not inspect.isfunction(stored):
                wrapper = staticmethod(wrapper)
        else:
            stored, wrapper = original, wrap(original, sel.path)
        patches.append(Patch(owner, name, stored))
        setattr(owner, name, wrapper)
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict) or module is owner:
                continue
            for key, value in list(namespace.items()):
                if _same_callable(value, original):
                    patches.append(Patch(module, key, value))
                    namespace[key] = wrap(original, sel.path)
    return patches


def restore(patches: list[Patch]) -> None:
    """Put back what install_patches replaced."""
    for patch in reversed(patches):
        if patch.original is _MISSING:  # an inherited attribute (autograd.Function.apply)
            delattr(patch.owner, patch.name)
        else:
            setattr(patch.owner, patch.name, patch.original)


def _same_callable(value: Any, original: Any) -> bool:
    # A bound method (`Square.apply`) is a new object at every attribute access; equal ones share
    # their function and their object.
    if value is original:
        return True
    # type(), not isinstance: isinstance reads `__class__`, which some module attributes warn on
    # (torch.distributed.reduce_op's FutureWarning, printed into the user's run).
    return inspect.ismethod(original) and type(value) is type(original) and value == original


def _owner(path: str) -> tuple[Any, str]:
    """The object holding the last attribute of a resolvable path, and that attribute's name."""
    import importlib

    if ":" in path:
        module_name, attrs = path.split(":", 1)
        parts = attrs.split(".")
        owner: Any = importlib.import_module(module_name)
    else:
        dotted = path.split(".")
        owner, used = None, 0
        for i in range(1, len(dotted)):
            try:
                owner, used = importlib.import_module(".".join(dotted[:i])), i
            except ImportError:
                break
        parts = dotted[used:]
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]
