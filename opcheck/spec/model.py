"""The OpSpec model: what a validated op spec says, frozen, every part knowing its file:line.

This is the contract between the stages: `opcheck.spec` builds it from YAML, `opcheck.codegen`
renders it as Python source (constructor calls of these classes, defaults omitted) into the
generated modules, and `opcheck.runtime` executes it. Field defaults here are the spec format's
defaults. Nothing in this module imports torch (a rule's torch condition reads the installed
version when a test is matched against it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from opcheck.spec import torch_condition

_N = TypeVar("_N", bound="NameEnum")


class NameEnum(str, Enum):
    """A member of one of the spec format's fixed sets of names: a `str` equal to its value.

    str(), format() and f-strings give the value on every Python (3.12 changed format() of
    mixed-in enums), so ids and messages built from a member read as the plain name. The model's
    fields and the tuples below hold plain strings, the form that reaches YAML and generated code.
    """

    _value_: str

    def __str__(self) -> str:
        return self._value_

    def __format__(self, format_spec: str) -> str:
        return format(self._value_, format_spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The plain names, in declaration order."""
        return tuple(member._value_ for member in cls)

    @classmethod
    def parse(cls: type[_N], text: str) -> _N:
        """The member named `text`; ValueError naming the set and its members for anything else."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown {cls.__name__} {text!r}; expected one of {', '.join(cls.values())}") from None


@dataclass(frozen=True)
class CheckFacts:
    """What is true of a check kind wherever it is run, counted or reported."""

    description: str  # the pytest marker's description (`pytest --markers`, pyproject's `markers`)
    path: str  # what the check compares, in a failure's `check path:` and a timeout's words
    second_order: bool = False  # checks (inputs, grad_outputs) -> input gradients, a double backward
    forward_ad: bool = False  # runs forward-mode AD itself (and so loads torch's forward-AD decompositions)
    declared: bool = False  # the spec declares this derivative unsupported; the check wants it absent


class Check(NameEnum):
    """Check kinds: one generated test function each, and a pytest marker of the same name; each
    member carries its CheckFacts (`Check.GRADCHECK.path`, `.description`, ...)."""

    facts: CheckFacts

    def __new__(cls, value: str, facts: CheckFacts) -> Check:
        member = str.__new__(cls, value)
        member._value_ = value
        member.facts = facts
        return member

    @property
    def description(self) -> str:
        return self.facts.description

    @property
    def path(self) -> str:
        return self.facts.path

    @property
    def second_order(self) -> bool:
        return self.facts.second_order

    @property
    def forward_ad(self) -> bool:
        return self.facts.forward_ad

    @property
    def declared(self) -> bool:
        return self.facts.declared

    GRADCHECK = (
        "gradcheck",
        CheckFacts("opcheck: reverse-mode first derivative (VJP) against finite differences", path="VJP"),
    )
    FORWARD_AD = (
        "forward_ad",
        CheckFacts(
            "opcheck: forward-mode first derivative (JVP) against finite differences", path="JVP", forward_ad=True
        ),
    )
    GRADGRADCHECK = (
        "gradgradcheck",
        CheckFacts(
            "opcheck: second derivative, reverse over reverse (VJP of VJP)", path="VJP of VJP", second_order=True
        ),
    )
    FWGRAD_BWGRAD = (
        "fwgrad_bwgrad",
        CheckFacts(
            "opcheck: second derivative, forward over reverse (JVP of VJP)",
            path="JVP of VJP",
            second_order=True,
            forward_ad=True,
        ),
    )
    LOWPREC = (
        "lowprec",
        CheckFacts(
            "opcheck: float32/float16/bfloat16/complex64 outputs, VJP and JVP against the float64 run",
            path="outputs, VJP and JVP against the float64 reference",
            forward_ad=True,
        ),
    )
    GRADGRAD_UNSUPPORTED = (
        "gradgrad_unsupported",
        CheckFacts(
            "opcheck: the spec declares supports_gradgrad: false; the second derivative must raise or fail",
            path="VJP of VJP",
            second_order=True,
            declared=True,
        ),
    )
    FORWARD_AD_UNSUPPORTED = (
        "forward_ad_unsupported",
        CheckFacts(
            "opcheck: the spec declares supports_forward_ad: false; forward AD must raise, give no tangent, or fail",
            path="JVP",
            forward_ad=True,
            declared=True,
        ),
    )
    LIBRARY_OPCHECK = (
        "library_opcheck",
        CheckFacts(
            "opcheck: torch.library.opcheck registration checks for torch.ops.* operators", path="torch.library.opcheck"
        ),
    )
    COMPILE = (
        "compile",
        CheckFacts(
            "opcheck: outputs and gradients under torch.compile against eager",
            path="outputs and gradients under torch.compile against eager",
        ),
    )


class FastMode(NameEnum):
    """The spellings of `gradcheck.fast_mode` (YAML's `true`/`false` read as these strings)."""

    AUTO = "auto"  # the full Jacobian while it is small, entrywise projections beyond (engine "auto")
    TRUE = "true"  # torch's fast mode: one random projection per (input, output) pair
    FALSE = "false"  # the full Jacobian


class Device(NameEnum):
    """Device types a spec may name."""

    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"
    XPU = "xpu"


class Dtype(NameEnum):
    """Tensor dtypes a spec may name: torch's names without the `torch.` prefix."""

    FLOAT64 = "float64"
    COMPLEX128 = "complex128"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    COMPLEX64 = "complex64"
    INT64 = "int64"
    INT32 = "int32"
    INT16 = "int16"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOL = "bool"


class LowprecPart(NameEnum):
    """What the low-precision check compares with the float64 run (`lowprec_parts:` rules)."""

    OUTPUT = "output"  # every output of the op
    VJP = "vjp"  # the gradient of every differentiable input, for one random cotangent
    JVP = "jvp"  # the tangent of every output, for one random tangent (with check_forward_ad only)

    @property
    def label(self) -> str:
        """The name in reports: output, VJP, JVP."""
        return self._value_ if self is LowprecPart.OUTPUT else self._value_.upper()


class CompileBackend(NameEnum):
    """The torch.compile backends the compile check runs (`compile.backends`)."""

    AOT_EAGER = "aot_eager"  # dynamo and AOTAutograd, eager kernels: held to eager up to rounding order
    INDUCTOR = "inductor"  # generated kernels (a C++ compiler on CPU): the low-precision criterion below float64


class CompileCase(NameEnum):
    """What the compile check tries beyond the sample as written (each on unless `compile.cases_off`)."""

    ALIASED = "aliased"  # the same tensor for two inputs of the same shape and dtype
    NONCONTIGUOUS = "noncontiguous"  # every tensor a strided view, values unchanged
    WRITTEN = "written"  # the inputs the op writes into, compared with eager's
    DYNAMIC = "dynamic"  # dynamic shapes: the sample, then another sample of another size, one compiled function
    PARTIAL_GRAD = "partial_grad"  # only the first of several inputs requires grad
    BACKWARD_STATE = "backward_state"  # Python numbers the backward reads, changed after the forward

    @property
    def words(self) -> str:
        return _CASE_WORDS[self._value_]


_CASE_WORDS = {
    "aliased": "the same tensor for two inputs",
    "noncontiguous": "non-contiguous views of the inputs",
    "written": "the inputs the op writes into",
    "dynamic": "dynamic shapes",
    "partial_grad": "requires_grad on the first input only",
    "backward_state": "Python numbers the backward reads, changed between forward and backward",
}


class LowprecCriterion(NameEnum):
    """How the low-precision check judges each entry's error (a `tolerances:` rule's `criterion`;
    FORMAT.md, "The low-precision criterion")."""

    BASELINE = "baseline"
    TABLE = "table"


# The members under the names code imported before the enums.
GRADCHECK = Check.GRADCHECK
FORWARD_AD = Check.FORWARD_AD
GRADGRADCHECK = Check.GRADGRADCHECK
FWGRAD_BWGRAD = Check.FWGRAD_BWGRAD
LOWPREC = Check.LOWPREC
GRADGRAD_UNSUPPORTED = Check.GRADGRAD_UNSUPPORTED
FORWARD_AD_UNSUPPORTED = Check.FORWARD_AD_UNSUPPORTED
LIBRARY_OPCHECK = Check.LIBRARY_OPCHECK
COMPILE = Check.COMPILE


def _values(*members: NameEnum) -> tuple[str, ...]:
    return tuple(member.value for member in members)


CHECKS = Check.values()
FAST_MODES = FastMode.values()
GRAD_DTYPES = _values(Dtype.FLOAT64, Dtype.COMPLEX128)
"""The gradient checks' dtypes (`dtypes:`): finite differences need double precision."""
LOWPREC_DTYPES = _values(Dtype.FLOAT32, Dtype.FLOAT16, Dtype.BFLOAT16, Dtype.COMPLEX64)
"""The low-precision check's dtypes (`lowprec_dtypes:`)."""
LOWPREC_PARTS = LowprecPart.values()
"""The parts of the low-precision check, in the order it compares them; all by default."""
COMPILE_BACKENDS = CompileBackend.values()
COMPILE_CASES = CompileCase.values()
LOWPREC_CRITERIA = LowprecCriterion.values()
"""The low-precision check's criteria (a `tolerances:` rule's `criterion`)."""
INDEX_DTYPES = _values(Dtype.INT64, Dtype.INT32, Dtype.INT16, Dtype.INT8, Dtype.UINT8, Dtype.BOOL)
"""Integer and bool dtypes: never differentiable, for index and mask arguments."""
TENSOR_DTYPES = Dtype.values()
KNOWN_DEVICES = Device.values()
"""Devices a spec may name; `devices` defaults to all of them (unavailable ones are skipped)."""

# Limits on a sample tensor, so that a spec that validates can run. Batched gradient checks vmap
# over one more dim, and vmap takes at most 64 (torch 2.13 fails an internal assert past that);
# 2**24 elements is 128 MiB of float64, far more than a gradient check covers in a test.
MAX_TENSOR_RANK = 63
MAX_TENSOR_ELEMENTS = 2**24  # and so also the most one dim may have, even in an empty tensor
INDEX_DTYPE_RANGES = {
    "int64": (-(2**63), 2**63 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
}

MATRIX_MAKERS = ("positive", "symmetric", "spd", "lower_triangular", "upper_triangular", "unit_norm", "orthogonal")
STRUCTURE_MAKERS = ("mask", "dominant", "integer", "constant")
"""The makers of what a run's values looked like (what `opcheck capture` records)."""
MAKERS = MATRIX_MAKERS + STRUCTURE_MAKERS
"""Structured tensor makers; see opcheck.runtime.makers for what each produces."""
MAX_STORAGE_ELEMENTS = 2**26
"""The most elements a tensor's memory may span with `strides` (its gaps included)."""

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


Values = bool | int | float | tuple[Any, ...]
"""A tensor's `values:` a number (zero-dim), or nested tuples of numbers."""


def expanded_dims(shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int] | None) -> tuple[int, ...]:
    """The dims `strides` expands (stride 0, size above 1)."""
    if strides is None:
        return ()
    return tuple(d for d, (n, st) in enumerate(zip(shape, strides)) if st == 0 and n > 1)


def draw_shape(shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int] | None) -> tuple[int, ...]:
    """The shape whose values a sample maker draws: `shape`, each expanded dim of size 1 (it repeats
    the values at index 0); a mask's rows are counted at this shape."""
    dims = expanded_dims(shape, strides)
    return tuple(1 if d in dims else n for d, n in enumerate(shape))


@dataclass(frozen=True)
class TensorArg:
    """A tensor to build for a sample.

    dtype None means the test's dtype (float64/complex128 for the gradient checks, the
    low-precision dtype for lowprec, or `lowprec_dtype` there when given). requires_grad None
    means: True for floating/complex dtypes.
    Values are uniform in [low, high) (defaults -2, 2; for integer dtypes 0, 10) unless `values`
    gives them, `values_file` loads them, or `maker` structures them (the structure makers `mask`,
    `dominant`, `integer` and `constant` reproduce what a run's values looked like); `avoid` keeps
    every value at least `margin` away from the listed points (kinks, poles).

    `values_file` is a file torch.save wrote, as a path relative to the project root (posix,
    normalized; the spec writes it relative to its own folder), holding this tensor or a dict of
    tensors of which `values_key` names this one. Its shape is `shape`; its dtype is `dtype`, or,
    without one, floating-point or complex, cast to the test's dtype when the test runs.

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
    values: Values | None = None  # shape must match
    values_file: str | None = None  # relative to the project root; opcheck.spec.values_file
    values_key: str | None = None  # the entry of a values_file that holds a dict of tensors
    layout: str = STRIDED  # one of LAYOUTS
    density: float | None = None  # fraction of the sparse grid specified; DEFAULT_DENSITY if nnz is None
    nnz: int | None = None  # specified elements (blocks for bsr/bsc), per batch for compressed layouts
    blocksize: tuple[int, int] | None = None  # bsr/bsc only
    dense_dim: int = 0  # trailing dense dims of a hybrid sparse tensor
    # The dtype in low-precision tests (float32 gates or states beside bfloat16 activations); the
    # gradient checks and the float64 reference take the test's dtype as usual. Only without `dtype`.
    lowprec_dtype: str | None = None
    # The layout as the run had it: torch's strides, one per dim (a transpose, a permutation, a
    # slice step, a stride-0 expanded dim, channels-last). Gaps between the elements hold NaN.
    strides: tuple[int, ...] | None = None
    # maker "mask": the share of entries on, rows (along the last dim) all off and all on, and the
    # values off and on (default 0 and 1; an additive mask is (-inf, 0)).
    share_on: float | None = None
    rows_off: int = 0
    rows_on: int = 0
    mask_values: tuple[float, float] | None = None
    fill: float | None = None  # maker "constant": every entry
    gap: float | None = None  # maker "dominant": by how much each row's largest entry exceeds the rest

    @property
    def is_sparse(self) -> bool:
        return self.layout != STRIDED

    @property
    def expanded_dims(self) -> tuple[int, ...]:
        return expanded_dims(self.shape, self.strides)

    @property
    def draw_shape(self) -> tuple[int, ...]:
        return draw_shape(self.shape, self.strides)

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
    def of(
        cls, shape: tuple[int, ...], layout: str, blocksize: tuple[int, int] | None, dense_dim: int
    ) -> SparseGeometry:
        rank = len(shape)
        n_sparse = rank - dense_dim if layout == COO else 2
        start = rank - dense_dim - n_sparse
        block = tuple(blocksize) if layout in BLOCK_LAYOUTS and blocksize else (1,) * n_sparse
        return cls(
            tuple(shape[:start]), tuple(shape[start : rank - dense_dim]), tuple(shape[rank - dense_dim :]), block
        )

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

    items: tuple[Any, ...]


# A YAML list of literals is stored as a plain tuple (hashable); the runtime passes it as a list.
Arg = TensorArg | TensorListArg | DtypeArg | TupleArg | None | bool | int | float | str | tuple[Any, ...] | list[Any]


@dataclass(frozen=True)
class Sample:
    """One sample input. Exactly one of: args/kwargs, `generator`, `opinfo`.

    generator: "pkg.module:function" called as function(device, dtype, generator) and returning
    (args, kwargs) or args; opinfo: an OpInfo name (optionally "name:variant") whose
    sample_inputs are all run.
    """

    name: str
    args: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()
    generator: str | None = None
    opinfo: str | None = None
    location: Location = field(default=Location(""), compare=False)


@dataclass(frozen=True)
class GradcheckFlags:
    """The `gradcheck:` block. None for a tolerance means: the per-dtype table's value."""

    fast_mode: str = FastMode.AUTO.value  # one of FAST_MODES; torch's default is the full check (false)
    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    nondet_tol: float = 0.0
    check_batched_grad: bool = True  # torch's default is False: vmap over backward is checked unless said
    check_forward_ad: bool = False  # whether a forward_ad test is generated
    check_batched_forward_grad: bool = False
    check_undefined_grad: bool = True
    check_grad_dtypes: bool = True  # torch's default is False
    # torch's `masked`: if true, the gradients of unspecified elements of sparse inputs are ignored
    # (the gradient must be right at specified elements and is compared with zero elsewhere).
    masked: bool = False


@dataclass(frozen=True)
class GradgradcheckFlags:
    """The `gradgradcheck:` block; eps/atol/rtol/nondet_tol/fast_mode come from `gradcheck:`."""

    enabled: bool = True  # false: no second-derivative tests
    check_batched_grad: bool = False
    check_fwd_over_rev: bool = False  # whether a fwgrad_bwgrad test is generated
    gen_non_contig_grad_outputs: bool = False


@dataclass(frozen=True)
class CompileFlags:
    """The `compile:` block: the op under torch.compile against eager (opcheck.runtime.compiled).

    `compile: true` is this block with its defaults; without the key, the project's `[tool.opcheck]
    compile` decides (off by default).
    """

    enabled: bool = True
    backends: tuple[str, ...] = (CompileBackend.AOT_EAGER.value,)  # of COMPILE_BACKENDS
    dtypes: tuple[str, ...] = ()  # empty: the spec's dtypes, then its lowprec_dtypes
    fullgraph: bool = False  # a graph break fails the test
    cases_off: tuple[tuple[str, str], ...] = ()  # (case, reason): the cases not tried, and why


@dataclass(frozen=True)
class ReducedPrecision:
    """The `reduced_precision:` block: torch switches set while the spec's low-precision tests
    run, and restored after. Off by default: the strict setting."""

    # torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    tf32: bool = False
    # torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction and
    # allow_bf16_reduced_precision_reduction
    reduced_precision_reduction: bool = False


@dataclass(frozen=True)
class Where:
    """Which tests a rule applies to: every listed field must match (an empty tuple matches all),
    and the installed torch must meet `torch`, a version condition such as "<2.14" (None: any torch;
    opcheck.spec.torch_condition)."""

    device: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    check: tuple[str, ...] = ()
    sample: tuple[str, ...] = ()
    torch: str | None = None

    def matches(self, *, device: str, dtype: str, check: str, sample: str) -> bool:
        """Whether the rule applies to this test on the installed torch (imports torch when the
        rule has a torch condition)."""
        return self.matches_case(device=device, dtype=dtype, check=check, sample=sample) and self.matches_torch()

    def matches_torch(self) -> bool:
        """Whether the installed torch meets the rule's torch condition (True without one)."""
        return self.torch is None or torch_condition.installed_satisfies(self.torch)

    def matches_case(self, *, device: str, dtype: str, check: str, sample: str) -> bool:
        """Whether the rule names this test, whatever torch is installed: what code generation can
        know (a generated module evaluates the torch condition when it is collected)."""
        return all(
            not allowed or value in allowed
            for allowed, value in (
                (self.device, device),
                (self.dtype, dtype),
                (self.check, check),
                (self.sample, sample),
            )
        )

    @property
    def specificity(self) -> int:
        return sum(1 for allowed in (self.device, self.dtype, self.check, self.sample) if allowed) + (
            self.torch is not None
        )


@dataclass(frozen=True)
class ToleranceRule:
    """Tolerances for the tests a rule matches. None leaves a value to the layers below.

    criterion, factor and floor concern the low-precision check only: a rule that sets them
    without `where.check` still applies its eps/atol/rtol/nondet_tol to every matching test.
    """

    where: Where = Where()
    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    nondet_tol: float | None = None
    criterion: str | None = None  # one of LOWPREC_CRITERIA
    factor: float | None = None  # > 0
    floor: float | None = None  # >= 0
    reason: str | None = None
    location: Location = field(default=Location(""), compare=False)


@dataclass(frozen=True)
class LowprecPartsRule:
    """Which parts the low-precision check compares in the tests it matches (check is always lowprec).

    Matching rules are resolved like tolerance rules: less specific before more specific, then in
    file order; the last one decides. With none, every part is compared.
    """

    where: Where = Where()
    parts: tuple[str, ...] = LOWPREC_PARTS  # non-empty, of LOWPREC_PARTS
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
    # Top-level (or dotted) modules the op needs that may not be installed (`triton`): where one
    # is missing, validation does not import the op and every test skips (opcheck.spec.requires).
    requires: tuple[str, ...] = ()
    # Modules imported, in order, before the op and the reference are resolved: those whose code
    # registers a `torch.ops.*` operator the op path names (torch.library, TORCH_LIBRARY).
    imports: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("float64",)
    lowprec_dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = KNOWN_DEVICES
    gradcheck: GradcheckFlags = GradcheckFlags()
    gradgradcheck: GradgradcheckFlags = GradgradcheckFlags()
    supports_forward_ad: bool = True
    supports_gradgrad: bool = True
    library_opcheck: bool = False  # also run torch.library.opcheck (torch.ops.* ops and custom ops)
    compile: CompileFlags | None = None  # None: not in the spec (the project's setting decides)
    # A float64-capable implementation of the same math: the low-precision check's reference for
    # kernels that have no float64 path (then `dtypes` may be empty).
    reference: str | None = None
    # Fresh copies of the sample's tensors for every call of the op and of its reference: for
    # kernels that write into their inputs (past autograd's version counter).
    clone_inputs: bool = False
    # The op's backward writes into its grad_output (or its forward-AD rule into its tangent) on
    # purpose: the low-precision check reports the write instead of failing on it.
    writes_grad_outputs: bool = False
    reduced_precision: ReducedPrecision = ReducedPrecision()
    tolerances: tuple[ToleranceRule, ...] = ()
    lowprec_parts: tuple[LowprecPartsRule, ...] = ()
    skips: tuple[Rule, ...] = ()
    expected_failures: tuple[Rule, ...] = ()
    location: Location = field(default=Location(""), compare=False)  # of the `op:` key

    def checks(self) -> tuple[str, ...]:
        """The check kinds this spec generates tests for, in a fixed order (plain names, as in its module)."""
        out: list[Check] = []
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
        if self.compile is not None and self.compile.enabled:
            out.append(COMPILE)
        return tuple(check.value for check in out)

    def dtypes_for(self, check: str) -> tuple[str, ...]:
        if check == LOWPREC:
            return self.lowprec_dtypes
        if check == LIBRARY_OPCHECK:  # registration checks need a dtype the kernel has
            return self.dtypes or self.lowprec_dtypes[:1]
        if check == COMPILE:
            if self.compile is not None and self.compile.dtypes:
                return self.compile.dtypes
            return self.dtypes + self.lowprec_dtypes
        return self.dtypes

    def sample(self, name: str) -> Sample:
        for s in self.samples:
            if s.name == name:
                return s
        raise KeyError(f"{self.source}: no sample named {name!r}")
