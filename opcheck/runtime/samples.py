"""A spec's Sample, built on a device and dtype from a seed, as a call of the op.

Seeds: a case's seed is opcheck.spec.case.CaseId.seed, the sha256 of its spec and test id
`test_<check>[<device>-<dtype>-<sample>]` (a kink re-draw adds its attempt number). One CPU
torch.Generator seeded with it draws every tensor of the sample in argument order (args, then
kwargs); values are made on the CPU, cast to the dtype and then moved, so a seed gives identical
values on every device. `noncontiguous: true` tensors are every other element of a buffer twice as long in the
last dim (the gaps hold NaN for floating dtypes, so a kernel that ignores strides shows up); a
tensor with `strides` is a view of a buffer that spans them (gaps hold NaN too; an expanded dim
repeats the values drawn at size 1).
A sparse `layout` draws its pattern right after its values, from the same generator (sparse.py).
`values` and `values_file` (read from the project root, file_values.py) draw nothing.

Arguments: TensorArg -> a tensor (dtype None: the test's dtype, or in a low-precision test its
`lowprec_dtype` where it has one; requires_grad None: True for floating/complex); TensorListArg
-> a list of tensors; TupleArg -> a tuple; DtypeArg -> a torch.dtype; a Python list or tuple
literal -> a Python list.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch

from opcheck.runtime.call import SampleCall, describe_call, describe_value
from opcheck.runtime.devices import torch_dtype
from opcheck.runtime.makers import SampleError, draw_values
from opcheck.runtime.opinfo import opinfo_calls
from opcheck.runtime.sparse import sparsify
from opcheck.spec.model import DtypeArg, OpSpec, Sample, TensorArg, TensorListArg, TupleArg
from opcheck.spec.oppath import resolve_op

__all__ = [
    "SampleCall",
    "build_arg",
    "build_calls",
    "build_tensor",
    "describe_call",
    "describe_value",
    "is_random",
    "op_callable",
    "unmetered_op",
    "seeded_generator",
]


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


# ------------------------------------------------------------------------------------ the op
OP_WRAPPER: ContextVar[Callable[[Callable], Callable] | None] = ContextVar("opcheck_op_wrapper", default=None)
"""What wraps the op op_callable returns, while set (the time budget's meter counts its calls)."""


def op_callable(spec: OpSpec) -> Callable:
    wrap = OP_WRAPPER.get()
    op = _op(spec)
    return wrap(op) if wrap is not None else op


def unmetered_op(spec: OpSpec) -> Callable:
    """The op itself, without the time budget's meter (which reads the clock: code torch.compile
    must not trace)."""
    return _op(spec)


def _op(spec: OpSpec) -> Callable:
    op = resolve_op(spec.op, imports=spec.imports)
    if spec.variant != "method":
        return op
    name = spec.op.replace(":", ".").rsplit(".", 1)[-1]

    def method(self, *args, **kwargs):
        return getattr(self, name)(*args, **kwargs)

    method.__name__ = name
    return method


# ------------------------------------------------------------------------------------ building
def build_calls(spec: OpSpec, sample: Sample, device: str, dtype: str, seed: int) -> list[SampleCall]:
    """The calls one test runs: one, or one per OpInfo sample."""
    op = op_callable(spec)
    if sample.opinfo:
        return opinfo_calls(sample.opinfo, op, device, torch_dtype(dtype), seed)
    gen = seeded_generator(seed)
    if sample.generator:
        args, kwargs = _from_generator(sample.generator, device, torch_dtype(dtype), gen)
        return [SampleCall(op, args, kwargs, description=describe_call(args, kwargs))]
    args = [build_arg(a, device, dtype, gen, f"args[{i}]") for i, a in enumerate(sample.args)]
    kwargs = {k: build_arg(v, device, dtype, gen, f"kwargs.{k}") for k, v in sample.kwargs}
    return [SampleCall(op, args, kwargs, description=describe_call(args, kwargs, sample))]


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


GRADIENT_CHECK_DTYPES = ("float64", "complex128")
"""The dtypes of the gradient checks; a test at any other dtype is a low-precision one."""


def tensor_dtype(arg: TensorArg, dtype: str) -> str:
    """The dtype `arg` is built at in a test at `dtype`: its own `dtype`, else, in a low-precision
    test, its `lowprec_dtype` (float32 gates beside bfloat16 activations), else the test's."""
    if arg.dtype is not None:
        return arg.dtype
    if arg.lowprec_dtype is not None and dtype not in GRADIENT_CHECK_DTYPES:
        return arg.lowprec_dtype
    return dtype


def build_tensor(arg: TensorArg, device: str, dtype: str, gen: torch.Generator) -> torch.Tensor:
    tdtype = torch_dtype(tensor_dtype(arg, dtype))
    values = draw_values(arg, tdtype, gen)
    differentiable = tdtype.is_floating_point or tdtype.is_complex
    requires_grad = differentiable if arg.requires_grad is None else arg.requires_grad
    if requires_grad and not differentiable:
        raise SampleError(f"requires_grad: true needs a floating-point or complex dtype, got {tdtype}")
    if arg.is_sparse:
        t = sparsify(values, arg, gen).to(device)
    elif arg.strides is not None:
        t = laid_out(values, arg.shape, arg.strides, device)
    elif arg.noncontiguous and values.numel() > 1:
        t = _noncontiguous(values).to(device)[..., ::2]
    else:
        t = values.to(device)
    return t.requires_grad_(requires_grad)


def laid_out(values: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...], device: str) -> torch.Tensor:
    """`values` (at `shape`, or with each expanded dim of size 1) in a tensor of `shape` with
    `strides` on `device`: a view of a buffer that spans the layout, its gaps filled as _gap_fill says."""
    span = 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else 0
    buf = torch.full((span,), _gap_fill(values.dtype), dtype=values.dtype)
    if span:
        buf.as_strided(tuple(values.shape), strides).copy_(values)
    return buf.to(device).as_strided(shape, strides)


def _gap_fill(dtype: torch.dtype) -> float | bool:
    """What the memory between a layout's elements holds: NaN for floating dtypes, so that a kernel
    reading outside the tensor's elements shows; 0 (false) otherwise."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return False if dtype == torch.bool else 0


def _noncontiguous(values: torch.Tensor) -> torch.Tensor:
    """A buffer twice as long in the last dim; `buffer[..., ::2]` holds the values."""
    buf = torch.repeat_interleave(values, 2, dim=-1)
    if values.is_floating_point() or values.is_complex():
        buf[..., 1::2] = float("nan")
    return buf


def _from_generator(path: str, device: str, dtype: torch.dtype, gen: torch.Generator):
    fn = resolve_op(path)
    result = fn(device, dtype, gen)
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[1], dict)
        and isinstance(result[0], (tuple, list))
    ):
        args, kwargs = list(result[0]), dict(result[1])
    elif isinstance(result, (tuple, list)):
        args, kwargs = list(result), {}
    else:
        args, kwargs = [result], {}
    call = SampleCall(lambda: None, args, kwargs)
    if not call.gradcheck_inputs():
        # The generator chose no inputs: differentiate with respect to every floating leaf tensor.
        def mark(t):
            return t.requires_grad_() if (t.is_floating_point() or t.is_complex()) and t.is_leaf else t

        call = call.map_tensors(mark)
    return call.args, call.kwargs


def is_random(sample: Sample) -> bool:
    """Whether a new seed changes the sample (explicit values and literals do not)."""
    if sample.generator or sample.opinfo:
        return True

    def random(a) -> bool:
        if isinstance(a, TensorArg):
            return a.values is None and a.values_file is None
        if isinstance(a, (TensorListArg, TupleArg)):
            return any(random(x) for x in a.items)
        return False

    return any(random(a) for a in sample.args) or any(random(v) for _, v in sample.kwargs)
