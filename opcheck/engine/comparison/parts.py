"""Complex functions checked part by part, as torch checks them.

Backward: a function with complex outputs is checked as two real functions, the imaginary parts
of its outputs, then the real parts. Forward AD: a function of complex inputs is checked as two
functions of real inputs, the inputs' imaginary parts (the real parts held), then their real parts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from opcheck.engine import aux_checks
from opcheck.engine._util import Func, Inputs, as_tuple, mapped
from opcheck.engine.comparison.compare import BACKWARD, FORWARD, Part
from opcheck.engine.context import Call, CheckContext

Comparison = Callable[[CheckContext, Call, Part], bool]
"""A Jacobian comparison: the full check (core), the fast check (fast), or auto's (auto)."""


def compare_parts(ctx: CheckContext, compare: Comparison, call: Call, forward_ad: bool) -> None:
    """Run `compare` on the call, part by part where complex; with forward_ad, the forward-mode
    comparison and the undefined-tangent check too."""
    if ctx.flags.check_backward_ad:
        if any(o.is_complex() for o in call.func_out):
            complex_out = [i for i, o in enumerate(call.outputs) if o.is_complex()]
            for part, test_imag in ((torch.imag, True), (torch.real, False)):
                of_part = functools.partial(_output_part, part=part)
                fn = of_part(call.func) if ctx.layouts is None else ctx.layouts.derive(call.func, of_part)
                compare(ctx, Call.of(fn, call.inputs), Part(False, complex_out, test_imag))
        else:
            compare(ctx, call, BACKWARD)
    if forward_ad:
        _compare_forward_parts(ctx, compare, call)


def _output_part(fn: Func, part: Callable[[torch.Tensor], torch.Tensor]) -> Func:
    """fn with part() (torch.real or torch.imag) of its complex outputs, and so fn's vmap form (a
    second-order check's first derivative has one)."""

    def parts(out: Any) -> tuple[Any, ...]:
        return tuple(part(o) if o.is_complex() else o for o in as_tuple(out))

    return mapped(fn, outputs=parts)


def _with_imag(part: torch.Tensor, orig: torch.Tensor) -> torch.Tensor:
    return orig.real + part * 1j


def _with_real(part: torch.Tensor, orig: torch.Tensor) -> torch.Tensor:
    return part + orig.imag * 1j


def _imag(a: torch.Tensor) -> torch.Tensor:
    return a.imag


def _real(a: torch.Tensor) -> torch.Tensor:
    return a.real


_INPUT_PARTS = ((_with_imag, _imag, True), (_with_real, _real, False))
"""Per part: the complex input from the part and the original, the part of an input, test_imag."""


def _compare_forward_parts(ctx: CheckContext, compare: Comparison, call: Call) -> None:
    check_undefined_grad = ctx.flags.check_undefined_grad
    complex_inp = [i for i, a in enumerate(call.inputs) if isinstance(a, torch.Tensor) and a.is_complex()]
    if not complex_inp:
        compare(ctx, call, FORWARD)
        if check_undefined_grad:
            aux_checks.check_undefined_forward_mode(ctx, call.func, call.outputs, call.inputs)
        return
    checked = []
    for make, take, test_imag in _INPUT_PARTS:
        fn = _input_part(call.func, complex_inp, call.inputs, make)
        part_inputs = tuple(take(a) if isinstance(a, torch.Tensor) and a.is_complex() else a for a in call.inputs)
        part_call = Call.of(fn, part_inputs)
        compare(ctx, part_call, Part(True, complex_inp, test_imag))
        checked.append(part_call)
    if check_undefined_grad:
        for part_call in checked:
            aux_checks.check_undefined_forward_mode(ctx, part_call.func, part_call.func_out, part_call.inputs)


def _input_part(
    fn: Func, complex_indices: list[int], inputs: Inputs, make: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> Func:
    """fn of the complex inputs' parts: make(part, original) rebuilds each complex input; and so
    fn's vmap form (a second-order check's first derivative has one)."""

    def rebuilt(args: Sequence[Any]) -> list[Any]:
        new = list(args)
        for i in complex_indices:
            new[i] = make(new[i], inputs[i])
        return new

    return mapped(fn, args=rebuilt, outputs=as_tuple)
