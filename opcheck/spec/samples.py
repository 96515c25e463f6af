"""Samples and their arguments: schema-checked nodes → model.Sample, with the rules about each.

Every function here is given a node the schema found clean, so the node's shape is known (a
sample is built only then, but its clean arguments are checked in any sample whose form can be
read); what is checked here is what a schema cannot say (exclusive keys, shapes that must agree,
ranges).
"""

from __future__ import annotations

import math

from opcheck.spec import model, values_file
from opcheck.spec.checker import Checker
from opcheck.spec.model import Arg, DtypeArg, Sample, TensorArg, TensorListArg, TupleArg, Values
from opcheck.spec.problems import show
from opcheck.spec.sparse import check_sparse
from opcheck.spec.yamlload import Node

_SQUARE_MAKERS = ("symmetric", "spd", "lower_triangular", "upper_triangular")
_DEFAULT_RANGE = (-2.0, 2.0)
_INDEX_RANGE = (0.0, 10.0)  # integer dtypes: the runtime's default for index arguments


def build_sample(ctx: Checker, node: Node) -> Sample | None:
    """The sample, or None when it has a problem (reported).

    A sample the schema found a problem in (readable, not clean) is not built, but what does not
    depend on that problem is still checked: each argument the schema found clean, and, when every
    key of the sample was understood, its source (an unknown key may be a misspelled one) and, when
    every argument is clean too, that one of them requires grad.
    """
    before = ctx.count()
    fields = node.value
    keys_known = all(ctx.key_clean(value) for value in fields.values())
    one_source = keys_known and _check_one_source(ctx, node)
    positional, named = _clean_arguments(ctx, fields)
    args = tuple(build_arg(ctx, item) for item in positional)
    kwargs = tuple((key, build_arg(ctx, value)) for key, value in named)
    every_argument = all(ctx.clean(fields[key]) for key in ("args", "kwargs") if key in fields)
    if one_source and every_argument and ("args" in fields or "kwargs" in fields):
        _check_something_requires_grad(ctx, node, list(args) + [value for _, value in kwargs])
    if ctx.count() != before or not ctx.clean(node):
        return None
    return Sample(
        name=fields["name"].value,
        args=args,
        kwargs=kwargs,
        generator=_text(fields.get("generator")),
        opinfo=_text(fields.get("opinfo")),
        location=node.loc,
    )


def _clean_arguments(ctx: Checker, fields: dict[str, Node]) -> tuple[list[Node], list[tuple[str, Node]]]:
    """The sample's arguments the schema found clean, positional and by keyword (all of them in a
    clean sample)."""
    args, kwargs = fields.get("args"), fields.get("kwargs")
    positional = args.value if ctx.readable(args) and args.is_list else []
    named = kwargs.value.items() if ctx.readable(kwargs) and kwargs.is_map else []
    return [item for item in positional if ctx.clean(item)], [(key, value) for key, value in named if ctx.clean(value)]


def _check_one_source(ctx: Checker, node: Node) -> bool:
    fields = node.value
    sources = [
        label
        for present, label in (
            ("args" in fields or "kwargs" in fields, "args/kwargs"),
            ("generator" in fields, "generator"),
            ("opinfo" in fields, "opinfo"),
        )
        if present
    ]
    if len(sources) == 1:
        return True
    got = " and ".join(sources) if sources else "none"
    ctx.report(node, f"a sample needs exactly one of args/kwargs, generator or opinfo; got {got}")
    return False


def _check_something_requires_grad(ctx: Checker, node: Node, args: list[Arg]) -> None:
    # gradcheck itself refuses such a sample, but only when the test runs, on every device.
    if not any(_differentiable(arg) for arg in args):
        ctx.report(
            node, "no argument requires grad: gradcheck needs at least one floating-point or complex tensor argument"
        )


def build_arg(ctx: Checker, node: Node) -> Arg:
    """A YAML argument → its model form; a list of literals becomes a plain tuple (see model.Arg)."""
    if node.is_map:
        if "tuple" in node.value:
            return TupleArg(tuple(build_arg(ctx, item) for item in node.value["tuple"].value))
        if set(node.value) == {"dtype"}:
            return DtypeArg(node.value["dtype"].value)
        return build_tensor(ctx, node)
    if node.is_list:
        if node.value and all(item.is_map for item in node.value):
            return TensorListArg(tuple(build_tensor(ctx, item) for item in node.value))
        return tuple(item.value for item in node.value)
    scalar: Arg = node.value
    return scalar


def build_tensor(ctx: Checker, node: Node) -> TensorArg:
    f = node.value
    shape = tuple(dim.value for dim in f["shape"].value)
    _check_size(ctx, f["shape"], shape)
    dtype = _text(f.get("dtype"))
    low, high = ctx.finite(f.get("low")), ctx.finite(f.get("high"))
    # A point that is not finite is reported (and so the sample dropped): only finite ones are kept.
    avoid = tuple(p for p in (ctx.finite(point) for point in _items(f.get("avoid"))) if p is not None)
    margin = ctx.finite(f.get("margin"))
    requires_grad = f["requires_grad"].value if "requires_grad" in f else None
    _check_grad_dtype(ctx, f, dtype, requires_grad)
    _check_range(ctx, f, dtype, low, high)
    _check_maker(ctx, f, shape, dtype)
    strides = _check_strides(ctx, f, shape, dtype, requires_grad)
    drawn = model.draw_shape(shape, strides)
    mask_values = _check_structure(ctx, f, drawn, dtype, requires_grad, expanded=drawn != shape)
    values = _check_values(ctx, f, shape, dtype)
    file_path = _check_values_file(ctx, f, shape, dtype)
    check_sparse(ctx, f, shape, values if values is not None and _nested_shape(f["values"]) == shape else None)
    blocksize = tuple(item.value for item in f["blocksize"].value) if "blocksize" in f else None
    return TensorArg(
        shape=shape,
        dtype=dtype,
        low=low,
        high=high,
        requires_grad=requires_grad,
        noncontiguous=f["noncontiguous"].value if "noncontiguous" in f else False,
        maker=_text(f.get("maker")),
        avoid=avoid,
        margin=margin if margin is not None else 0.1,
        values=values,
        values_file=file_path,
        values_key=_text(f.get("values_key")),
        layout=_text(f.get("layout")) or model.STRIDED,
        density=ctx.finite(f.get("density")),
        nnz=f["nnz"].value if "nnz" in f else None,
        blocksize=blocksize,  # the schema says: two items
        dense_dim=f["dense_dim"].value if "dense_dim" in f else 0,
        lowprec_dtype=_lowprec_dtype(ctx, f, dtype),
        strides=strides,
        share_on=ctx.finite(f.get("share_on")),
        rows_off=f["rows_off"].value if "rows_off" in f else 0,
        rows_on=f["rows_on"].value if "rows_on" in f else 0,
        mask_values=mask_values,
        fill=_number(f.get("fill")),
        gap=ctx.finite(f.get("gap")),
    )


def _lowprec_dtype(ctx: Checker, f: dict[str, Node], dtype: str | None) -> str | None:
    """`lowprec_dtype`, which only a tensor that takes the test's dtype can have."""
    node = f.get("lowprec_dtype")
    if node is None:
        return None
    if dtype is not None:
        ctx.report(
            node,
            f"`dtype: {dtype}` fixes this tensor's dtype in every test, the low-precision ones too; "
            "`lowprec_dtype` is for a tensor that otherwise takes the test's dtype: drop one of the two",
            at_key=True,
        )
        return None
    return _text(node)


def _check_size(ctx: Checker, node: Node, shape: tuple[int, ...]) -> None:
    # The schema bounds the rank and each dim; their product is the tensor's memory.
    numel = math.prod(shape)
    if numel > model.MAX_TENSOR_ELEMENTS:
        ctx.report(
            node,
            f"expected at most {model.MAX_TENSOR_ELEMENTS} elements (2**24) in one tensor, got "
            f"{numel} (shape {list(shape)})",
        )


def _check_grad_dtype(ctx: Checker, f: dict[str, Node], dtype: str | None, requires_grad: bool | None) -> None:
    if requires_grad and dtype in model.INDEX_DTYPES:
        ctx.report(
            f["requires_grad"],
            f"a tensor of dtype {dtype} can't require grad (only floating-point and "
            f"complex tensors can); drop `requires_grad` or change `dtype`",
        )


def _check_range(ctx: Checker, f: dict[str, Node], dtype: str | None, low: float | None, high: float | None) -> None:
    if low is None and high is None:
        return
    default_low, default_high = _INDEX_RANGE if dtype in model.INDEX_DTYPES else _DEFAULT_RANGE
    lo, hi = (low if low is not None else default_low), (high if high is not None else default_high)
    lo_text = _num(lo) + ("" if low is not None else " by default")
    hi_text = _num(hi) + ("" if high is not None else " by default")
    at = f["high"] if high is not None else f["low"]
    if not lo < hi:
        ctx.report(at, f"expected low < high, got low {lo_text} and high {hi_text} (values are uniform in [low, high))")
    elif dtype in model.INDEX_DTYPE_RANGES:
        # The runtime draws integers in [ceil(low), ceil(high)) with torch.randint, whose bounds
        # are int64s, then casts: past the dtype's range the values would wrap around.
        smallest, largest = model.INDEX_DTYPE_RANGES[dtype]
        largest = min(largest + 1, 2**63 - 1)
        if math.ceil(lo) < smallest or math.ceil(hi) > largest:
            ctx.report(
                at,
                f"expected low and high within [{smallest}, {largest}] for a tensor of dtype {dtype}, "
                f"got low {lo_text} and high {hi_text}",
            )


def _check_maker(ctx: Checker, f: dict[str, Node], shape: tuple[int, ...], dtype: str | None) -> None:
    maker = _text(f.get("maker"))
    if maker is None:
        return
    at = f["maker"]
    if maker in _SQUARE_MAKERS and (len(shape) < 2 or shape[-1] != shape[-2]):
        ctx.report(
            at,
            f"maker {maker!r} needs at least 2 dims with square last two (e.g. [3, 3] or "
            f"[2, 4, 4]), got shape {list(shape)}",
        )
    elif maker == "orthogonal" and len(shape) < 2:
        ctx.report(
            at,
            f"maker 'orthogonal' needs at least 2 dims (orthonormal columns for tall, rows for "
            f"wide), got shape {list(shape)}",
        )
    elif maker == "unit_norm" and not shape:
        ctx.report(at, f"maker 'unit_norm' needs at least 1 dim, got shape {list(shape)}")
    if dtype in model.INDEX_DTYPES and maker in model.MATRIX_MAKERS and not (maker == "positive" and dtype != "bool"):
        ctx.report(at, f"maker {maker!r} needs a floating-point or complex dtype, got {dtype}")
    if "values" in f:
        ctx.report(at, "`maker` and `values` both set the values; keep one")


_STRUCTURE_KEYS = {
    "share_on": "mask",
    "rows_off": "mask",
    "rows_on": "mask",
    "mask_values": "mask",
    "fill": "constant",
    "gap": "dominant",
}


def _check_structure(
    ctx: Checker,
    f: dict[str, Node],
    shape: tuple[int, ...],
    dtype: str | None,
    requires_grad: bool | None,
    expanded: bool = False,
) -> tuple[float, float] | None:
    """The keys of the structure makers (mask, dominant, integer, constant) for a tensor whose values
    are drawn at `shape` (model.draw_shape); mask_values when clean."""
    maker = _text(f.get("maker"))
    for key, owner in _STRUCTURE_KEYS.items():
        if key in f and maker != owner:
            ctx.report(f[key], f"`{key}` belongs to maker {owner!r}; add `maker: {owner}` or drop `{key}`", at_key=True)
    if maker not in model.STRUCTURE_MAKERS:
        return None
    at = f["maker"]
    if "avoid" in f:
        ctx.report(f["avoid"], f"`avoid` has no effect with maker {maker!r}, which places the values", at_key=True)
    floating = dtype is None or dtype not in model.INDEX_DTYPES
    if maker in ("dominant", "integer") and not floating:
        ctx.report(at, f"maker {maker!r} makes floating-point values; this tensor is {dtype}")
    if maker in ("mask", "constant"):
        for key in ("low", "high"):
            if key in f:
                ctx.report(f[key], f"`{key}` has no effect with maker {maker!r}", at_key=True)
    if maker == "constant" and "fill" not in f:
        ctx.report(at, "maker 'constant' needs `fill`, the value of every entry")
    if maker == "constant" and "fill" in f:
        _check_entry(ctx, f["fill"], dtype, requires_grad)
    if maker == "dominant" and not shape:
        ctx.report(at, "maker 'dominant' makes one entry per row (the last dim) dominant; shape [] has no rows")
    if maker != "mask":
        return None
    rows = math.prod(shape[:-1]) if shape else 1
    fixed = (f["rows_off"].value if "rows_off" in f else 0) + (f["rows_on"].value if "rows_on" in f else 0)
    if fixed > rows:
        ctx.report(
            f["rows_off"] if "rows_off" in f else f["rows_on"],
            f"expected rows_off + rows_on at most the {rows} row(s) along the last dim"
            + (" that are drawn (its expanded dims repeat them)" if expanded else "")
            + f", got {fixed}",
        )
    node = f.get("mask_values")
    if node is None:
        return None
    if dtype == "bool":
        ctx.report(node, "a bool mask's entries are false and true; `mask_values` is for numeric masks", at_key=True)
        return None
    pair = [item for item in node.value]
    clean = all(_check_entry(ctx, item, dtype, requires_grad) for item in pair)
    return (float(pair[0].value), float(pair[1].value)) if clean else None


def _check_entry(ctx: Checker, node: Node, dtype: str | None, requires_grad: bool | None) -> bool:
    """A value a structure maker puts in the tensor (`fill`, an item of `mask_values`): an integer
    within an integer dtype's range; for floats, ±inf only where the tensor does not require grad."""
    value = node.value
    if dtype in model.INDEX_DTYPE_RANGES or dtype == "bool":
        low, high = model.INDEX_DTYPE_RANGES.get(dtype, (0, 1))
        if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
            ctx.report(node, f"expected an integer in [{low}, {high}] for a tensor of dtype {dtype}, got {show(value)}")
            return False
        return True
    if isinstance(value, float) and math.isnan(value):
        ctx.report(node, "expected a number, got .nan: a NaN entry makes every comparison of the output fail")
        return False
    if not _is_finite(value) and requires_grad is not False:
        ctx.report(
            node,
            f"an entry of {show(value)} cannot be perturbed by a gradient check: add `requires_grad: false` "
            "(an additive mask takes no gradient)",
        )
        return False
    return True


def _check_strides(
    ctx: Checker, f: dict[str, Node], shape: tuple[int, ...], dtype: str | None, requires_grad: bool | None
) -> tuple[int, ...] | None:
    """`strides`, when it lays out `shape` without two elements sharing memory (but along expanded
    dims, stride 0, which need requires_grad: false)."""
    node = f.get("strides")
    if node is None:
        return None
    strides = tuple(item.value for item in node.value)
    if "noncontiguous" in f and f["noncontiguous"].value:
        ctx.report(f["noncontiguous"], "`strides` gives the layout; drop `noncontiguous`", at_key=True)
    if "layout" in f and f["layout"].value != model.STRIDED:
        layout = f["layout"].value
        ctx.report(node, f"a {layout} tensor has no strides; `strides` applies to strided tensors", at_key=True)
        return None
    if len(strides) != len(shape):
        ctx.report(node, f"expected {len(shape)} strides, one per dim of shape {list(shape)}, got {len(strides)}")
        return None
    if 0 in shape:
        return strides
    expanded = [d for d, (n, st) in enumerate(zip(shape, strides)) if st == 0 and n > 1]
    differentiable = requires_grad if requires_grad is not None else dtype is None or dtype not in model.INDEX_DTYPES
    if expanded and differentiable:
        ctx.report(
            node,
            f"dim {', '.join(map(str, expanded))} has stride 0 (expanded), so its elements share memory, which a "
            "gradient check cannot perturb one by one (torch.autograd.gradcheck refuses such inputs): add "
            "`requires_grad: false`, or give the dim a stride",
        )
    overlap = _overlap(shape, strides)
    if overlap is not None:
        ctx.report(node, overlap)
        return None
    span = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    if span > model.MAX_STORAGE_ELEMENTS:
        ctx.report(
            node, f"expected a layout spanning at most {model.MAX_STORAGE_ELEMENTS} elements (2**26), got {span}"
        )
        return None
    return strides


def _overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> str | None:
    """Why two elements of the layout share memory, outside expanded dims; None when none do.

    With the dims ordered by stride, each stride must pass the span of the dims below it (what
    torch's own non-overlapping test asks)."""
    dims = sorted((st, n, d) for d, (n, st) in enumerate(zip(shape, strides)) if n > 1 and st > 0)
    span = 1
    below: list[int] = []
    for st, n, d in dims:
        if st < span:
            return (
                f"dim {d} (stride {st}) steps inside the span of dim(s) {', '.join(map(str, below))} "
                f"({span} elements), so two elements share memory: a layout overlaps only along expanded "
                "(stride 0) dims"
            )
        span = st * (n - 1) + span
        below.append(d)
    return None


def _check_values(ctx: Checker, f: dict[str, Node], shape: tuple[int, ...], dtype: str | None) -> Values | None:
    node = f.get("values")
    if node is None:
        return None
    for key in ("low", "high", "avoid"):
        if key in f:
            ctx.report(f[key], f"`{key}` has no effect when `values` are given", at_key=True)
    given = _nested_shape(node)
    if given is None:
        ctx.report(node, "expected a nested list with rows of equal length, got a ragged one")
    elif given != shape:
        ctx.report(node, f"values have shape {list(given)}, but `shape` is {list(shape)}")
    _check_value_kinds(ctx, node, dtype)
    return _nested_tuple(node)


def _check_values_file(ctx: Checker, f: dict[str, Node], shape: tuple[int, ...], dtype: str | None) -> str | None:
    """The values file's path relative to the project root, once it is known to hold a tensor
    that fits `shape` and `dtype` (every problem reported, and None, otherwise)."""
    node, key_node = f.get("values_file"), f.get("values_key")
    if node is None:
        if key_node is not None:
            ctx.report(key_node, "`values_key` names an entry of a `values_file`; add one, or drop it", at_key=True)
        return None
    for name in ("low", "high", "avoid"):
        if name in f:
            ctx.report(f[name], f"`{name}` has no effect when `values_file` is given", at_key=True)
    for name in ("values", "maker"):
        if name in f:
            ctx.report(node, f"`values_file` and `{name}` both set the values; keep one")
    if "layout" in f and f["layout"].value != model.STRIDED:
        ctx.report(
            f["layout"],
            f"a values file holds a strided (dense) tensor; a {f['layout'].value} tensor takes `values` "
            "or drawn values: drop `layout` or `values_file`",
        )
    try:
        path = values_file.project_path(node.value, ctx.source)
    except ValueError as e:
        ctx.report(node, str(e))
        return None
    key = _text(key_node)
    written = values_file.show_text(node.value)
    try:
        tensor = ctx.values_files.tensor(path, key)
    except values_file.ValuesFileError as e:
        if e.missing:
            ctx.report(node, f"no such file {written} (relative to {values_file.spec_folder(ctx.source)})")
        else:
            ctx.report(key_node if e.about_key and key_node is not None else node, f"{written}: {e}")
        return None
    problem = values_file.mismatch(tensor, shape, dtype)
    if problem:
        ctx.report(node, f"{written}{'' if key is None else f'[{show(key)}]'}: {problem}")
        return None
    return path


def _nested_shape(node: Node) -> tuple[int, ...] | None:
    """The shape of a nested list of numbers; None when ragged."""
    if not node.is_list:
        return ()
    inner = {_nested_shape(item) for item in node.value}
    if len(inner) > 1:
        return None
    rest = inner.pop() if inner else ()
    return None if rest is None else (len(node.value),) + rest


def _check_value_kinds(ctx: Checker, node: Node, dtype: str | None) -> None:
    if node.is_list:
        for item in node.value:
            _check_value_kinds(ctx, item, dtype)
        return
    value = node.value
    if dtype == "bool":
        ok, wanted = isinstance(value, bool), "true or false"
    elif dtype in model.INDEX_DTYPES:
        low, high = model.INDEX_DTYPE_RANGES[dtype]
        ok, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
        if ok and not low <= value <= high:  # torch.tensor() refuses it when the test runs
            ok, wanted = False, f"an integer in [{low}, {high}]"
    else:
        ok, wanted = not isinstance(value, bool), "a number"
        if ok and not _is_finite(value):  # like `low`/`high`: a gradient check of nan says nothing
            ok, wanted = False, "a finite number"
    if not ok:
        tensor = f"a tensor of dtype {dtype}" if dtype else "a floating-point tensor"
        ctx.report(node, f"expected {wanted} for {tensor}, got {show(value)}")


def _is_finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond float64's range
        return False


def _nested_tuple(node: Node) -> Values:
    if node.is_list:
        return tuple(_nested_tuple(item) for item in node.value)
    number: Values = node.value
    return number


def _differentiable(arg: Arg) -> bool:
    if isinstance(arg, TensorArg):
        if arg.requires_grad is not None:
            return arg.requires_grad
        return arg.dtype is None or arg.dtype not in model.INDEX_DTYPES
    if isinstance(arg, (TensorListArg, TupleArg)):
        return any(_differentiable(item) for item in arg.items)
    return False


def _items(node: Node | None) -> list[Node]:
    return node.value if node is not None else []


def _number(node: Node | None) -> float | None:
    return float(node.value) if node is not None else None


def _text(node: Node | None) -> str | None:
    return node.value if node is not None else None


def _num(x: float) -> str:
    return repr(int(x)) if x == int(x) else repr(x)
