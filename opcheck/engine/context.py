"""What every comparison of one gradcheck call shares: its flags, names, evaluator and caches.

CheckContext is frozen: a stage that needs it otherwise (gradgradcheck's derivative names, sparse
inputs' stand-ins, auto's step-by-step order) passes on a copy with those fields replaced. The
mutable state of a call is in two objects with one job each: its Evaluator (the batching policy
and the counters) and its NumericalCache (the numerical Jacobians already computed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from opcheck._records import record
from opcheck.engine._util import Func, Inputs, as_tuple, differentiable_outputs
from opcheck.engine.batching import Evaluator
from opcheck.engine.errors import GradcheckError
from opcheck.engine.flags import CheckFlags
from opcheck.engine.reporting import torch_words
from opcheck.engine.route import Sizes, Stepwise
from opcheck.failure_facts import FailureFacts

if TYPE_CHECKING:  # the report's classes load with the first report; layouts with a sparse input
    from opcheck.engine.layouts import LayoutInputs
    from opcheck.engine.reporting.diagnostics import BlockMismatch

Blocks = list[tuple[torch.Tensor, ...]]
"""A numerical Jacobian: per input requiring grad, one (numel_in, numel_out) block per float output."""
CacheKey = tuple[Any, tuple[int, ...], tuple[int, ...]]


class NumericalCache:
    """The numerical Jacobians one call has computed, by function, inputs and outputs.

    The outputs are part of the key: blocks are matched with them by position. The functions are
    kept alive while their blocks are cached, so that the ids in the keys stay theirs.
    """

    def __init__(self) -> None:
        self._blocks: dict[CacheKey, Blocks] = {}
        self._batched: dict[CacheKey, bool] = {}
        self._ulps: dict[CacheKey, float] = {}
        self._settled: dict[CacheKey, dict[int, set[int]]] = {}
        self._keep: list[Callable[..., Any]] = []

    @staticmethod
    def key(fn: Callable[..., Any], inputs: Sequence[Any], outputs: Sequence[Any]) -> CacheKey:
        return (fn, tuple(id(a) for a in inputs), tuple(id(o) for o in outputs))

    def get(self, key: CacheKey) -> Blocks | None:
        return self._blocks.get(key)

    def put(self, key: CacheKey, blocks: Blocks, *, batched: bool, ulps: float = 0.0) -> None:
        self._blocks[key] = blocks
        self._batched[key] = batched
        self._ulps[key] = ulps
        self._keep.append(key[0])

    def batched(self, key: CacheKey) -> bool:
        """Whether vmapped calls computed these blocks (settle_rows then redoes some rows by plain calls)."""
        return self._batched.get(key, False)

    def ulps(self, key: CacheKey) -> float:
        """How far the vmapped rows of these blocks were from their plain probes (Evaluator.numerical_ulps)."""
        return self._ulps.get(key, 0.0)

    def settled(self, key: CacheKey, input_idx: int) -> set[int]:
        """The rows of input input_idx's blocks already recomputed by plain calls (filled by the caller)."""
        return self._settled.setdefault(key, {}).setdefault(input_idx, set())

    def carry(self, before: Sequence[Any], after: Sequence[Any]) -> None:
        """Keep, for a fresh call of the same function at the same inputs (outputs `after`, matched
        by position with `before`), the blocks that plain calls computed for the call that gave
        `before`; drop the rest. After a fused pass falls back, the step-by-step check would compute
        those blocks again by the same plain calls; vmapped blocks it recomputes by plain calls."""

        def alike(b: Any, a: Any) -> bool:
            if not isinstance(b, torch.Tensor):
                return True
            return isinstance(a, torch.Tensor) and (a.shape, a.dtype) == (b.shape, b.dtype)

        same = len(before) == len(after) and all(alike(b, a) for b, a in zip(before, after))
        renamed = {id(b): id(a) for b, a in zip(before, after)} if same else {}
        kept = {
            (fn, ins, tuple(renamed[o] for o in outs)): blocks
            for (fn, ins, outs), blocks in self._blocks.items()
            if not self._batched.get((fn, ins, outs)) and outs and all(o in renamed for o in outs)
        }
        self.clear()
        for key, blocks in kept.items():
            self.put(key, blocks, batched=False)

    def clear(self) -> None:
        self._blocks.clear()
        self._batched.clear()
        self._ulps.clear()
        self._settled.clear()
        self._keep.clear()


@record
class Call:
    """A function at a point, as a check sees it: func(*inputs) gave func_out, and `outputs` are
    those of its outputs that require grad."""

    func: Func
    inputs: Inputs
    func_out: tuple[Any, ...]
    outputs: tuple[torch.Tensor, ...]

    @classmethod
    def at(cls, func: Func, inputs: Inputs, func_out: Any) -> Call:
        """The call that gave func_out (torch's filter: a non-tensor output raises AttributeError)."""
        return cls(func, tuple(inputs), as_tuple(func_out), differentiable_outputs(func_out))

    @classmethod
    def of(cls, func: Func, inputs: Inputs) -> Call:
        """func called at inputs."""
        return cls.at(func, inputs, func(*inputs))


def _output_name(i: int) -> str:
    return f"output {i}"


def _input_name(j: int) -> str:
    return f"input {j}"


def _named_inputs(i: int | None, j: int | None) -> tuple[int, ...]:
    return () if j is None else (j,)


@record
class CheckContext:
    """Settings and state shared by every comparison of one gradcheck call."""

    flags: CheckFlags
    evaluator: Evaluator
    # What a failure calls the derivative checked, and its outputs and inputs (gradgradcheck's
    # first derivative names them otherwise: "VJP of VJP", "grad of input 0", "grad_output 0").
    backward_path: str = "VJP"
    forward_path: str = "JVP"
    output_name: Callable[[int], str] = _output_name
    input_name: Callable[[int], str] = _input_name
    # The numbers of the inputs that output i's and input j's names speak of ("input 2"; None: not named)
    named_inputs: Callable[[int | None, int | None], tuple[int, ...]] = _named_inputs
    numerical_cache: NumericalCache = field(default_factory=NumericalCache)
    # fast_mode="auto": how its step-by-step check starts (what the fused passes handed on: route.py)
    stepwise: Stepwise = Stepwise()
    # sparse and MKLDNN inputs' dense stand-ins: torch's fast-mode directions for them, the
    # positions the numerical Jacobian perturbs, and a hint for their mismatches
    layouts: LayoutInputs | None = None

    def sizes(self, n: int, m: int, inputs: int) -> Sizes:
        """The route's inputs for a Jacobian of m rows and n columns over `inputs` differentiable
        inputs (route.Sizes.of)."""
        flags = self.flags
        return Sizes.of(
            n, m, inputs, jacobian_budget=flags.jacobian_budget, auto=flags.auto, backward=flags.check_backward_ad
        )

    def fail(
        self,
        message: str,
        *,
        check: str,
        path: str = "",
        mismatch: BlockMismatch | None = None,
        facts: FailureFacts | None = None,
    ) -> NoReturn:
        """Raise the call's GradcheckError: torch's first line, then what opcheck found (`facts`:
        what the message names, as values; a mismatch's own by default)."""
        raise GradcheckError(message, check=check, path=path, mismatch=mismatch, facts=facts)

    def fail_gradient_dtype(self) -> NoReturn:
        self.fail(
            f"{torch_words.gradient_dtype(self.flags.check_grad_dtypes)}\n"
            f"check: gradient dtype ({self.backward_path}); backward returned a gradient whose dtype differs "
            "from its input's",
            check="gradient dtype",
            path=self.backward_path,
        )

    def check_forward_dtype(self, primal: torch.Tensor, tangent: torch.Tensor) -> None:
        """With check_grad_dtypes, a real primal must have a real tangent and a complex one a complex tangent."""
        if self.flags.check_grad_dtypes and primal.is_complex() != tangent.is_complex():
            self.fail(
                f"{torch_words.forward_dtype()}\ncheck: forward AD dtype ({self.forward_path}); a "
                f"{'complex' if tangent.is_complex() else 'real'} tangent for a "
                f"{'complex' if primal.is_complex() else 'real'} output",
                check="forward AD dtype",
                path=self.forward_path,
            )
