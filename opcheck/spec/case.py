"""A generated test case's identity: one frozen value, its test name, its parsing and its seed.

Every room that names a case uses this: the validator (ids unique and clean), the generator
(the parametrize ids), the runtime (the seed of the sample and the rerun command), the results
reader (a node id back to its case). The formats are the product's contract: a test's name is
`test_<check>[<device>-<dtype>-<sample>]` and its seed is the sha256 of `<spec>::<name>`, so a
failure reproduces from its id alone on any machine, worker and run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from opcheck.spec.model import CHECKS, TENSOR_DTYPES, OpSpec, Rule

ID_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
"""What a parametrize id may hold (used with fullmatch: `$` would also accept a final newline)."""

_NAME = re.compile(
    r"test_(?P<check>\w+)\[(?P<device>[A-Za-z0-9_.]+)-(?P<dtype>[A-Za-z0-9_.]+)-"
    r"(?P<sample>[A-Za-z0-9_.-]+)\]"
)
SEED_BITS = 63
NEVER_RUNS = frozenset({("mps", "float64"), ("mps", "complex128")})
"""(device, dtype) pairs no build of torch runs (MPS has no 64-bit floating point): no case exists."""


@dataclass(frozen=True, order=True)
class CaseId:
    """(spec, check, device, dtype, sample): which generated test this is."""

    spec: str
    check: str
    device: str
    dtype: str
    sample: str

    @property
    def param_id(self) -> str:
        """The parametrize id: `cpu-float64-vector`."""
        return f"{self.device}-{self.dtype}-{self.sample}"

    @property
    def name(self) -> str:
        """The test's name: `test_gradcheck[cpu-float64-vector]`."""
        return f"test_{self.check}[{self.param_id}]"

    @property
    def module(self) -> str:
        """The generated module's file name: `test_sin.py`."""
        return f"test_{self.spec}.py"

    def nodeid(self, folder: str = "generated_tests") -> str:
        return f"{folder}/{self.module}::{self.name}"

    def is_clean(self) -> bool:
        """Whether the parametrize id keeps to [A-Za-z0-9_.-] (the validator reports the ones that do not)."""
        return ID_CHARS.fullmatch(self.param_id) is not None

    def seed_key(self, attempt: int = 0, *, stream: str = "") -> str:
        """What the seed hashes: `<spec>::<name>[::<stream>][::redraw<attempt>]`."""
        return (
            f"{self.spec}::{self.name}" + (f"::{stream}" if stream else "") + (f"::redraw{attempt}" if attempt else "")
        )

    def seed(self, attempt: int = 0, *, stream: str = "") -> int:
        """A stable 63-bit seed: the first 8 bytes (little-endian) of the sha256 of `seed_key`.

        `stream` names a second random stream of the same case (the low-precision check's
        cotangents); `attempt` counts re-draws of a sample that hit a non-differentiable point.
        """
        key = self.seed_key(attempt, stream=stream)
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & ((1 << SEED_BITS) - 1)

    @classmethod
    def parse(cls, spec: str, name: str) -> CaseId | None:
        """The case of a generated test's name in spec `spec`'s module, or None for any other test."""
        m = _NAME.fullmatch(name)
        if m is None or m["check"] not in CHECKS or m["dtype"] not in TENSOR_DTYPES:
            return None
        return cls(spec, m["check"], m["device"], m["dtype"], m["sample"])

    @classmethod
    def from_nodeid(cls, nodeid: str) -> CaseId | None:
        """The case of a node id (`path/test_sin.py::test_gradcheck[...]`), or None for any other test."""
        module, sep, name = nodeid.partition("::")
        if not sep or "::" in name:
            return None
        return cls.parse(spec_of_module(module), name)


def spec_of_module(module: str) -> str:
    """`generated_tests/test_sin.py` or `generated_tests.test_sin` → `sin`."""
    stem = module.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py").rsplit(".", 1)[-1]
    return stem.removeprefix("test_")


def cases_of(spec: OpSpec) -> Iterator[CaseId]:
    """Every case generated for a spec, in collection order (check, device, dtype, sample)."""
    for check in spec.checks():
        for device in spec.devices:
            for dtype in spec.dtypes_for(check):
                if (device, dtype) in NEVER_RUNS:
                    continue
                for sample in spec.samples:
                    yield CaseId(spec.name, check, device, dtype, sample.name)


# ------------------------------------------------------------------------ skips and expected failures
@dataclass(frozen=True)
class DecidingRules:
    """The spec's `skips` and `expected_failures` rules that can decide one case, as (index in its
    list, rule), in the order they are looked at: the generated module marks the case with each (a
    rule with a torch condition is decided when the module is collected), and `opcheck list` asks
    the installed torch with `skip` and `expected_failure`.

    A skip wins over an expected failure, and the first rule of each kind that applies wins: the
    rules that match are kept up to the first without a torch condition, which applies on every
    torch, so no later rule decides; expected failures only where no skip is certain.
    """

    skips: tuple[tuple[int, Rule], ...] = ()
    expected_failures: tuple[tuple[int, Rule], ...] = ()

    def skip(self) -> Rule | None:
        """The skip rule that applies on the installed torch (imports torch for a torch condition)."""
        return next((rule for _, rule in self.skips if rule.where.matches_torch()), None)

    def expected_failure(self) -> Rule | None:
        """The expected failure that applies on the installed torch, where no skip does."""
        if self.skip() is not None:
            return None
        return next((rule for _, rule in self.expected_failures if rule.where.matches_torch()), None)

    def __bool__(self) -> bool:
        return bool(self.skips or self.expected_failures)


def deciding_rules(spec: OpSpec, case: CaseId) -> DecidingRules:
    """The rules of `spec` that can decide `case` (see DecidingRules)."""
    found: dict[str, tuple[tuple[int, Rule], ...]] = {}
    for kind in ("skips", "expected_failures"):
        chain: list[tuple[int, Rule]] = []
        for index, rule in enumerate(getattr(spec, kind)):
            if rule.where.matches_case(device=case.device, dtype=case.dtype, check=case.check, sample=case.sample):
                chain.append((index, rule))
                if rule.where.torch is None:
                    break
        found[kind] = tuple(chain)
        if chain and chain[-1][1].where.torch is None:
            break  # a certain skip: no expected failure decides
    return DecidingRules(found.get("skips", ()), found.get("expected_failures", ()))
