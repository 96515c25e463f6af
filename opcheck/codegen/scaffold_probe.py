"""What `opcheck new` learns by calling the op at the user's shapes (`--shape`), to write into the spec.

The sample is built as a test builds it (opcheck.runtime.samples), and the derivative flags come
from the probe `opcheck list --cost` and `opcheck capture` use (opcheck.runtime.cost.probe): a
vmapped backward that raises means no vmap rule (check_batched_grad off); a double backward that
raises, is detached or disagrees with finite differences (as `@once_differentiable` does), or a
forward AD that raises or gives no tangent, means it is not implemented (declared unsupported,
which the generated tests then assert). float64 that the op refuses, or computes in float32
(opcheck.engine.reporting.float32), means no float64 gradient check: the low-precision check at
each dtype the op runs at, against a float64 reference.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

LOWPREC_DTYPES = ("float32", "bfloat16", "float16")
_DOUBLE_BACKWARD = {  # the cost probe's verdicts that mean no second derivative
    "raises": "its double backward raises",
    "detached": "its backward's result is detached from the graph",
    "wrong": "its double backward disagrees with finite differences (a backward marked "
    "@once_differentiable, or a wrong second derivative: check which)",
}
_SEED = 0


@dataclass(frozen=True)
class Found:
    """What the op did at the sample; each reason is a short clause for a spec comment, None: fine."""

    float64: str | None  # why there is no float64 gradient check
    lowprec: tuple[str, ...]  # the low-precision dtypes it runs at
    batched_grad: str | None = None
    gradgrad: str | None = None
    forward_ad: str | None = None
    writes_inputs: tuple[str, ...] = ()  # the arguments it writes into, as the spec names them
    writes_grad_outputs: bool = False


def probe_op(op: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...], imports: tuple[str, ...]) -> Found:
    """Call `op` with the sample (spec model values: TensorArg, numbers) at float64 and each low
    precision, and probe its derivatives where float64 is what it computes in."""
    from opcheck.engine.reporting.float32 import float32_evidence
    from opcheck.spec.model import OpSpec, Sample

    sample = Sample("probe", args=args, kwargs=kwargs)
    spec = OpSpec(name="probe", op=op, source="", sha256="", samples=(sample,), imports=imports, devices=("cpu",))
    wide = _call(spec, "float64")
    lowprec = tuple(d for d in LOWPREC_DTYPES if not isinstance(_call(spec, d), str))
    if isinstance(wide, str):
        return Found(float64=f"it refuses float64 ({wide})", lowprec=lowprec)
    call, written = wide
    evidence = float32_evidence(call.as_function(), call.gradcheck_inputs())
    if evidence is not None:
        return Found(float64=f"it computes in float32 ({evidence})", lowprec=lowprec, writes_inputs=written)
    flags = _derivatives(spec, call)
    return replace(flags, lowprec=lowprec, writes_inputs=written)


def _call(spec: Any, dtype: str) -> tuple[Any, tuple[str, ...]] | str:
    """The sample's call at `dtype` and the arguments the op wrote into; or why it failed, one line."""
    import torch

    from opcheck.runtime.samples import build_calls

    try:
        (call,) = build_calls(spec, spec.samples[0], "cpu", dtype, _SEED)
        before = _tensors(call)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = call.run()
    except Exception as e:
        return _one_line(e)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not any(isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()) for o in outs):
        return "it returns no floating-point tensor"
    after = _tensors(call, copy=False)
    written = tuple(name for name, t in before.items() if not _same(t, after[name]))
    return call, written


def _derivatives(spec: Any, call: Any) -> Found:
    """check_batched_grad, double backward and forward AD from the cost probe of the float64 call."""
    from opcheck.runtime.cost.probe import Probe

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = replace(call, clone_inputs=True)  # the probe calls it many times; a write must not pile up
        probe = Probe(fresh.as_function(), fresh.gradcheck_inputs(), repeats=1)
        batched = None
        if probe.backward is not None and probe.batched_backward is None:
            batched = (
                "vmap over its backward raises: no vmap rule, as for a torch.autograd.Function that "
                "launches Triton kernels"
            )
        gradgrad = None if probe.backward is None else _DOUBLE_BACKWARD.get(probe.double_backward)
        forward_ad = None
        if probe.jvp is None:
            forward_ad = "forward AD raises"
        elif not probe.jvp_right and _no_tangent(probe):
            forward_ad = "forward AD gives its outputs no tangent"
        written_grads = _writes_grad_outputs(probe)
    return Found(
        float64=None,
        lowprec=(),
        batched_grad=batched,
        gradgrad=gradgrad,
        forward_ad=forward_ad,
        writes_grad_outputs=written_grads,
    )


def _no_tangent(probe: Any) -> bool:
    import torch.autograd.forward_ad as fwAD

    try:
        with fwAD.dual_level():
            args = list(probe.inputs)
            for j in probe.diff:
                args[j] = fwAD.make_dual(probe.inputs[j].detach(), probe.inputs[j].detach().clone())
            out = probe.fn(*args)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            return any(fwAD.unpack_dual(o).tangent is None for o in outs if hasattr(o, "is_floating_point"))
    except Exception:
        return False


def _writes_grad_outputs(probe: Any) -> bool:
    """Whether a backward writes into the cotangent it is given."""
    if probe.backward is None:
        return False
    v = probe.cotangents()
    kept = [t.clone() for t in v]
    try:
        probe._grad(v)
    except Exception:
        return False
    return any(not _same(a, b) for a, b in zip(kept, v))


def _tensors(call: Any, *, copy: bool = True) -> dict[str, Any]:
    """The call's tensor arguments by the spec's names (`args[0]`, `kwargs.scale`), copied or not."""
    import torch

    found: dict[str, Any] = {}

    def visit(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            found[name] = value.detach().clone() if copy else value.detach()
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(f"{name}[{i}]", v)

    for i, a in enumerate(call.args):
        visit(f"args[{i}]", a)
    for k, v in call.kwargs.items():
        visit(f"kwargs.{k}", v)
    return found


def _same(a: Any, b: Any) -> bool:
    import torch

    if a.layout != torch.strided or b.layout != torch.strided:
        return True  # sparse values are not compared
    return a.shape == b.shape and bool(torch.equal(a, b) or torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def _one_line(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return text if len(text) <= 100 else text[:97] + "..."
