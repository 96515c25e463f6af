"""One call of an op: the op, its built arguments, and the views gradcheck and a failure need of it.

`SampleCall` turns a call into gradcheck's f(*tensors requiring grad) and back; `describe_call` is the
line a failure prints for it (`(Tensor[3, 5] float64 (requires_grad), dim=-1)`). Spec samples
(samples.py) and OpInfo samples (opinfo.py) are both built into calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from opcheck.runtime.sparse import describe_layout
from opcheck.spec.model import Sample, TensorArg, TensorListArg


@dataclass
class SampleCall:
    """The op, its arguments, and how to turn it into gradcheck's f(*tensors requiring grad)."""

    op: Callable
    args: list
    kwargs: dict
    label: str = ""  # "OpInfo sample 3 of 7" for OpInfo samples
    post: Callable | None = None  # OpInfo's output_process_fn_grad
    description: str = ""
    # Every call gets fresh (differentiable) copies of its tensors: for kernels that write into
    # their inputs (the spec's `clone_inputs: true`).
    clone_inputs: bool = False

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # a crash report starts at the op's own frame
        if self.clone_inputs:
            args, kwargs = _map_tensors((args, kwargs), lambda t: t.clone())
        out = self.op(*args, **kwargs)
        return self.post(out) if self.post is not None else out

    def run(self):
        __tracebackhide__ = True
        return self(*self.args, **self.kwargs)

    def gradcheck_inputs(self) -> tuple[torch.Tensor, ...]:
        """The tensors requiring grad, in order (inside tensor lists and kwargs too)."""
        found: list[torch.Tensor] = []
        _walk((self.args, self.kwargs), lambda t: found.append(t) if t.requires_grad else None)
        return tuple(found)

    def as_function(self) -> Callable:
        """f(*gradcheck_inputs) that puts the tensors back where they came from and calls the op."""
        args, kwargs = self.args, self.kwargs

        def fn(*tensors):
            __tracebackhide__ = True
            it = iter(tensors)
            new_args, new_kwargs = _replace_grad_tensors((args, kwargs), it)
            return self(*new_args, **new_kwargs)

        return fn

    def tensor_slots(self) -> tuple[tuple[list, dict], list[torch.Tensor]]:
        """(args, kwargs) with every tensor replaced by a slot marker, and the tensors in order:
        what a compiled function takes, so that calls differing only in their tensors share it."""
        found: list[torch.Tensor] = []
        _walk((self.args, self.kwargs), found.append)
        args, kwargs = _map_tensors((self.args, self.kwargs), lambda t: TENSOR_SLOT)
        return (args, kwargs), found

    def with_tensors(self, skeleton: tuple[list, dict], tensors) -> SampleCall:
        """The call whose arguments are `skeleton` (tensor_slots) with its slots filled, in order."""
        it = iter(tensors)
        args, kwargs = _fill_slots(skeleton, it)
        return replace(self, args=args, kwargs=kwargs)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> SampleCall:
        """The same call with every tensor argument replaced by fn(tensor)."""
        args, kwargs = _map_tensors((self.args, self.kwargs), fn)
        return replace(self, args=args, kwargs=kwargs)


class _TensorSlot:
    def __repr__(self) -> str:
        return "<tensor>"


TENSOR_SLOT = _TensorSlot()
"""Where a tensor goes in SampleCall.tensor_slots' skeleton."""


def _fill_slots(obj, it):
    if obj is TENSOR_SLOT:
        return next(it)
    if isinstance(obj, list):
        return [_fill_slots(x, it) for x in obj]
    if isinstance(obj, tuple):
        return tuple(_fill_slots(x, it) for x in obj)
    if isinstance(obj, dict):
        return {k: _fill_slots(v, it) for k, v in obj.items()}
    return obj


def _walk(obj, visit) -> None:
    if isinstance(obj, torch.Tensor):
        visit(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _walk(x, visit)
    elif isinstance(obj, dict):
        for x in obj.values():
            _walk(x, visit)


def _replace_grad_tensors(obj, it):
    return _map_tensors(obj, lambda t: next(it) if t.requires_grad else t)


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [_map_tensors(x, fn) for x in obj]
    if isinstance(obj, tuple):
        return tuple(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


# ------------------------------------------------------------------------------------ describing
def describe_value(v, arg=None) -> str:
    if isinstance(v, torch.Tensor):
        text = f"Tensor{list(v.shape)} {str(v.dtype).replace('torch.', '')}"
        notes = []
        if v.requires_grad:
            notes.append("requires_grad")
        if v.layout != torch.strided:
            notes.extend(describe_layout(v))
        elif not v.is_contiguous():
            notes.append("noncontiguous")
        if isinstance(arg, TensorArg):
            if arg.strides is not None:
                notes.append(f"strides={list(arg.strides)}")
            if arg.maker:
                notes.append(f"maker={arg.maker}" + _maker_details(arg))
            if arg.low is not None or arg.high is not None:
                notes.append(f"range=[{arg.low}, {arg.high})")
            if arg.avoid:
                notes.append(f"avoid={list(arg.avoid)}±{arg.margin}")
            if arg.values is not None:
                notes.append("explicit values")
            if arg.values_file is not None:
                key = "" if arg.values_key is None else f"[{arg.values_key!r}]"
                notes.append(f"values from {arg.values_file}{key}")
        return text + (f" ({', '.join(notes)})" if notes else "")
    if isinstance(v, list):
        items = arg.items if isinstance(arg, TensorListArg) else [None] * len(v)
        return "[" + ", ".join(describe_value(x, a) for x, a in zip(v, items)) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(describe_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


def _maker_details(arg: TensorArg) -> str:
    """A structure maker's settings that shape the values: `(rows_off=1, mask_values=[-inf, 0.0])`."""
    settings = [
        f"{key}={value}"
        for key, value in (
            ("share_on", arg.share_on),
            ("rows_off", arg.rows_off or None),
            ("rows_on", arg.rows_on or None),
            ("mask_values", list(arg.mask_values) if arg.mask_values else None),
            ("fill", arg.fill),
            ("gap", arg.gap),
        )
        if value is not None
    ]
    return f"({', '.join(settings)})" if settings else ""


def describe_call(args, kwargs, sample: Sample | None = None) -> str:
    spec_args = list(sample.args) if sample is not None else [None] * len(args)
    spec_kwargs = dict(sample.kwargs) if sample is not None else {}
    parts = [describe_value(a, s) for a, s in zip(args, spec_args)]
    parts += [f"{k}={describe_value(v, spec_kwargs.get(k))}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"
