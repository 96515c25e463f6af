"""Sparse (COO, CSR, CSC, BSR, BSC) and MKLDNN inputs, checked through dense stand-ins.

torch.autograd.gradcheck 2.13 treats an input of such a layout as a tensor of its dense shape:
the Jacobian has a column per dense position; the numerical columns come from perturbing the
values of the input one specified element at a time (unspecified positions give zero columns),
and the analytical ones from `to_dense()` of the gradient that backward returns at the input as
given. With `masked=False` the numerical side first "densifies" the input (every position
specified, the unspecified ones with value zero), so the gradient must be right at every
position; with `masked=True` it must be right at the specified ones and zero elsewhere.

Here each such input that requires grad is replaced by a dense strided stand-in of its shape, and
the function by one that rebuilds the layout from the stand-in before calling it:

- at the stand-in's own values (the analytical evaluations) it gets a copy of the input as given,
  the same layout, indices and values;
- perturbed (the numerical evaluations) it gets the layout rebuilt on the numerical pattern (the
  input's, or the densified one), with values read from the stand-in: unspecified positions of
  that pattern are not read, so their columns are zero, as in torch. The numerical Jacobian's loop
  skips the stand-in altogether (ValueDifferences): like torch, it moves one value of a tensor of
  that pattern in place and calls the function itself, which spares a rebuild per call;
- backward passes `to_dense()` of the gradient that reached the input on to the stand-in. The
  full check's rows come from the call as given instead (rows_call), as torch's do: one backward
  per row on the input itself, its gradient densified where the row is stored.

So the Jacobian comparisons (every mode, and their diagnostics) run unchanged on dense tensors.
What depends on the layout itself stays on the input as given: the zero-grad_output, undefined-grad
and batched-gradient checks (aux_checks.py) run on the original call, as torch runs them, and
fast mode draws its random directions as torch does for these layouts (on the specified values
only). The rebuilt tensors cannot be vmapped, so these calls use the loop. Forward-mode AD is
refused the way torch refuses it (make_dual cannot take a sparse tensor; MKLDNN is refused by name).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.autograd.forward_ad as fwAD

from opcheck._records import record
from opcheck.engine._util import MKLDNN, is_float_or_complex, is_layout_input, make_dual, requires_grad, unravel
from opcheck.engine.batching import Differences
from opcheck.engine.reporting import torch_words

if TYPE_CHECKING:
    from opcheck.engine.context import Call  # context.py imports this module
    from opcheck.engine.reporting.diagnostics import JacobianMismatch

_ROW_COMPRESSED = (torch.sparse_csr, torch.sparse_bsr)


# ------------------------------------------------------------------------------------ patterns
def _coo_positions(x: torch.Tensor) -> torch.Tensor:
    """Flat dense position of every element of x._values(), shaped like it."""
    sparse_shape = x.shape[: x.sparse_dim()]
    dense_numel = x._values()[0].numel() if x._nnz() else int(torch.Size(x.shape[x.sparse_dim() :]).numel())
    strides = torch.ones(len(sparse_shape), dtype=torch.long)
    for i in range(len(sparse_shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * sparse_shape[i + 1]
    sparse_flat = (
        (x._indices().cpu() * strides.unsqueeze(1)).sum(0)
        if len(sparse_shape)
        else torch.zeros(x._nnz(), dtype=torch.long)
    )
    pos = sparse_flat.unsqueeze(1) * dense_numel + torch.arange(dense_numel).unsqueeze(0)
    return pos.reshape(x._values().shape)


def _compressed_indices(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.layout in _ROW_COMPRESSED:
        return x.crow_indices(), x.col_indices()
    return x.ccol_indices(), x.row_indices()


def _compressed_positions(x: torch.Tensor) -> torch.Tensor:
    """Flat dense position of every element of x.values(), shaped like it (no duplicates there)."""
    compressed, plain = _compressed_indices(x)
    n = x.values().numel()
    label = torch.arange(1, n + 1, dtype=torch.float64).reshape(x.values().shape)
    probe = torch.sparse_compressed_tensor(
        compressed.cpu(), plain.cpu(), label, x.shape, layout=x.layout, check_invariants=False
    )
    flat = probe.to_dense().reshape(-1)
    where = torch.nonzero(flat).squeeze(1)
    pos = torch.empty(n, dtype=torch.long)
    pos[flat[where].long() - 1] = where
    return pos.reshape(x.values().shape)


def _last_occurrences(pos: torch.Tensor) -> torch.Tensor:
    """Mask of the values (first dim) that are the last to name their position (an uncoalesced COO
    tensor may name one several times; torch's Jacobian keeps the last one's column)."""
    first = pos.reshape(pos.shape[0], -1)[:, 0] if pos.numel() else pos.reshape(-1)
    keep = torch.ones(first.numel(), dtype=torch.bool)
    seen: set[int] = set()
    for k in range(first.numel() - 1, -1, -1):
        p = int(first[k])
        if p in seen:
            keep[k] = False
        seen.add(p)
    return keep


@record(frozen=False)
class _Pattern:
    """A layout's index structure with a map from its values to dense positions."""

    build: Callable[[torch.Tensor], torch.Tensor]  # values -> tensor of the layout
    values: torch.Tensor  # the values at the input (for the uncoalesced form)
    positions: torch.Tensor  # flat dense position of each values element
    last: torch.Tensor | None = None  # uncoalesced COO: which values are read from the stand-in

    def rebuild(self, dense: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
        flat = dense.reshape(-1)
        pos = self.positions.to(dense.device)
        if self.last is None:
            return self.build(flat[pos])
        values = self.values.clone()
        last = self.last.to(dense.device)
        values[last] += (flat - center.reshape(-1))[pos[last]]
        return self.build(values)


def _coo_pattern(x: torch.Tensor) -> _Pattern:
    indices, values, size, coalesced = x._indices().detach(), x._values().detach(), x.shape, x.is_coalesced()

    def build(v: torch.Tensor) -> torch.Tensor:
        return torch.sparse_coo_tensor(indices, v, size, is_coalesced=coalesced, check_invariants=False)

    pos = _coo_positions(x)
    return _Pattern(build, values, pos, None if coalesced else _last_occurrences(pos))


def _compressed_pattern(x: torch.Tensor) -> _Pattern:
    compressed, plain = _compressed_indices(x)
    size, layout = x.shape, x.layout

    def build(v: torch.Tensor) -> torch.Tensor:
        return torch.sparse_compressed_tensor(compressed, plain, v, size, layout=layout, check_invariants=False)

    return _Pattern(build, x.values().detach(), _compressed_positions(x))


def _full_coo(x: torch.Tensor) -> torch.Tensor:
    """x's shape, sparse_dim and dense_dim, every sparse position specified (torch's densify)."""
    ones = torch.ones(x.shape[: x.sparse_dim()], dtype=torch.int8, device=x.device)
    indices = ones.nonzero().t().to(dtype=x._indices().dtype)
    values = torch.ones((ones.numel(), *x.shape[x.sparse_dim() :]), dtype=x.dtype, device=x.device)
    return torch.sparse_coo_tensor(indices, values, x.shape, check_invariants=False)._coalesced_(True)


def _numerical_pattern(x: torch.Tensor, masked: bool) -> _Pattern:
    """The pattern torch perturbs: the input's own, or (masked=False) every position specified."""
    if x.layout == torch.sparse_coo:
        return _coo_pattern(x.detach() if masked else _full_coo(x))
    if masked:
        return _compressed_pattern(x.detach())
    # torch densifies through COO, which cannot hold batch dimensions; the full pattern of a dense
    # tensor is the same one, batched or not.
    n_batch = x.crow_indices().dim() - 1 if x.layout in _ROW_COMPRESSED else x.ccol_indices().dim() - 1
    blocksize = (
        tuple(x.values().shape[n_batch + 1 : n_batch + 3]) if x.layout in (torch.sparse_bsr, torch.sparse_bsc) else None
    )
    full = torch.ones(x.shape, dtype=x.dtype, device=x.device).to_sparse(
        layout=x.layout, blocksize=blocksize, dense_dim=x.dense_dim()
    )
    return _compressed_pattern(full)


# ------------------------------------------------------------------------------------ stand-ins
@record
class ValueDifferences(Differences):
    """Central differences where some inputs are sparse tensors of the numerical pattern: their
    column for a dense position comes from moving the value stored there, as torch moves it."""

    values: dict[int, tuple[torch.Tensor, dict[int, int]]] = field(default_factory=dict)
    """Per sparse input index: its values, flat, and which of them holds each dense position."""

    def column(self, idx: int, k: int, p: complex = 1, positions: Sequence[int] | None = None) -> list[torch.Tensor]:
        if idx not in self.values:
            return super().column(idx, k, p, positions)
        flat, where = self.values[idx]
        shape = self.inputs[idx].shape
        delta = self.eps * p if p != 1 else self.eps
        return self.along(flat[where[k]], delta, idx=unravel(k, shape) if len(shape) else (), positions=positions)


class _StandIn:
    """A dense strided tensor standing in for one sparse or MKLDNN input that requires grad."""

    def __init__(self, index: int, original: torch.Tensor, masked: bool):
        self.index = index
        self.original = original
        with torch.no_grad():
            dense = original.detach().to_dense()
        self.dense = dense.clone().requires_grad_(True)
        self.center = dense.clone()
        self.masked = masked
        self.pattern = None if original.layout == MKLDNN else _numerical_pattern(original, masked)
        self.numerical_positions = (
            None if self.pattern is None else sorted(set(self.pattern.positions.reshape(-1).tolist()))
        )
        self.specified = None  # per dense position (flat), whether the input as given specifies it
        if self.pattern is not None:
            own = (
                _coo_positions(original.detach())
                if original.layout == torch.sparse_coo
                else _compressed_positions(original.detach())
            )
            mask = torch.zeros(original.numel(), dtype=torch.bool)
            mask[own.reshape(-1)] = True
            self.specified = mask.tolist()

    def numerical_values(self) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
        """A tensor of the numerical pattern at the stand-in's current values, requiring grad like
        the input; its values, flat, to move in place; and which of them holds each dense position
        (of an uncoalesced COO tensor's duplicates, the last, whose column torch keeps)."""
        assert self.pattern is not None
        tensor = self.pattern.rebuild(self.dense.detach(), self.center)
        tensor.requires_grad_(self.original.requires_grad)
        data = tensor.detach()  # shares the values; moving them in place records nothing
        values = (data._values() if data.layout == torch.sparse_coo else data.values()).view(-1)
        positions = self.pattern.positions.reshape(-1).tolist()
        last = self.pattern.last
        per_row = max(1, len(positions) // max(1, self.pattern.positions.shape[0])) if positions else 1
        where = {pos: e for e, pos in enumerate(positions) if last is None or bool(last[e // per_row])}
        return tensor, values, where

    def at(self, dense: torch.Tensor) -> torch.Tensor:
        """The layout tensor the function gets for the stand-in's current values."""
        if _bitwise_equal(dense, self.center):
            return self.original.detach().clone()
        if self.pattern is None:
            return dense.detach().to_mkldnn()
        return self.pattern.rebuild(dense.detach(), self.center)

    def random_vector(self, generator: torch.Generator, downcast_complex: bool) -> torch.Tensor | None:
        """torch's fast-mode direction for this layout (random specified values, normalized), dense
        and flat; None for MKLDNN, which torch draws like a dense tensor."""
        x = self.original
        if self.pattern is None:
            return None
        values = x._values() if x.layout == torch.sparse_coo else x.values()
        dtype = x.dtype
        if downcast_complex:
            dtype = {torch.complex128: torch.float64, torch.complex64: torch.float32}.get(dtype, dtype)
        vals = torch.rand(values.numel(), generator=generator).to(dtype=dtype).view(values.shape)
        vals /= vals.norm()
        if x.layout == torch.sparse_coo:
            vec = torch.sparse_coo_tensor(x._indices().cpu(), vals, x.size(), check_invariants=False)
        else:
            compressed, plain = _compressed_indices(x)
            vec = torch.sparse_compressed_tensor(
                compressed.cpu(), plain.cpu(), vals, x.size(), layout=x.layout, check_invariants=False
            )
        return vec.to_dense().reshape(-1).to(x.device)


def _flat(index: tuple[int, ...], shape: Sequence[int]) -> int:
    flat = 0
    for i, size in zip(index, shape):
        flat = flat * size + i
    return flat


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.detach().reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


class _FromDense(torch.autograd.Function):
    """stand-in (dense) -> the layout tensor; backward: the gradient's to_dense()."""

    @staticmethod
    def forward(ctx: Any, dense: torch.Tensor, stand_in: _StandIn) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        return stand_in.at(dense)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, None]:
        if grad is None:
            return None, None
        return (grad.to_dense() if grad.layout != torch.strided else grad), None


def _from_dense(dense: torch.Tensor, stand_in: _StandIn) -> torch.Tensor:
    # Function.apply is untyped in some torch releases and typed in others: call it through a cast,
    # which needs no `type: ignore` on either.
    apply = cast("Callable[..., torch.Tensor]", _FromDense.apply)
    return apply(dense, stand_in)


class LayoutInputs:
    """The stand-ins of one gradcheck call's sparse and MKLDNN inputs that require grad."""

    def __init__(self, inputs: tuple[Any, ...], masked: bool):
        self.stand_ins = {
            i: _StandIn(i, a, bool(masked)) for i, a in enumerate(inputs) if requires_grad(a) and is_layout_input(a)
        }
        self.inputs = tuple(self.stand_ins[i].dense if i in self.stand_ins else a for i, a in enumerate(inputs))
        self._by_id = {id(s.dense): s for s in self.stand_ins.values()}
        self._wrapped: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # id -> (wrapped, func)
        self._derived: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # id -> (derived, of func)
        self.given: Call | None = None  # the call as given, whose rows the full check takes (rows_call)

    def __bool__(self) -> bool:
        return bool(self.stand_ins)

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """func as a function of the stand-ins."""
        stand_ins = self.stand_ins

        def with_layouts(*args: Any) -> Any:
            return func(*(_from_dense(a, stand_ins[i]) if i in stand_ins else a for i, a in enumerate(args)))

        self._wrapped[id(with_layouts)] = (with_layouts, func)
        return with_layouts

    def derive(
        self, fn: Callable[..., Any], make: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> Callable[..., Any]:
        """make(fn); where fn is wrap's function, the numerical loop calls make() of the function as
        given in its place (a complex output's real or imaginary part, moving the values in place as
        torch does, not through the stand-ins)."""
        made = make(fn)
        wrapped = self._wrapped.get(id(fn))
        if wrapped is not None and wrapped[0] is fn:
            self._derived[id(made)] = (made, make(wrapped[1]))
        return made

    def _unwrapped(
        self, fn: Callable[..., Any], inputs: Sequence[Any], derived: bool = False
    ) -> Callable[..., Any] | None:
        """The function as given, where fn at inputs is the stand-ins' call (wrap's function at
        self.inputs, or with `derived`, one derive() made of it); else None."""
        same = len(inputs) == len(self.inputs) and all(a is b for a, b in zip(inputs, self.inputs))
        for table in (self._wrapped, self._derived) if derived else (self._wrapped,):
            found = table.get(id(fn))
            if found is not None and found[0] is fn and same:
                return found[1]
        return None

    def rows_call(self, call: Call) -> Call:
        """The call whose backward gives the full check's analytical rows: for the stand-ins' call,
        the call as given (torch's rows, without a stand-in's backward in every pass), else `call`."""
        if self.given is None or self._unwrapped(call.func, call.inputs) is None:
            return call
        return self.given

    def differences(self, diffs: Differences) -> Differences:
        """The numerical loop's central differences: torch's, moving the values of each sparse input
        in place and calling the function itself, where `diffs` are those of a wrapped function at the
        stand-ins; otherwise `diffs` as they are (MKLDNN inputs go through their stand-ins)."""
        func = self._unwrapped(diffs.fn, diffs.inputs, derived=True)
        if func is None or any(s.pattern is None for s in self.stand_ins.values()):
            return diffs
        inputs = list(diffs.inputs)
        values: dict[int, tuple[torch.Tensor, dict[int, int]]] = {}
        for i, s in self.stand_ins.items():
            inputs[i], flat, where = s.numerical_values()
            values[i] = (flat, where)
        return ValueDifferences(diffs.ev, func, tuple(inputs), diffs.eps, values)

    def random_vector(self, t: torch.Tensor, generator: torch.Generator, downcast_complex: bool) -> torch.Tensor | None:
        """fast mode's direction for a stand-in (torch's, for its layout), or None for other tensors."""
        s = self._by_id.get(id(t))
        return None if s is None else s.random_vector(generator, downcast_complex)

    def numerical_positions(self, t: torch.Tensor) -> list[int] | None:
        """The dense positions whose values the numerical Jacobian perturbs (None: all of them)."""
        s = self._by_id.get(id(t))
        if s is None or s.pattern is None:
            return None
        return s.numerical_positions

    def hint(self, t: torch.Tensor, mismatch: JacobianMismatch) -> str | None:
        """What a mismatch of a stand-in's entries says about the layout's semantics."""
        s = self._by_id.get(id(t))
        if s is None or s.specified is None or not mismatch.worst:
            return None
        where = [s.specified[_flat(e.input_index, t.shape)] for e in mismatch.worst]
        layout = str(s.original.layout).replace("torch.", "")
        if not any(where) and all(e.analytical == 0 for e in mismatch.worst) and not s.masked:
            return (
                f"{mismatch.input_name} is a {layout} tensor checked with masked=False, where its unspecified "
                "positions count too; the entries above are all unspecified, and backward returns zero there "
                "(a gradient masked to the input's pattern). If those are the op's semantics, check it with "
                "masked=True."
            )
        if not any(where) and s.masked:
            return (
                f"{mismatch.input_name} is a {layout} tensor checked with masked=True: the entries above are "
                "at unspecified positions, where the numerical gradient is zero, but backward returns values "
                "there. If the op's gradient is meant to be dense, check it with masked=False."
            )
        return (
            f"{mismatch.input_name} is a {layout} tensor; entries are indexed by dense position, "
            f"{sum(where)} of the {len(where)} above are specified elements."
        )

    def refuse_forward_ad(self, inputs: Sequence[Any]) -> None:
        """Raise what torch raises for these inputs (the call's, as given) in a forward-mode AD check:
        torch first takes the imaginary part of every complex input (which a sparse compressed
        tensor refuses), then makes the inputs that require grad dual."""
        for a in inputs:
            if is_float_or_complex(a) and a.is_complex():
                a.imag  # noqa: B018 - evaluated for what it raises
        for s in self.stand_ins.values():
            if s.original.layout == MKLDNN:
                raise ValueError(torch_words.mkldnn_forward_ad())
            with fwAD.dual_level():  # torch's own refusal: make_dual does not take these layouts
                make_dual(s.original.detach(), torch.zeros_like(s.original))
        raise NotImplementedError(
            f"Forward-mode AD with {next(iter(self.stand_ins.values())).original.layout} inputs is not "
            "supported by this check."
        )
