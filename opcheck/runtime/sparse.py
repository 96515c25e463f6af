"""Sparse sample tensors: dense values drawn as for any tensor, then a drawn pattern kept.

A sparse TensorArg is built from the same seeded generator as every other argument, in argument
order: first its dense values (makers.draw_values, on the CPU, at the test's dtype), then its
pattern, the cells of the sparse grid that are specified (see model.SparseGeometry: an element,
or a block for bsr/bsc; the same count in every batch of a compressed layout). The pattern is a
ones-mask of the full element grid converted to the layout, and the tensor is
`values.sparse_mask(pattern)`: the values at the specified positions, exact zeros included.
With explicit `values`, the specified cells are those holding a nonzero value.

The draw: one uniform key per cell and batch, and the `count` smallest keys of each batch are
specified (a stable argsort, so ties cannot depend on the machine).
"""

from __future__ import annotations

import warnings

import torch

from opcheck.runtime.makers import SampleError
from opcheck.spec import model
from opcheck.spec.model import SparseGeometry, TensorArg

TORCH_LAYOUTS = {
    model.COO: torch.sparse_coo,
    "sparse_csr": torch.sparse_csr,
    "sparse_csc": torch.sparse_csc,
    "sparse_bsr": torch.sparse_bsr,
    "sparse_bsc": torch.sparse_bsc,
}
LAYOUT_NAMES = {layout: name for name, layout in TORCH_LAYOUTS.items()}


def sparsify(values: torch.Tensor, arg: TensorArg, gen: torch.Generator) -> torch.Tensor:
    """The sparse tensor of arg.layout holding `values` (CPU, contiguous) at the drawn pattern."""
    geometry = arg.geometry()
    cells = (
        _explicit_cells(values, geometry)
        if arg.values is not None
        else _drawn_cells(arg.specified_count(), geometry, gen)
    )
    mask = _element_mask(cells, geometry)
    try:
        with warnings.catch_warnings():
            # torch warns once per process that compressed layouts are in beta: noise in every
            # report, and nothing a spec's author can act on.
            warnings.filterwarnings(
                "ignore", message=r"Sparse \w+ tensor support is in beta state", category=UserWarning
            )
            return _with_pattern(values, mask, arg, geometry)
    except (RuntimeError, NotImplementedError) as e:  # a dtype torch's sparse kernels lack, ...
        raise SampleError(
            f"layout: torch cannot make a {arg.layout} tensor of {values.dtype}: {str(e).splitlines()[0]}"
        ) from None


def _with_pattern(values: torch.Tensor, mask: torch.Tensor, arg: TensorArg, geometry: SparseGeometry) -> torch.Tensor:
    if arg.layout == model.COO:
        pattern = mask.to_sparse(len(geometry.sparse_shape)).coalesce()
        return values.sparse_mask(pattern).coalesce()
    pattern = mask.to_sparse(layout=TORCH_LAYOUTS[arg.layout], blocksize=arg.blocksize, dense_dim=arg.dense_dim or None)
    return values.sparse_mask(pattern)


def _drawn_cells(count: int, geometry: SparseGeometry, gen: torch.Generator) -> torch.Tensor:
    """A bool mask of shape batch + grid with `count` cells set in every batch."""
    batches, cells = geometry.batches, geometry.cells
    keys = torch.rand((batches, cells), generator=gen, dtype=torch.float64)
    chosen = torch.argsort(keys, dim=-1, stable=True)[:, :count]
    mask = torch.zeros((batches, cells), dtype=torch.bool).scatter_(1, chosen, True)
    return mask.reshape(geometry.batch_shape + geometry.grid_shape)


def _explicit_cells(values: torch.Tensor, geometry: SparseGeometry) -> torch.Tensor:
    """The cells holding a nonzero value: in any of their dense dims, anywhere in their block."""
    nonzero = values != 0
    lead = geometry.batch_shape + geometry.sparse_shape
    nonzero = nonzero.reshape(lead + (-1,)).any(-1) if geometry.dense_shape else nonzero
    if any(b > 1 for b in geometry.block):
        (rows, cols), (br, bc) = geometry.grid_shape, geometry.block
        nonzero = nonzero.reshape(geometry.batch_shape + (rows, br, cols, bc)).any(-1).any(-2)
    return nonzero


def _element_mask(cells: torch.Tensor, geometry: SparseGeometry) -> torch.Tensor:
    """float64 ones at every element of a specified cell, zeros elsewhere, in the full shape."""
    mask = cells
    if any(b > 1 for b in geometry.block):  # bsr/bsc: each cell a block of the two sparse dims
        rows, cols = geometry.block
        mask = mask.repeat_interleave(rows, dim=-2).repeat_interleave(cols, dim=-1)
    shape = geometry.batch_shape + geometry.sparse_shape + geometry.dense_shape
    mask = mask.reshape(mask.shape + (1,) * len(geometry.dense_shape)).expand(shape)
    return mask.to(torch.float64).contiguous()


def describe_layout(t: torch.Tensor) -> list[str]:
    """Notes for describe_value: "sparse_csr", "nnz=13" (per batch, blocks), blocksize, dense_dim."""
    name = LAYOUT_NAMES.get(t.layout)
    if name is None:
        return [str(t.layout).replace("torch.", "")]
    notes = [name]
    compressed = t.layout != torch.sparse_coo
    batched = compressed and t.dim() - t.dense_dim() > 2
    blocked = t.layout in (torch.sparse_bsr, torch.sparse_bsc)
    nnz = t._nnz()
    unit = (" block" if nnz == 1 else " blocks") if blocked else ""
    notes.append(f"nnz={nnz}{unit}" + (" per batch" if batched else ""))
    if blocked:
        notes.append("blocksize=" + "x".join(str(n) for n in t.values().shape[-2 - t.dense_dim() :][:2]))
    if t.dense_dim():
        notes.append(f"dense_dim={t.dense_dim()}")
    return notes
