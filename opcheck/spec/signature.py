"""Samples' arguments against the op's Python signature, where the op has one.

Only plain Python functions and methods are judged, through inspect.signature of the callable
itself (not of what a decorator wraps, whose signature the wrapper may not keep), and only when
the signature takes no *args: builtins, torch operators and autograd.Function.apply accept
anything as far as Python can tell, so nothing is said about them. A sample that the op would
refuse with a TypeError (too many or too few arguments, one given twice, an unknown keyword) is
reported where it is written instead of in every generated test.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from opcheck.spec.checker import Checker
from opcheck.spec.oppath import resolve_op
from opcheck.spec.problems import did_you_mean
from opcheck.spec.yamlload import Node

_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_NAMED = _POSITIONAL + (_P.KEYWORD_ONLY,)


def op_signature(op: str) -> inspect.Signature | None:
    """The signature samples of `op` must fit, None when it is not known."""
    try:
        obj = resolve_op(op)
    except Exception:  # reported where `op:` is written
        return None
    return callable_signature(obj)


def callable_signature(obj: Callable[..., Any]) -> inspect.Signature | None:
    """inspect.signature of a Python function or method taking no *args; None for anything else."""
    if not (inspect.isfunction(obj) or (inspect.ismethod(obj) and inspect.isfunction(obj.__func__))):
        return None
    try:
        sig = inspect.signature(obj, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    if any(p.kind == _P.VAR_POSITIONAL for p in sig.parameters.values()):
        return None
    return sig


def check_arguments(ctx: Checker, op: str, samples: Node | None) -> None:
    """Reports every sample whose args/kwargs the op's signature (when known) refuses.

    A method variant calls `args[0].attr(*args[1:])`, which for a Python method is
    `Tensor.attr(*args)`: the same binding as a function's.
    """
    if samples is None or not samples.is_list:
        return
    sig: inspect.Signature | None = None
    for sample in samples.value:
        if not (sample.is_map and ("args" in sample.value or "kwargs" in sample.value)):
            continue
        if any(key in sample.value for key in ("generator", "opinfo")):
            continue
        if sig is None:
            sig = op_signature(op)
            if sig is None:
                return
        _check_sample(ctx, op, sig, sample)


def _check_sample(ctx: Checker, op: str, sig: inspect.Signature, sample: Node) -> None:
    args, kwargs = sample.value.get("args"), sample.value.get("kwargs")
    if not (ctx.clean(sample) and (args is None or args.is_list) and (kwargs is None or kwargs.is_map)):
        return
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    call = f"{op}{describe(sig)}"
    given: set[str] = set()
    if args is not None:
        if len(args.value) > len(positional):
            ctx.report(
                args,
                f"{call} takes at most {_count(len(positional), 'positional argument')}, got {len(args.value)}",
                at_key=True,
            )
        given = {p.name for p in positional[: len(args.value)]}
    accepts_any = any(p.kind == _P.VAR_KEYWORD for p in params)
    by_name = {p.name: p for p in params if p.kind not in (_P.VAR_KEYWORD, _P.POSITIONAL_ONLY)}
    for key, value in kwargs.value.items() if kwargs is not None else ():
        param = by_name.get(key)
        if param is not None and param.name in given:
            at = positional.index(param)
            ctx.report(value, f"{key!r} is also given positionally, as args[{at}], to {call}", at_key=True)
        elif param is None and not accepts_any:
            if key in sig.parameters:
                message = f"{key!r} is positional-only in {call}; pass it in `args`"
            else:
                message = f"unknown keyword argument {key!r} for {call}{did_you_mean(key, list(by_name))}"
            ctx.report(value, message, at_key=True)
        given.add(key)
    missing = [p.name for p in params if p.default is _P.empty and p.kind in _NAMED and p.name not in given]
    where = args if args is not None else kwargs
    if missing and where is not None:
        names = ", ".join(repr(name) for name in missing)
        ctx.report(where, f"{call} is missing {_count(len(missing), 'required argument')}: {names}", at_key=True)


def describe(sig: inspect.Signature) -> str:
    """The parameters as a call would see them, without annotations or default values.

    Defaults are shown as `=...`: their repr may be long, or differ between runs (an object's
    address), and messages are pinned.
    """
    parts: list[str] = []
    params = list(sig.parameters.values())
    for i, p in enumerate(params):
        if p.kind == _P.KEYWORD_ONLY and (i == 0 or params[i - 1].kind in _POSITIONAL):
            parts.append("*")
        parts.append(
            f"**{p.name}" if p.kind == _P.VAR_KEYWORD else p.name if p.default is _P.empty else f"{p.name}=..."
        )
        if p.kind == _P.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind != _P.POSITIONAL_ONLY):
            parts.append("/")
    return f"({', '.join(parts)})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
