"""`opcheck new`: a commented spec that validates and runs as written."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from opcheck.codegen.render import template_environment
from opcheck.codegen.scaffold_probe import Found, probe_op
from opcheck.codegen.scaffold_sample import GivenSample
from opcheck.spec.oppath import OpPathError, resolve_op
from opcheck.spec.requires import MODULE_NAME_RE

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
Shape = tuple[int, ...]


def scaffold_spec(
    name: str,
    op: str,
    *,
    schema: str,
    imports: tuple[str, ...] = (),
    shapes: tuple[Shape, ...] = (),
    sample: GivenSample | None = None,
) -> str:
    """The spec text; `schema` is the JSON Schema's path relative to the spec's folder; `imports`,
    the modules to import before resolving the op (the spec's `imports:`); `shapes`, one per tensor
    argument (`--shape`), or `sample`, one already written (`--sample`): the op is probed there and
    what it lacks is written (scaffold_probe)."""
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
    library_op = _schema(fn) is not None
    found = None
    if shapes or sample is not None:
        given = sample if sample is not None else _shaped_args(fn, shapes)
        args, kwargs = given.args, given.kwargs
        found = probe_op(op, given.values, given.keywords, imports)
        probed = found.float64 is None or bool(found.lowprec)
    elif (schema_args := _schema_args(fn)) is not None:  # a torch.library op: its schema says what to pass
        args, kwargs = schema_args
        probed = _calls(fn, args, kwargs)
    else:
        arity = _probe_arity(fn)
        args, kwargs, probed = ["{shape: [3, 3]}"] * (arity or 1), [], arity is not None
    written = _found_lines(found, name, op, library_op, imports) if found is not None and probed else {}
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
            tried=_tried(shapes) if sample is None else f"the arguments of the sample at {sample.source}",
            library_op=library_op,
            schema=schema,
            found_dtypes=written.get("dtypes", ""),
            found_flags=written.get("flags", ""),
            batched=written.get("batched", ""),
            compile=library_op or _autograd_function(fn),
        )
    )


def _autograd_function(fn: object) -> bool:
    """Whether the op is a torch.autograd.Function's `apply` (`mypkg.ops:MyOp.apply`): like a custom
    op, code of its own that torch.compile traces, where eager alone shows nothing wrong."""
    import torch

    owner = getattr(fn, "__self__", None)
    return isinstance(owner, type) and issubclass(owner, torch.autograd.Function)


def parse_shape(text: str) -> Shape:
    """`--shape 2,7,33` (or `[2, 7, 33]`; `''` or `[]` for a 0-dim tensor) as a shape."""
    body = text.strip().removeprefix("[").removesuffix("]").strip()
    if not body:
        return ()
    try:
        shape = tuple(int(part) for part in body.split(","))
    except ValueError:
        raise ValueError(f"--shape {text}: expected sizes separated by commas, e.g. 2,7,33") from None
    if any(size < 0 for size in shape):
        raise ValueError(f"--shape {text}: sizes must not be negative")
    return shape


def _shape_text(shape: Shape) -> str:
    return "{shape: [" + ", ".join(map(str, shape)) + "]}"


def _tried(shapes: tuple[Shape, ...]) -> str:
    """The arguments the probe tried, as the could-not-call comment names them."""
    if not shapes:
        return ""
    return "tensors of shape " + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)


def _shaped_args(fn: object, shapes: tuple[Shape, ...]) -> GivenSample:
    """The sample's `args`/`kwargs` text and model values: a tensor per --shape, in order; for a
    torch.library op, its schema's other arguments as _schema_args writes them."""
    from opcheck.spec.model import TensorArg

    schema = _schema(fn)
    if schema is None:
        return GivenSample([_shape_text(s) for s in shapes], [], tuple(TensorArg(shape=s) for s in shapes), (), "")
    tensors = [a for a in schema.arguments if not a.has_default_value() and str(a.type) == "Tensor"]  # type: ignore[attr-defined]
    if len(tensors) != len(shapes):
        raise ValueError(
            f"--shape: {len(shapes)} given, and the op's schema has {len(tensors)} tensor argument(s) "
            f"without a default ({', '.join(a.name for a in tensors)}): give one --shape for each"
        )
    shape_of = dict(zip((a.name for a in tensors), shapes))
    args: list[str] = []
    kwargs: list[str] = []
    values: list[object] = []
    keywords: list[tuple[str, object]] = []
    for arg in schema.arguments:  # type: ignore[attr-defined]
        if arg.has_default_value():
            continue
        value: object
        if arg.name in shape_of:
            text, value = _shape_text(shape_of[arg.name]), TensorArg(shape=shape_of[arg.name])
        elif str(arg.type) in _SCHEMA_VALUES:
            text, value = _SCHEMA_VALUES[str(arg.type)]
        else:
            raise ValueError(
                f"--shape: the op's argument {arg.name} has type {arg.type}, which `opcheck new` cannot fill"
            )
        if arg.kwarg_only:
            kwargs.append(f"{arg.name}: {text}")
            keywords.append((arg.name, value))
        else:
            args.append(text)
            values.append(value)
    return GivenSample(args, kwargs, tuple(values), tuple(keywords), "")


def _found_lines(found: Found, name: str, op: str, library_op: bool, imports: tuple[str, ...]) -> dict[str, str]:
    """The spec lines what the probe found calls for, by where the template puts them."""
    lines: dict[str, list[str]] = {"dtypes": [], "flags": [], "batched": []}
    if found.float64 is not None:
        lowprec = found.lowprec or ("float32",)
        reference, resolved = _reference_for(name, op, imports)
        lines["dtypes"] += [
            _commented("dtypes: []", f"no float64 gradient check: {found.float64}"),
            _commented(f"lowprec_dtypes: [{', '.join(lowprec)}]", "the dtypes it runs at, each against the reference"),
            _commented(f"reference: {reference}", "the same math in plain torch, run in float64")
            if resolved
            else _commented(f"reference: {reference}", "fill in: the same math in plain torch, which runs in float64"),
        ]
    if found.batched_grad is not None:
        lines["batched"].append(_commented("  check_batched_grad: false", found.batched_grad))
    if found.gradgrad is not None:
        lines["flags"].append(_commented("supports_gradgrad: false", f"{found.gradgrad}; a test asserts it fails"))
    if found.forward_ad is not None and not library_op:  # the template declares it for those already
        lines["flags"].append(_commented("supports_forward_ad: false", f"{found.forward_ad}; a test asserts it fails"))
    if found.writes_inputs:
        lines["flags"].append(
            _commented("clone_inputs: true", f"it writes into {', '.join(found.writes_inputs)}: fresh copies per call")
        )
    if found.writes_grad_outputs:
        lines["flags"].append(
            _commented("writes_grad_outputs: true", "its backward writes into its grad_output: reported, not failed")
        )
    return {key: "\n".join(value) for key, value in lines.items()}


def _reference_for(name: str, op: str, imports: tuple[str, ...]) -> tuple[str, bool]:
    """The reference's path beside the op, `<module>:<function>_reference` (else `<name>_reference`),
    and whether it resolves already."""
    module, _, attr = op.partition(":") if ":" in op else ("mypkg.ops", "", "")
    stems = dict.fromkeys([attr, name] if attr.isidentifier() else [name])
    paths = [f"{module}:{stem}_reference" for stem in stems]
    for path in paths:
        try:
            resolve_op(path, imports=imports)
        except OpPathError:
            continue
        return path, True
    return paths[0], False


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
