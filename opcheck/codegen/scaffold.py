"""`opcheck new`: a commented spec that validates and runs as written."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from opcheck.codegen.render import template_environment
from opcheck.spec.oppath import OpPathError, resolve_op
from opcheck.spec.requires import MODULE_NAME_RE

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def scaffold_spec(name: str, op: str, *, schema: str, imports: tuple[str, ...] = ()) -> str:
    """The spec text; `schema` is the JSON Schema's path relative to the spec's folder; `imports`,
    the modules to import before resolving the op (the spec's `imports:`)."""
    if not _NAME.match(name):
        raise ValueError(f"name {name!r} must match [a-z][a-z0-9_]* (it names test_{name}.py)")
    for module in imports:
        if not MODULE_NAME_RE.match(module):
            raise ValueError(f"--import {module}: not a dotted module name ('mypkg.ops')")
    if len(set(imports)) != len(imports):
        raise ValueError(f"--import: a module is given twice ({', '.join(imports)})")
    try:
        fn = resolve_op(op, imports=imports)
    except OpPathError as e:
        hint = (
            "; `opcheck new` imports it with --import mypkg.ops" if op.startswith("torch.ops.") and not imports else ""
        )
        raise ValueError(f"--op {op}: {e}{hint}") from None
    schema_args = _schema_args(fn)
    if schema_args is not None:  # a torch.library op: its schema says what to pass
        args, kwargs = schema_args
        probed = _calls(fn, args, kwargs)
    else:
        arity = _probe_arity(fn)
        args, kwargs, probed = ["{shape: [3, 3]}"] * (arity or 1), [], arity is not None
    return (
        template_environment()
        .get_template("scaffold.yaml.j2")
        .render(
            name=name,
            op=op,
            imports=_commented(f"imports: [{', '.join(imports)}]", "imported before the op is resolved")
            if imports
            else "",
            args=", ".join(args),
            kwargs=", ".join(kwargs),
            probed=probed,
            library_op=schema_args is not None or _schema(fn) is not None,
            schema=schema,
        )
    )


# A value for each schema argument type without a default: (YAML, Python).
_SCHEMA_VALUES: dict[str, tuple[str, object]] = {
    "float": ("1.5", 1.5),
    "int": ("2", 2),
    "bool": ("false", False),
    "SymInt": ("2", 2),
}


def _schema(fn: object) -> object | None:
    """The torch.library schema of a custom op or torch.ops operator, or None for any other callable."""
    import torch

    if isinstance(fn, torch._library.custom_ops.CustomOpDef):
        return fn._opoverload._schema
    if isinstance(fn, torch._ops.OpOverload):
        return fn._schema
    if isinstance(fn, torch._ops.OpOverloadPacket) and "default" in fn.overloads():
        return fn.default._schema
    return None


def _schema_args(fn: object) -> tuple[list[str], list[str]] | None:
    """The sample's `args` and `kwargs` entries from the op's schema: a [3, 3] tensor per Tensor, a
    number per float/int/bool without a default; None when an argument has another type."""
    schema = _schema(fn)
    if schema is None:
        return None
    args, kwargs = [], []
    for arg in schema.arguments:  # type: ignore[attr-defined]
        if arg.has_default_value():
            continue
        kind = str(arg.type)
        if kind == "Tensor":
            value = "{shape: [3, 3]}"
        elif kind in _SCHEMA_VALUES:
            value = _SCHEMA_VALUES[kind][0]
        else:
            return None
        (kwargs.append(f"{arg.name}: {value}") if arg.kwarg_only else args.append(value))
    return args, kwargs


def _calls(fn: Callable[..., object], args: list[str], kwargs: list[str]) -> bool:
    """Whether the op runs on the values the scaffold writes (float64 tensors for its [3, 3] tensors)."""
    import torch

    g = torch.Generator().manual_seed(0)

    def value(text: str) -> object:
        if text == "{shape: [3, 3]}":
            return torch.rand(3, 3, dtype=torch.float64, generator=g) + 0.5
        return next(v for y, v in _SCHEMA_VALUES.values() if y == text)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*map(value, args), **{k: value(v) for k, v in (kw.split(": ", 1) for kw in kwargs)})
    except Exception:
        return False
    return True


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


def _commented(line: str, comment: str) -> str:
    """`line` with `comment` in the template's comment column (36), or one space after a longer line."""
    return f"{line.ljust(35)} # {comment}"
