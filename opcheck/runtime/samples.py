"""A spec's Sample, built on a device and dtype from a seed, as a call of the op.

Seeds: every test id `test_<check>[<device>-<dtype>-<sample>]` hashes (sha256, with the spec name)
to a 63-bit seed; a kink re-draw hashes the id with its attempt number. One CPU torch.Generator
seeded with it draws every tensor of the sample in argument order (args, then kwargs); values are
made on the CPU, cast to the dtype and then moved, so a seed gives identical values on every
device. `noncontiguous: true` tensors are every other element of a buffer twice as long in the
last dim (the gaps hold NaN for floating dtypes, so a kernel that ignores strides shows up).
A sparse `layout` draws its pattern right after its values, from the same generator (sparse.py).

Arguments: TensorArg -> a tensor (dtype None: the test's dtype; requires_grad None: True for
floating/complex); TensorListArg -> a list of tensors; TupleArg -> a tuple; DtypeArg -> a
torch.dtype; a Python list or tuple literal -> a Python list.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from opcheck.runtime.devices import torch_dtype
from opcheck.runtime.makers import SampleError, draw_values
from opcheck.runtime.sparse import describe_layout, sparsify
from opcheck.spec.model import DtypeArg, OpSpec, Sample, TensorArg, TensorListArg, TupleArg
from opcheck.spec.oppath import resolve_op


def case_id(check: str, device: str, dtype: str, sample: str) -> str:
    return f"test_{check}[{device}-{dtype}-{sample}]"


def seed_for(spec_name: str, test_id: str, attempt: int = 0) -> int:
    """A stable 63-bit seed: the same id gives the same seed on every machine, worker and run."""
    key = f"{spec_name}::{test_id}" + (f"::redraw{attempt}" if attempt else "")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & (2**63 - 1)


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


# ------------------------------------------------------------------------------------ the call
@dataclass
class Call:
    """The op, its arguments, and how to turn it into gradcheck's f(*tensors requiring grad)."""

    op: Callable
    args: list
    kwargs: dict
    label: str = ""  # "OpInfo sample 3 of 7" for OpInfo samples
    post: Callable | None = None  # OpInfo's output_process_fn_grad
    description: str = ""

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # a crash report starts at the op's own frame
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

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Call":
        """The same call with every tensor argument replaced by fn(tensor)."""
        args, kwargs = _map_tensors((self.args, self.kwargs), fn)
        return replace(self, args=args, kwargs=kwargs)


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
    if isinstance(obj, torch.Tensor):
        return next(it) if obj.requires_grad else obj
    if isinstance(obj, list):
        return [_replace_grad_tensors(x, it) for x in obj]
    if isinstance(obj, tuple):
        return tuple(_replace_grad_tensors(x, it) for x in obj)
    if isinstance(obj, dict):
        return {k: _replace_grad_tensors(v, it) for k, v in obj.items()}
    return obj


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


# ------------------------------------------------------------------------------------ the op
def op_callable(spec: OpSpec) -> Callable:
    op = resolve_op(spec.op)
    if spec.variant != "method":
        return op
    name = spec.op.replace(":", ".").rsplit(".", 1)[-1]

    def method(self, *args, **kwargs):
        return getattr(self, name)(*args, **kwargs)

    method.__name__ = name
    return method


# ------------------------------------------------------------------------------------ building
def build_calls(spec: OpSpec, sample: Sample, device: str, dtype: str, seed: int) -> list[Call]:
    """The calls one test runs: one, or one per OpInfo sample."""
    op = op_callable(spec)
    if sample.opinfo:
        from opcheck.runtime.opinfo import opinfo_calls

        return opinfo_calls(sample.opinfo, op, device, torch_dtype(dtype), seed)
    gen = seeded_generator(seed)
    if sample.generator:
        args, kwargs = _from_generator(sample.generator, device, torch_dtype(dtype), gen)
        return [Call(op, args, kwargs, description=describe_call(args, kwargs))]
    args = [build_arg(a, device, dtype, gen, f"args[{i}]") for i, a in enumerate(sample.args)]
    kwargs = {k: build_arg(v, device, dtype, gen, f"kwargs.{k}") for k, v in sample.kwargs}
    return [Call(op, args, kwargs, description=describe_call(args, kwargs, sample))]


def build_arg(arg, device: str, dtype: str, gen: torch.Generator, where: str = "arg") -> Any:
    if isinstance(arg, TensorArg):
        try:
            return build_tensor(arg, device, dtype, gen)
        except SampleError as e:
            raise SampleError(f"{where}: {e}") from None
    if isinstance(arg, TensorListArg):
        return [build_arg(t, device, dtype, gen, f"{where}[{i}]") for i, t in enumerate(arg.items)]
    if isinstance(arg, TupleArg):
        return tuple(build_arg(x, device, dtype, gen, f"{where}[{i}]") for i, x in enumerate(arg.items))
    if isinstance(arg, DtypeArg):
        return torch_dtype(arg.name)
    if isinstance(arg, (list, tuple)):
        return [build_arg(x, device, dtype, gen, f"{where}[{i}]") for i, x in enumerate(arg)]
    return arg


def build_tensor(arg: TensorArg, device: str, dtype: str, gen: torch.Generator) -> torch.Tensor:
    tdtype = torch_dtype(arg.dtype or dtype)
    values = draw_values(arg, tdtype, gen)
    differentiable = tdtype.is_floating_point or tdtype.is_complex
    requires_grad = differentiable if arg.requires_grad is None else arg.requires_grad
    if requires_grad and not differentiable:
        raise SampleError(f"requires_grad: true needs a floating-point or complex dtype, got {tdtype}")
    if arg.is_sparse:
        t = sparsify(values, arg, gen).to(device)
    elif arg.noncontiguous and values.numel() > 1:
        t = _noncontiguous(values).to(device)[..., ::2]
    else:
        t = values.to(device)
    return t.requires_grad_(requires_grad)


def _noncontiguous(values: torch.Tensor) -> torch.Tensor:
    """A buffer twice as long in the last dim; `buffer[..., ::2]` holds the values."""
    buf = torch.repeat_interleave(values, 2, dim=-1)
    if values.is_floating_point() or values.is_complex():
        buf[..., 1::2] = float("nan")
    return buf


def _from_generator(path: str, device: str, dtype: torch.dtype, gen: torch.Generator):
    fn = resolve_op(path)
    result = fn(device, dtype, gen)
    if (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)
            and isinstance(result[0], (tuple, list))):
        args, kwargs = list(result[0]), dict(result[1])
    elif isinstance(result, (tuple, list)):
        args, kwargs = list(result), {}
    else:
        args, kwargs = [result], {}
    call = Call(lambda: None, args, kwargs)
    if not call.gradcheck_inputs():
        # The generator chose no inputs: differentiate with respect to every floating leaf tensor.
        def mark(t):
            return t.requires_grad_() if (t.is_floating_point() or t.is_complex()) and t.is_leaf else t
        call = call.map_tensors(mark)
    return call.args, call.kwargs


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
            if arg.maker:
                notes.append(f"maker={arg.maker}")
            if arg.low is not None or arg.high is not None:
                notes.append(f"range=[{arg.low}, {arg.high})")
            if arg.avoid:
                notes.append(f"avoid={list(arg.avoid)}±{arg.margin}")
            if arg.values is not None:
                notes.append("explicit values")
        return text + (f" ({', '.join(notes)})" if notes else "")
    if isinstance(v, list):
        items = arg.items if isinstance(arg, TensorListArg) else [None] * len(v)
        return "[" + ", ".join(describe_value(x, a) for x, a in zip(v, items)) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(describe_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


def describe_call(args, kwargs, sample: Sample | None = None) -> str:
    spec_args = list(sample.args) if sample is not None else [None] * len(args)
    spec_kwargs = dict(sample.kwargs) if sample is not None else {}
    parts = [describe_value(a, s) for a, s in zip(args, spec_args)]
    parts += [f"{k}={describe_value(v, spec_kwargs.get(k))}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def is_random(sample: Sample) -> bool:
    """Whether a new seed changes the sample (explicit values and literals do not)."""
    if sample.generator or sample.opinfo:
        return True

    def random(a) -> bool:
        if isinstance(a, TensorArg):
            return a.values is None
        if isinstance(a, (TensorListArg, TupleArg)):
            return any(random(x) for x in a.items)
        return False

    return any(random(a) for a in sample.args) or any(random(v) for _, v in sample.kwargs)
