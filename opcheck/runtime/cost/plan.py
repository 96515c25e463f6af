"""What a cost plan is made of: the kinds of evaluation of a function under check, the plan of
an engine call's evaluations, and the calls of the op a plan adds up to."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum


class Kind(Enum):
    """A kind of evaluation of the function under check."""

    FORWARD = "forward"
    BACKWARD = "backward"
    JVP = "jvp"  # a forward-mode call (dual inputs)
    VMAP = "vmapped forward"
    VMAP_JVP = "vmapped jvp"  # points and tangents batched (the fused passes)
    VMAP_TANGENTS = "vmapped jvp at one point"  # tangents batched (the Jacobian's columns, J·U)
    BATCHED_BACKWARD = "batched backward"
    DOUBLE_BACKWARD = "double backward"  # backward through a backward (batched over `rows` cotangents)

    @property
    def batched(self) -> bool:
        """A vmapped call of the op, or a batched backward (a double backward is neither: it runs
        backward's own graph, not the op)."""
        return self in (Kind.VMAP, Kind.VMAP_JVP, Kind.VMAP_TANGENTS, Kind.BATCHED_BACKWARD)


TIMED = "timed choice"
"""A plan step where the engine decides by timing its own calls (a batch schedule's later batches,
the fused projections' choice between backward's rows and every column's differences): a dry run
decides it on its virtual clock, from the probe's times, and its counts can differ from the
engine's there."""


@dataclass
class Plan:
    """Evaluations by (kind, rows per call) and how many; `path` says which comparisons made them."""

    evals: Counter[tuple[Kind, int]] = field(default_factory=Counter)
    path: list[str] = field(default_factory=list)
    steps: Counter[str] = field(default_factory=Counter)  # the engine's stages run (their bookkeeping costs)
    seconds: float = 0.0  # the evaluations' seconds, each at its function's probed time
    crashed: bool = False  # the op raised where the engine lets it (a plain backward): the call ends there
    # the engine's own count of its backward passes, plain and batched (its report's); None where
    # the check raised, or where no check ran (a declared-unsupported test)
    engine_backward: int | None = None

    def add(self, kind: Kind, count: int = 1, rows: int = 1, each: float = 0.0) -> None:
        if count > 0:
            self.evals[(kind, rows)] += count
            self.seconds += count * each

    def note(self, text: str) -> None:
        if text not in self.path:
            self.path.append(text)


@dataclass(frozen=True)
class Calls:
    """Evaluations of the function under check, by kind; a batched one counts once, whatever its rows."""

    forward: int = 0
    backward: int = 0
    jvp: int = 0  # forward-mode calls (dual inputs)
    batched: int = 0  # vmapped forwards and JVPs, batched backwards
    rows: int = 0  # the batched evaluations' rows together
    double_backward: int = 0  # backward passes through backward's graph (batched or not): not the op's code

    def __add__(self, other: Calls) -> Calls:
        return Calls(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[int, int, int, int, int, int]:
        return (self.forward, self.backward, self.jvp, self.batched, self.rows, self.double_backward)

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.jvp + self.batched + self.double_backward

    def describe(self) -> str:
        text = f"{self.forward} fwd, {self.backward} bwd, {self.jvp} jvp, {self.batched} batched ({self.rows} rows)"
        return text + (f", {self.double_backward} double bwd" if self.double_backward else "")

    @classmethod
    def of(cls, plan: Plan) -> Calls:
        counts = Counter[str]()
        for (kind, rows), count in plan.evals.items():
            if kind.batched:
                counts["batched"] += count
                counts["rows"] += count * rows
            else:
                counts[kind.name.lower()] += count
        return cls(*(counts[k] for k in ("forward", "backward", "jvp", "batched", "rows", "double_backward")))
