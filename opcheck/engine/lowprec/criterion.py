"""What the low-precision check reports and judges by: its criteria, defaults, and results."""

from __future__ import annotations

import math
from dataclasses import field

import torch

from opcheck._records import record
from opcheck.engine.lowprec.numbers import _compute_dtype, _name
from opcheck.failure_facts import FailureFacts

OUTPUT, VJP, JVP = "output", "VJP", "JVP"
PARTS = (OUTPUT, VJP, JVP)
BASELINE, TABLE = "baseline", "table"
CRITERIA = (BASELINE, TABLE)

DEFAULT_FACTOR = 2.0
DEFAULT_PERTURBATIONS = 4
LOWPREC_FLOORS: dict[torch.dtype, float] = {
    # 16-bit kernels compute in float32 and round once. The catalog's torch kernels need at most
    # 0.24; the corpus's subtlest 16-bit mutant (a tail block stored through bfloat16) 1.05.
    torch.float16: 0.5,
    torch.bfloat16: 0.5,
    # A float32 kernel has no wider type inside: the catalog's kernels need up to 59 (a Triton
    # cross-entropy at p -> 1; torch's bicubic interpolate 11), the corpus's correct float32
    # kernels up to 151, its float32 mutants 2.4e3 and more.
    torch.float32: 256.0,
    torch.complex64: 256.0,
}
"""Default `floor`: roundings of a part's largest entry that any entry may carry, per dtype
(benchmarks/bench_lowprec.py prints the floor each catalog test, twin and mutant needs)."""

TABLE_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-4),
    torch.complex64: (1e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
"""(atol, rtol) of the "table" criterion per dtype."""

WORST = 5


class LowPrecisionError(AssertionError):
    """The low-precision run disagrees with the float64 reference, or the op wrote into its inputs."""

    def __init__(self, message: str, report: LowPrecisionReport | None = None, facts: FailureFacts | None = None):
        super().__init__(message)
        self.report = report
        self.facts = facts if facts is not None else FailureFacts()  # what the message names, as values


@record
class Criterion:
    """How a part's entries are judged; see the module docstring."""

    kind: str = BASELINE  # of CRITERIA
    factor: float = DEFAULT_FACTOR
    floor: float | None = None  # None: LOWPREC_FLOORS for the dtype
    atol: float | None = None  # "table" only; None: TABLE_TOLERANCES for the dtype
    rtol: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in CRITERIA:
            raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {self.kind!r}")
        if not self.factor > 0:
            raise ValueError(f"factor must be > 0, got {self.factor!r}")
        if self.floor is not None and not self.floor >= 0:
            raise ValueError(f"floor must be >= 0, got {self.floor!r}")

    def floor_for(self, dtype: torch.dtype) -> float:
        return self.floor if self.floor is not None else LOWPREC_FLOORS.get(dtype, 16.0)

    def table_for(self, dtype: torch.dtype) -> tuple[float, float]:
        atol, rtol = TABLE_TOLERANCES.get(dtype, (1e-5, 1e-4))
        return (self.atol if self.atol is not None else atol, self.rtol if self.rtol is not None else rtol)

    def describe(self, dtype: torch.dtype) -> str:
        if self.kind == TABLE:
            atol, rtol = self.table_for(dtype)
            return f"table: |low - ref| <= atol={atol:g} * max(1, max|ref|) + rtol={rtol:g} * |ref|"
        steps = dict.fromkeys((_name(dtype), _name(_compute_dtype(dtype))))
        return (
            f"baseline: |low - ref| <= factor={self.factor:g} * baseline + ulp(ref) + floor={self.floor_for(dtype):g} "
            f"* u * max|ref|; baseline: the largest of the reference with each step rounded to "
            f"{' / '.join(steps)}, the reference moved by input rounding, ref rounded to {_name(dtype)}"
        )


@record
class WorstEntry:
    index: tuple[int, ...]
    low: complex | float
    ref: complex | float
    error: float
    baseline: float  # the bound's baseline term (table: the allowed error)
    allowed: float

    @property
    def ratio(self) -> float:
        return self.error / self.allowed if self.allowed > 0 else math.inf


@record
class PartResult:
    """One compared tensor: an output, one input's gradient (VJP) or one output's tangent (JVP)."""

    path: str  # OUTPUT, VJP or JVP
    what: str  # "output 0", "VJP: gradient of input 1", "JVP: tangent of output 0"
    numel: int
    exceeding: int
    max_ratio: float
    worst: tuple[WorstEntry, ...] = ()
    text: str = ""  # the whole report of a failing part, else ""
    floor_needed: float = 0.0  # the least `floor` with which every entry passes (baseline criterion)
    first_entry: str = ""  # the worst entry as `text` lists it first, "" when none is listed
    hints: tuple[str, ...] = ()  # the hints `text` ends with
    input: int | None = None  # VJP: the number of the input whose gradient this is

    @property
    def passed(self) -> bool:
        return self.exceeding == 0 and not self.text


@record
class LowPrecisionReport:
    """What `lowprec_report` compared and found; `error` is None when everything agrees."""

    dtype: torch.dtype
    criterion: Criterion
    parts: tuple[PartResult, ...] = ()
    notes: tuple[str, ...] = ()
    error: LowPrecisionError | None = field(default=None, compare=False)
    inputs_written: bool = False  # the op or its reference wrote into an input (error says which)
    # What the op's backward or forward-AD rule wrote into: "the grad_output of output 0", "the
    # tangent of input 1". A failure unless declared (writes_grad_outputs), then a finding.
    grad_outputs_written: tuple[str, ...] = ()
    reference_not_float64: bool = False  # the reference computes in float32 or narrower inside
    findings: tuple[str, ...] = ()  # what a passing check reports all the same (a declared write, ...)
    # What the error is about when it is not the values: "inputs", "grad_outputs" (an undeclared
    # write into them) or "reference" (not a float64 one); "" for values (or no error).
    failure: str = ""

    @property
    def passed(self) -> bool:
        return self.error is None

    @property
    def first_failure(self) -> PartResult | None:
        return next((p for p in self.parts if not p.passed), None)

    @property
    def message(self) -> str:
        return str(self.error) if self.error is not None else ""
