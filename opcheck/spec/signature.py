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
    """Reports what the signature refuses of one sample's arguments, as far as their form reads.

    How many arguments `args` passes and which names `kwargs` gives depend on the form of the
    two (a list, a mapping's keys), not on the arguments' values: a problem inside an argument,
    reported on its own, leaves the call to be judged. A missing argument is reported only when
    everything the sample passes is known (an unknown key of the sample may be a misspelled
    `kwargs`, a badly named keyword the one that seems missing).
    """
    if not ctx.readable(sample):
        return
    call = f"{op}{describe(sig)}"
    args, args_known = _part(ctx, sample, "args")
    kwargs, kwargs_known = _part(ctx, sample, "kwargs")
    positional = _check_positional(ctx, call, sig, args) if args is not None else set()
    named = _check_keywords(ctx, call, sig, kwargs, positional if args_known else None) if kwargs is not None else set()
    where = args if args is not None else kwargs
    if where is not None and args_known and kwargs_known and _all_keys_clean(ctx, sample, kwargs):
        _check_missing(ctx, call, sig, positional | named, where)


def _part(ctx: Checker, sample: Node, key: str) -> tuple[Node | None, bool]:
    """The sample's `args` (a list) or `kwargs` (a mapping) where that form can be read, and
    whether what it passes is known: absent (it passes nothing), or read."""
    node = sample.value.get(key)
    if node is None:
        return None, True
    if ctx.readable(node) and (node.is_list if key == "args" else node.is_map):
        return node, True
    return None, False


def _check_positional(ctx: Checker, call: str, sig: inspect.Signature, args: Node) -> set[str]:
    """Reports more positional arguments than the op takes; the names the given ones bind."""
    positional = _positional(sig)
    if len(args.value) > len(positional):
        ctx.report(
            args,
            f"{call} takes at most {_count(len(positional), 'positional argument')}, got {len(args.value)}",
            at_key=True,
        )
    return {p.name for p in positional[: len(args.value)]}


def _check_keywords(
    ctx: Checker, call: str, sig: inspect.Signature, kwargs: Node, positional: set[str] | None
) -> set[str]:
    """Reports keywords the op does not take, or that name a parameter given positionally (when
    `positional`, the names bound by position, is known); the names given.

    A key the schema refused (not an identifier) is reported already, and names nothing.
    """
    params = sig.parameters.values()
    accepts_any = any(p.kind == _P.VAR_KEYWORD for p in params)
    by_name = {p.name: p for p in params if p.kind not in (_P.VAR_KEYWORD, _P.POSITIONAL_ONLY)}
    named: set[str] = set()
    for key, value in kwargs.value.items():
        if not ctx.key_clean(value):
            continue
        if key in by_name and positional is not None and key in positional:
            at = _positional(sig).index(by_name[key])
            ctx.report(value, f"{key!r} is also given positionally, as args[{at}], to {call}", at_key=True)
        elif key not in by_name and not accepts_any:
            if key in sig.parameters:
                message = f"{key!r} is positional-only in {call}; pass it in `args`"
            else:
                message = f"unknown keyword argument {key!r} for {call}{did_you_mean(key, list(by_name))}"
            ctx.report(value, message, at_key=True)
        named.add(key)
    return named


def _check_missing(ctx: Checker, call: str, sig: inspect.Signature, given: set[str], where: Node) -> None:
    """Reports the required parameters that no argument binds."""
    missing = [
        p.name for p in sig.parameters.values() if p.default is _P.empty and p.kind in _NAMED and p.name not in given
    ]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        ctx.report(where, f"{call} is missing {_count(len(missing), 'required argument')}: {names}", at_key=True)


def _all_keys_clean(ctx: Checker, sample: Node, kwargs: Node | None) -> bool:
    """Whether the schema found nothing wrong with any key of the sample or of its `kwargs`."""
    values = list(sample.value.values()) + (list(kwargs.value.values()) if kwargs is not None else [])
    return all(ctx.key_clean(value) for value in values)


def _positional(sig: inspect.Signature) -> list[inspect.Parameter]:
    return [p for p in sig.parameters.values() if p.kind in _POSITIONAL]


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
