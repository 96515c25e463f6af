"""Tolerances are data: tables per dtype, merged with the spec, resolved in one place.

Layers, later winning, each field on its own:

1. engine defaults: torch.autograd.gradcheck's eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=0;
2. the per-dtype table, `DTYPE_TOLERANCES`: its gradient rows for the gradient checks, its
   low-precision rows for the low-precision check (its own comparison; see below);
3. the spec's `gradcheck:` block (eps/atol/rtol when given; nondet_tol when not 0); it describes
   the finite-difference checks, so it is not applied to the low-precision check;
4. the spec's `tolerances:` rules that match (device, dtype, check, sample), less specific before
   more specific (Where.specificity), in file order among equals: the last matching rule wins.

Each row of the table says why its values are what they are (`basis`); opcheck/spec/FORMAT.md
shows the same table, and a test keeps the two equal.

Gradient checks (float64 / complex128): finite differences in double precision leave errors of
about eps**2 * f''' + ulp / eps ~ 1e-10 relative, so torch's defaults hold.

Low-precision check (float32 / float16 / bfloat16 / complex64): the op at the low dtype against
the same op on the float64/complex128 copy of the same (exactly representable) inputs, for the
outputs, the VJP and (with check_forward_ad) the JVP. An entry passes when

    |low - ref| <= atol * max(1, max|ref|) + rtol * |ref|

(atol is relative to the tensor's scale so that cancellation near zero in a large tensor does not
fail a correct kernel). Each row's `basis` gives the measured worst ratio |low - ref| / allowed on
CPU over 25 draws of 21 ops (sin, exp, tanh, sigmoid, softmax, log_softmax, matmul with K=16..512,
sum, mean, cumsum, layer_norm, mul, div, pow, log, conv1d, vector_norm, prod, var) and their VJPs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from opcheck.engine.flags import DEFAULT_ATOL, DEFAULT_EPS, DEFAULT_RTOL
from opcheck.engine.lowprec import BASELINE, DEFAULT_FACTOR, LOWPREC_FLOORS, TABLE, Criterion
from opcheck.spec.model import LOWPREC, Dtype, OpSpec, ToleranceRule

FIELDS = ("eps", "atol", "rtol", "nondet_tol")

ENGINE_DEFAULTS = {"eps": DEFAULT_EPS, "atol": DEFAULT_ATOL, "rtol": DEFAULT_RTOL, "nondet_tol": 0.0}

GRADIENT = "gradient"
LOW_PRECISION = "low-precision"


@dataclass(frozen=True)
class DtypeTolerances:
    """One row of the per-dtype table: where a kind of check at this dtype starts (layer 2)."""

    dtype: str
    used_by: str  # GRADIENT (the finite-difference checks) or LOW_PRECISION (the lowprec check)
    atol: float
    rtol: float
    eps: float | None = None  # None: the layer below decides
    nondet_tol: float | None = None
    basis: str = ""  # why these values

    def values(self) -> dict[str, float]:
        """The fields this row sets."""
        return {name: value for name in FIELDS if (value := getattr(self, name)) is not None}


_LOW = LOW_PRECISION
# fmt: off
DTYPE_TOLERANCES: tuple[DtypeTolerances, ...] = (
    DtypeTolerances(Dtype.FLOAT64.value, GRADIENT, **ENGINE_DEFAULTS, basis="torch.autograd.gradcheck's defaults"),
    DtypeTolerances(Dtype.COMPLEX128.value, GRADIENT, **ENGINE_DEFAULTS, basis="as float64"),
    DtypeTolerances(Dtype.FLOAT32.value, _LOW, atol=1e-5, rtol=1e-4,
                    basis="worst ratio 0.025; ulp 1.2e-7: 40x margin, a 1% error is 100x over"),
    DtypeTolerances(Dtype.COMPLEX64.value, _LOW, atol=1e-5, rtol=1e-4, basis="worst ratio 0.021; as float32"),
    DtypeTolerances(Dtype.FLOAT16.value, _LOW, atol=2e-3, rtol=2e-3,
                    basis="worst ratio 0.35; ulp 9.8e-4 (1e-3 rtol measured 0.69: too tight)"),
    DtypeTolerances(Dtype.BFLOAT16.value, _LOW, atol=1.6e-2, rtol=1.6e-2,
                    basis="worst ratio 0.34; ulp 7.8e-3 (torch.testing's bfloat16 rtol)"),
)
# fmt: on

# The table by kind of check, dtype → the fields its row sets.
GRADIENT_TOLERANCES: dict[str, dict[str, float]] = {
    row.dtype: row.values() for row in DTYPE_TOLERANCES if row.used_by == GRADIENT
}
LOWPREC_TOLERANCES: dict[str, dict[str, float]] = {
    row.dtype: row.values() for row in DTYPE_TOLERANCES if row.used_by == LOW_PRECISION
}


@dataclass(frozen=True)
class Tolerances:
    """The values a check uses, and for each the layer that set it."""

    eps: float
    atol: float
    rtol: float
    nondet_tol: float
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def engine_kwargs(self) -> dict[str, float]:
        return {"eps": self.eps, "atol": self.atol, "rtol": self.rtol, "nondet_tol": self.nondet_tol}

    def describe(self, names: Sequence[str] = FIELDS) -> str:
        """`eps=1e-06, atol=1e-05 (gradient table for float64), rtol=0.01 (rule at x.yaml:9:5)`."""
        groups: list[tuple[str, list[str]]] = []
        for n in names:
            source = self.sources.get(n, "?")
            if groups and groups[-1][0] == source:
                groups[-1][1].append(n)
            else:
                groups.append((source, [n]))
        return ", ".join(", ".join(f"{n}={getattr(self, n):g}" for n in ns) + f" ({source})" for source, ns in groups)


def resolve_tolerances(spec: OpSpec, check: str, device: str, dtype: str, sample: str) -> Tolerances:
    """eps/atol/rtol/nondet_tol for one test, with the layer each value came from."""
    values = dict(ENGINE_DEFAULTS)
    sources = {name: "engine default" for name in FIELDS}

    def apply(layer: Mapping[str, float | None], source: str) -> None:
        for name in FIELDS:
            value = layer.get(name)
            if value is not None:
                values[name] = float(value)
                sources[name] = source

    used_by, table = (LOW_PRECISION, LOWPREC_TOLERANCES) if check == LOWPREC else (GRADIENT, GRADIENT_TOLERANCES)
    apply(table.get(dtype, {}), f"{used_by} table for {dtype}")
    if check != LOWPREC:
        block = spec.gradcheck
        where = f"gradcheck: block of {spec.source}"
        apply({"eps": block.eps, "atol": block.atol, "rtol": block.rtol, "nondet_tol": block.nondet_tol or None}, where)
    matching = [
        (i, r)
        for i, r in enumerate(spec.tolerances)
        if r.where.matches(device=device, dtype=dtype, check=check, sample=sample)
    ]
    matching.sort(key=lambda ir: (ir[1].where.specificity, ir[0]))
    for _, rule in matching:
        where = str(rule.location) if rule.location.file else f"{spec.source} tolerances"
        apply(
            {"eps": rule.eps, "atol": rule.atol, "rtol": rule.rtol, "nondet_tol": rule.nondet_tol},
            f"rule at {where}" + (f": {rule.reason}" if rule.reason else ""),
        )
    return Tolerances(sources=sources, **values)


@dataclass(frozen=True)
class LowprecCriterion:
    """The low-precision check's criterion for one test, and where each of its values came from."""

    criterion: Criterion
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def describe(self, dtype: str) -> str:
        """`criterion=baseline (default), factor=2 (default), floor=0.5 (default for bfloat16)`, with the
        table's atol and rtol when the table decides."""
        c = self.criterion
        shown = [("criterion", c.kind)]
        if c.kind == BASELINE:
            shown += [("factor", f"{c.factor:g}"), ("floor", f"{c.floor:g}" if c.floor is not None else "?")]
        else:
            shown += [("atol", f"{c.atol:g}"), ("rtol", f"{c.rtol:g}")]
        return ", ".join(f"{name}={value} ({self.sources.get(name, 'default')})" for name, value in shown)


def _matching_rules(spec: OpSpec, check: str, device: str, dtype: str, sample: str) -> list[ToleranceRule]:
    matching = [
        (i, r)
        for i, r in enumerate(spec.tolerances)
        if r.where.matches(device=device, dtype=dtype, check=check, sample=sample)
    ]
    matching.sort(key=lambda ir: (ir[1].where.specificity, ir[0]))
    return [r for _, r in matching]


def resolve_lowprec_criterion(spec: OpSpec, device: str, dtype: str, sample: str) -> LowprecCriterion:
    """The criterion of one low-precision test: "baseline" with its default factor and the dtype's
    floor, changed by the matching `tolerances:` rules in the order resolve_tolerances applies them.
    A rule that sets atol or rtol (and no criterion) judges by the table: those values are the
    table's, and a spec written for the table keeps its meaning."""
    tol = resolve_tolerances(spec, LOWPREC, device, dtype, sample)
    torch_dtype = getattr(torch, dtype)
    kind, factor = BASELINE, DEFAULT_FACTOR
    floor = LOWPREC_FLOORS.get(torch_dtype, 256.0)
    sources = {
        "criterion": "default",
        "factor": "default",
        "floor": f"default for {dtype}",
        "atol": tol.sources["atol"],
        "rtol": tol.sources["rtol"],
    }
    for rule in _matching_rules(spec, LOWPREC, device, dtype, sample):
        where = "rule at " + (str(rule.location) if rule.location.file else f"{spec.source} tolerances")
        if rule.reason:
            where += f": {rule.reason}"
        if rule.criterion is not None:
            kind = rule.criterion
            sources["criterion"] = where
        elif rule.atol is not None or rule.rtol is not None:
            kind = TABLE
            sources["criterion"] = f"implied by atol/rtol at {where}"
        if rule.factor is not None:
            factor, sources["factor"] = float(rule.factor), where
        if rule.floor is not None:
            floor, sources["floor"] = float(rule.floor), where
    return LowprecCriterion(Criterion(kind, factor, floor, tol.atol, tol.rtol), sources)
