"""The rules about a sparse tensor argument (`layout`, `density`, `nnz`, `blocksize`, `dense_dim`).

The schema checks each key's type and range; what is checked here needs several keys, or the
shape: which dims are sparse, whether a block divides them, how many cells a grid has, and whether
explicit `values` specify the same number of cells in every batch (torch requires it of compressed
layouts).
"""

from __future__ import annotations

from collections.abc import Iterator

from opcheck.spec import model
from opcheck.spec.checker import Checker
from opcheck.spec.model import Arg, SparseGeometry, TensorArg, TensorListArg, TupleArg, Values
from opcheck.spec.yamlload import Node

_SPARSE_KEYS = ("density", "nnz", "blocksize", "dense_dim")
_SPARSE_LAYOUT_LIST = ", ".join(model.LAYOUTS[1:])


def check_sparse(ctx: Checker, f: dict[str, Node], shape: tuple[int, ...], values: Values | None) -> None:
    """Report every problem of the tensor mapping `f` with its layout; `values` only when their
    shape is `shape`."""
    layout = f["layout"].value if "layout" in f else model.STRIDED
    if layout == model.STRIDED:
        for key in _SPARSE_KEYS:
            if key in f:
                ctx.report(
                    f[key],
                    f"`{key}` describes a sparse tensor, and this one is strided: set `layout` "
                    f"({_SPARSE_LAYOUT_LIST}) or drop `{key}`",
                    at_key=True,
                )
        return
    if f.get("noncontiguous") is not None and f["noncontiguous"].value:
        ctx.report(
            f["noncontiguous"],
            f"a {layout} tensor has no strides to make non-contiguous; `noncontiguous` applies to strided tensors",
            at_key=True,
        )
    maker = f["maker"].value if "maker" in f else None
    if maker not in model.SPARSE_MAKERS:
        ctx.report(
            f["maker"],
            f"maker {maker!r} structures a dense matrix, which leaving elements unspecified "
            f"would break; with a sparse layout only maker 'positive' works",
        )
    _check_amount(ctx, f, values)
    if not _check_dims(ctx, f, layout, shape):
        return
    blocksize = tuple(item.value for item in f["blocksize"].value) if "blocksize" in f else None
    if not _check_blocksize(ctx, f, layout, shape, blocksize):
        return
    geometry = SparseGeometry.of(shape, layout, blocksize, f["dense_dim"].value if "dense_dim" in f else 0)
    if "nnz" in f and f["nnz"].value > geometry.cells:
        ctx.report(
            f["nnz"], f"expected at most {geometry.cells} ({_grid_words(geometry, layout)}), got {f['nnz'].value}"
        )
    if values is not None and layout in model.COMPRESSED_LAYOUTS and geometry.batch_shape:
        _check_batch_counts(ctx, f["values"], layout, geometry, values)


def _check_amount(ctx: Checker, f: dict[str, Node], values: Values | None) -> None:
    if "values" in f:
        for key in ("density", "nnz"):
            if key in f:
                ctx.report(
                    f[key],
                    f"`{key}` has no effect when `values` are given: with a sparse layout, the "
                    "nonzero values are the specified elements",
                    at_key=True,
                )
    elif "density" in f and "nnz" in f:
        ctx.report(f["nnz"], "`density` and `nnz` both say how many elements are specified; keep one", at_key=True)


def _check_dims(ctx: Checker, f: dict[str, Node], layout: str, shape: tuple[int, ...]) -> bool:
    dense_dim = f["dense_dim"].value if "dense_dim" in f else 0
    rank = len(shape)
    at = f["dense_dim"] if dense_dim else f["layout"]
    dense = f" ahead of its {dense_dim} dense dim{'s' if dense_dim != 1 else ''}" if dense_dim else ""
    if layout == model.COO and rank - dense_dim < 1:
        ctx.report(
            at,
            f"a sparse_coo tensor needs at least 1 sparse dim{dense}; shape {list(shape)} has "
            f"{rank} dim{'s' if rank != 1 else ''}",
        )
        return False
    if layout in model.COMPRESSED_LAYOUTS and rank - dense_dim < 2:
        ctx.report(
            at,
            f"a {layout} tensor needs 2 sparse dims (batch dims may come before them){dense}; "
            f"shape {list(shape)} has {rank} dim{'s' if rank != 1 else ''}",
        )
        return False
    return True


def _check_blocksize(
    ctx: Checker, f: dict[str, Node], layout: str, shape: tuple[int, ...], blocksize: tuple[int, ...] | None
) -> bool:
    dense_dim = f["dense_dim"].value if "dense_dim" in f else 0
    sparse = list(shape[len(shape) - dense_dim - 2 : len(shape) - dense_dim])
    if layout not in model.BLOCK_LAYOUTS:
        if blocksize is not None:
            ctx.report(
                f["blocksize"],
                f"`blocksize` applies to sparse_bsr and sparse_bsc; this tensor is {layout}",
                at_key=True,
            )
            return False
        return True
    if blocksize is None:
        ctx.report(
            f["layout"],
            f"layout {layout!r} needs `blocksize: [rows, cols]`, each dividing its sparse dim (sparse dims {sparse})",
        )
        return False
    wrong = [f"{size} is not a multiple of {b}" for size, b in zip(sparse, blocksize) if size % b]
    if wrong:
        ctx.report(
            f["blocksize"], f"blocksize {list(blocksize)} must divide the sparse dims {sparse}: " + ", ".join(wrong)
        )
        return False
    return True


def _grid_words(geometry: SparseGeometry, layout: str) -> str:
    per_batch = " per batch" if geometry.batch_shape else ""
    sparse = list(geometry.sparse_shape)
    if layout in model.BLOCK_LAYOUTS:
        grid = " x ".join(map(str, geometry.grid_shape))
        return f"sparse dims {sparse} hold {grid} blocks of {list(geometry.block)}{per_batch}"
    return f"sparse dims {sparse} hold {geometry.cells} positions{per_batch}"


def _check_batch_counts(ctx: Checker, node: Node, layout: str, geometry: SparseGeometry, values: Values) -> None:
    counts = specified_per_batch(values, geometry)
    if len(set(counts)) > 1:
        cells = "blocks" if layout in model.BLOCK_LAYOUTS else "elements"
        ctx.report(
            node,
            f"a {layout} tensor specifies the same number of {cells} in every batch, but the nonzero "
            f"values specify {', '.join(map(str, counts))} in its {len(counts)} batches",
        )


def specified_per_batch(values: Values, geometry: SparseGeometry) -> list[int]:
    """How many cells hold a nonzero value, per batch (row-major over the batch dims)."""
    shape = geometry.batch_shape + geometry.sparse_shape + geometry.dense_shape
    flat = list(_flatten(values))
    cells: set[tuple[int, int]] = set()
    n_batch, n_sparse = len(geometry.batch_shape), len(geometry.sparse_shape)
    for position, value in enumerate(flat):
        if not value:
            continue
        index = _unravel(position, shape)
        batch = _ravel(index[:n_batch], geometry.batch_shape)
        cell = tuple(i // b for i, b in zip(index[n_batch : n_batch + n_sparse], geometry.block))
        cells.add((batch, _ravel(cell, geometry.grid_shape)))
    counts = [0] * geometry.batches
    for batch, _ in cells:
        counts[batch] += 1
    return counts


def may_be_sparse(node: Node) -> bool:
    """Whether a schema-checked part of a sample holds a sparse tensor mapping, or one with a key
    only a sparse tensor has (it may lack only its `layout`)."""
    if node.is_map:
        layout = node.value.get("layout")
        if (layout is not None and layout.value != model.STRIDED) or any(key in node.value for key in _SPARSE_KEYS):
            return True
    children = node.value.values() if node.is_map else node.value if node.is_list else ()
    return any(may_be_sparse(child) for child in children)


def has_sparse(arg: Arg) -> bool:
    if isinstance(arg, TensorArg):
        return arg.is_sparse
    if isinstance(arg, (TensorListArg, TupleArg)):
        return any(has_sparse(item) for item in arg.items)
    return False


def _flatten(values: object) -> Iterator[object]:
    if isinstance(values, tuple):
        for item in values:
            yield from _flatten(item)
    else:
        yield values


def _unravel(position: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index: list[int] = []
    for size in reversed(shape):
        position, i = divmod(position, size)
        index.append(i)
    return tuple(reversed(index))


def _ravel(index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    flat = 0
    for i, size in zip(index, shape):
        flat = flat * size + i
    return flat
