"""The OpSpec model: what a validated op spec says, frozen, every part knowing its file:line.

This is the contract between the stages: `opcheck.spec` builds it from YAML, `opcheck.codegen`
renders it as Python source (constructor calls of these classes, defaults omitted) into the
generated modules, and `opcheck.runtime` executes it. Field defaults here are the spec format's
defaults. Nothing in this module imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

# Check kinds: one generated test function each, and a pytest marker of the same name.
GRADCHECK = "gradcheck"  # reverse mode, first derivative
FORWARD_AD = "forward_ad"  # forward mode, first derivative
GRADGRADCHECK = "gradgradcheck"  # reverse over reverse
FWGRAD_BWGRAD = "fwgrad_bwgrad"  # forward over reverse
LOWPREC = "lowprec"  # low-precision result and VJP against the float64/complex128 run
GRADGRAD_UNSUPPORTED = "gradgrad_unsupported"  # declared: the second derivative must raise
FORWARD_AD_UNSUPPORTED = "forward_ad_unsupported"  # declared: forward AD must raise
LIBRARY_OPCHECK = "library_opcheck"  # torch.library.opcheck's registration checks

CHECKS = (GRADCHECK, FORWARD_AD, GRADGRADCHECK, FWGRAD_BWGRAD, LOWPREC, GRADGRAD_UNSUPPORTED,
          FORWARD_AD_UNSUPPORTED, LIBRARY_OPCHECK)

GRAD_DTYPES = ("float64", "complex128")
LOWPREC_DTYPES = ("float32", "float16", "bfloat16", "complex64")
INDEX_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
TENSOR_DTYPES = GRAD_DTYPES + LOWPREC_DTYPES + INDEX_DTYPES
KNOWN_DEVICES = ("cpu", "cuda", "mps", "xpu")
"""Devices a spec may name; `devices` defaults to all of them (unavailable ones are skipped)."""

# Limits on a sample tensor, so that a spec that validates can run. Batched gradient checks vmap
# over one more dim, and vmap takes at most 64 (torch 2.13 fails an internal assert past that);
# 2**24 elements is 128 MiB of float64, far more than a gradient check covers in a test.
MAX_TENSOR_RANK = 63
MAX_TENSOR_ELEMENTS = 2**24  # and so also the most one dim may have, even in an empty tensor
INDEX_DTYPE_RANGES = {"int64": (-2**63, 2**63 - 1), "int32": (-2**31, 2**31 - 1), "int16": (-2**15, 2**15 - 1),
                      "int8": (-2**7, 2**7 - 1), "uint8": (0, 2**8 - 1)}

MAKERS = ("positive", "symmetric", "spd", "lower_triangular", "upper_triangular", "unit_norm",
          "orthogonal")
"""Structured tensor makers; see opcheck.runtime.samples for what each produces."""

STRIDED = "strided"
COO = "sparse_coo"
COMPRESSED_LAYOUTS = ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
BLOCK_LAYOUTS = ("sparse_bsr", "sparse_bsc")
LAYOUTS = (STRIDED, COO) + COMPRESSED_LAYOUTS
"""Tensor layouts a spec may name: torch's names without the `torch.` prefix."""
DEFAULT_DENSITY = 0.5
SPARSE_MAKERS = (None, "positive")
"""Makers whose values stay what they are on any subset of positions (the others structure a
matrix, which dropping elements would break)."""


@dataclass(frozen=True)
class Location:
    """Where something was written: a spec path relative to the project, 1-based line and column."""

    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}" if self.line else self.file


@dataclass(frozen=True)
class TensorArg:
    """A tensor to build for a sample.

    dtype None means the test's dtype (float64/complex128 for the gradient checks, the
    low-precision dtype for lowprec). requires_grad None means: True for floating/complex dtypes.
    Values are uniform in [low, high) (defaults -2, 2; for integer dtypes 0, 10) unless `values`
    gives them, or `maker` structures them; `avoid` keeps every value at least `margin` away
    from the listed points (kinks, poles).

    A sparse `layout` keeps the values at some positions of its sparse grid (`density` of them,
    or `nnz`) and leaves the rest unspecified; see SparseGeometry for the grid.
    """

    shape: tuple[int, ...]
    dtype: str | None = None
    low: float | None = None
    high: float | None = None
    requires_grad: bool | None = None
    noncontiguous: bool = False
    maker: str | None = None
    avoid: tuple[float, ...] = ()
    margin: float = 0.1
    values: tuple | None = None  # nested tuples of numbers, shape must match
    layout: str = STRIDED  # one of LAYOUTS
    density: float | None = None  # fraction of the sparse grid specified; DEFAULT_DENSITY if nnz is None
    nnz: int | None = None  # specified elements (blocks for bsr/bsc), per batch for compressed layouts
    blocksize: tuple[int, int] | None = None  # bsr/bsc only
    dense_dim: int = 0  # trailing dense dims of a hybrid sparse tensor

    @property
    def is_sparse(self) -> bool:
        return self.layout != STRIDED

    def geometry(self) -> SparseGeometry:
        return SparseGeometry.of(self.shape, self.layout, self.blocksize, self.dense_dim)

    def specified_count(self) -> int:
        """How many grid cells each batch specifies when `values` do not say."""
        if self.nnz is not None:
            return self.nnz
        cells = self.geometry().cells
        if cells == 0:
            return 0
        density = self.density if self.density is not None else DEFAULT_DENSITY
        return max(1, min(cells, math.floor(density * cells + 0.5)))


@dataclass(frozen=True)
class SparseGeometry:
    """How a sparse layout splits a shape: batch dims, the sparse grid (in blocks), dense dims.

    COO: every dim before the `dense_dim` trailing ones is sparse, and there are no batch dims.
    Compressed (csr/csc/bsr/bsc): the two dims before the dense ones are sparse; any in front of
    them are batch dims, each batch specifying the same number of cells. A cell is one element, or
    one `blocksize` block for bsr/bsc.
    """

    batch_shape: tuple[int, ...]
    sparse_shape: tuple[int, ...]  # in elements
    dense_shape: tuple[int, ...]
    block: tuple[int, ...]  # per sparse dim: 1, or the blocksize

    @classmethod
    def of(cls, shape: tuple[int, ...], layout: str, blocksize: tuple[int, int] | None,
           dense_dim: int) -> SparseGeometry:
        rank = len(shape)
        n_sparse = rank - dense_dim if layout == COO else 2
        start = rank - dense_dim - n_sparse
        block = tuple(blocksize) if layout in BLOCK_LAYOUTS and blocksize else (1,) * n_sparse
        return cls(tuple(shape[:start]), tuple(shape[start:rank - dense_dim]), tuple(shape[rank - dense_dim:]), block)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """The sparse dims counted in cells (blocks for bsr/bsc)."""
        return tuple(size // b for size, b in zip(self.sparse_shape, self.block))

    @property
    def cells(self) -> int:
        """Cells of one batch's sparse grid: the most a batch can specify."""
        return math.prod(self.grid_shape)

    @property
    def batches(self) -> int:
        return math.prod(self.batch_shape)


@dataclass(frozen=True)
class TensorListArg:
    """A list of tensors (torch.cat, torch.stack, ...)."""

    items: tuple[TensorArg, ...]


@dataclass(frozen=True)
class DtypeArg:
    """A torch.dtype passed as an argument (e.g. kwargs dtype=torch.float64)."""

    name: str


@dataclass(frozen=True)
class TupleArg:
    """A Python tuple (YAML lists become Python lists; `{tuple: [...]}` makes a tuple)."""

    items: tuple


Literal = Union[None, bool, int, float, str, list, "TupleArg", "DtypeArg"]
# A YAML list of literals is stored as a plain tuple (hashable); the runtime passes it as a list.
Arg = Union[TensorArg, TensorListArg, DtypeArg, TupleArg, None, bool, int, float, str, list]


@dataclass(frozen=True)
class Sample:
    """One sample input. Exactly one of: args/kwargs, `generator`, `opinfo`.

    generator: "pkg.module:function" called as function(device, dtype, generator) and returning
    (args, kwargs) or args; opinfo: an OpInfo name (optionally "name:variant") whose
    sample_inputs are all run.
    """

    name: str
    args: tuple = ()
    kwargs: tuple[tuple[str, object], ...] = ()
    generator: str | None = None
    opinfo: str | None = None
    location: Location = field(default=Location(""), compare=False)


@dataclass(frozen=True)
class GradcheckFlags:
    """The `gradcheck:` block. None for a tolerance means: the per-dtype table's value."""

    fast_mode: str = "auto"  # "auto" | "true" | "false"
    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    nondet_tol: float = 0.0
    check_batched_grad: bool = True
    check_forward_ad: bool = False
    check_batched_forward_grad: bool = False
    check_undefined_grad: bool = True
    check_grad_dtypes: bool = True
    # torch's `masked`: if true, the gradients of unspecified elements of sparse inputs are ignored
    # (the gradient must be right at specified elements and is compared with zero elsewhere).
    masked: bool = False


@dataclass(frozen=True)
class GradgradcheckFlags:
    """The `gradgradcheck:` block; eps/atol/rtol/nondet_tol/fast_mode come from `gradcheck:`."""

    enabled: bool = True
    check_batched_grad: bool = False
    check_fwd_over_rev: bool = False
    gen_non_contig_grad_outputs: bool = False


@dataclass(frozen=True)
class Where:
    """Which tests a rule applies to: every listed field must match (an empty tuple matches all)."""

    device: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    check: tuple[str, ...] = ()
    sample: tuple[str, ...] = ()

    def matches(self, *, device: str, dtype: str, check: str, sample: str) -> bool:
        return all(not allowed or value in allowed for allowed, value in (
            (self.device, device), (self.dtype, dtype), (self.check, check), (self.sample, sample)))

    @property
    def specificity(self) -> int:
        return sum(1 for allowed in (self.device, self.dtype, self.check, self.sample) if allowed)


@dataclass(frozen=True)
class ToleranceRule:
    where: Where = Where()
    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    nondet_tol: float | None = None
    reason: str | None = None
    location: Location = field(default=Location(""), compare=False)


@dataclass(frozen=True)
class Rule:
    """A skip or an expected failure (strict: an unexpected pass fails)."""

    where: Where = Where()
    reason: str = ""
    location: Location = field(default=Location(""), compare=False)


@dataclass(frozen=True)
class OpSpec:
    """One operator's gradient tests."""

    name: str  # display name and module name: generated_tests/test_<name>.py
    op: str  # "torch.sin", "torch.Tensor.addmm", "torch.ops.aten.mul.Tensor", "examples.ops:Square.apply"
    source: str  # the spec file, relative to the project root
    sha256: str  # of the spec file's bytes
    samples: tuple[Sample, ...]
    variant: str = "function"  # "function" | "method" (called as args[0].<attr>(*args[1:]))
    dtypes: tuple[str, ...] = ("float64",)
    lowprec_dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = KNOWN_DEVICES
    gradcheck: GradcheckFlags = GradcheckFlags()
    gradgradcheck: GradgradcheckFlags = GradgradcheckFlags()
    supports_forward_ad: bool = True
    supports_gradgrad: bool = True
    library_opcheck: bool = False  # also run torch.library.opcheck (torch.ops.* ops and custom ops)
    # A float64-capable implementation of the same math: the low-precision check's reference for
    # kernels that have no float64 path (then `dtypes` may be empty).
    reference: str | None = None
    tolerances: tuple[ToleranceRule, ...] = ()
    skips: tuple[Rule, ...] = ()
    expected_failures: tuple[Rule, ...] = ()
    location: Location = field(default=Location(""), compare=False)  # of the `op:` key

    def checks(self) -> tuple[str, ...]:
        """The check kinds this spec generates tests for, in a fixed order."""
        out = []
        if self.dtypes:  # a float32-only kernel has no gradient-check dtype
            out.append(GRADCHECK)
            if self.gradcheck.check_forward_ad and self.supports_forward_ad:
                out.append(FORWARD_AD)
            if not self.supports_forward_ad:
                out.append(FORWARD_AD_UNSUPPORTED)
            if self.gradgradcheck.enabled and self.supports_gradgrad:
                out.append(GRADGRADCHECK)
                if self.gradgradcheck.check_fwd_over_rev and self.supports_forward_ad:
                    out.append(FWGRAD_BWGRAD)
            if not self.supports_gradgrad:
                out.append(GRADGRAD_UNSUPPORTED)
        if self.lowprec_dtypes:
            out.append(LOWPREC)
        if self.library_opcheck:
            out.append(LIBRARY_OPCHECK)
        return tuple(out)

    def dtypes_for(self, check: str) -> tuple[str, ...]:
        if check == LOWPREC:
            return self.lowprec_dtypes
        if check == LIBRARY_OPCHECK:  # registration checks need a dtype the kernel has
            return self.dtypes or self.lowprec_dtypes[:1]
        return self.dtypes

    def sample(self, name: str) -> Sample:
        for s in self.samples:
            if s.name == name:
                return s
        raise KeyError(f"{self.source}: no sample named {name!r}")
