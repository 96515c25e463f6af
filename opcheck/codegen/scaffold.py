"""`opcheck new`: a commented spec that validates and runs as written."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from opcheck.codegen.render import template_environment
from opcheck.spec.oppath import OpPathError, resolve_op

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def scaffold_spec(name: str, op: str, *, schema: str) -> str:
    """The spec text; `schema` is the JSON Schema's path relative to the spec's folder."""
    if not _NAME.match(name):
        raise ValueError(f"name {name!r} must match [a-z][a-z0-9_]* (it names test_{name}.py)")
    try:
        fn = resolve_op(op)
    except OpPathError as e:
        raise ValueError(f"--op {op}: {e}") from None
    arity = _probe_arity(fn)
    args = ", ".join(["{shape: [3, 3]}"] * (arity or 1))
    return (
        template_environment()
        .get_template("scaffold.yaml.j2")
        .render(name=name, op=op, args=args, probed=arity is not None, schema=schema)
    )


def _probe_arity(fn: Callable[..., object]) -> int | None:
    """How many (3, 3) float64 tensors the op accepts and returns a float tensor for."""
    import torch

    g = torch.Generator().manual_seed(0)
    for arity in (1, 2, 3):
        args = [torch.rand(3, 3, dtype=torch.float64, generator=g) + 0.5 for _ in range(arity)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = fn(*args)
        except Exception:
            continue
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs):
            return arity
    return None
