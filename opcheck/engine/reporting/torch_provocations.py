"""Tiny crafted functions and gradients on which torch's gradcheck raises what torch_words needs.

Each maker builds its autograd.Function when called (never at import): only a failure that needs
torch's words runs one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd import Function

Apply = Callable[..., Any]


class Stop(Exception):
    """Raised by `stop`: torch's check has shown what it had to before calling the function."""


def stop(*args: Any) -> Any:
    raise Stop


def f64(n: int) -> torch.Tensor:
    """n zeros of float64 on the CPU that require grad (whatever the default dtype and device)."""
    return torch.zeros(n, dtype=torch.float64, device="cpu", requires_grad=True)


def answering(grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """An output whose torch.autograd.grad returns `grads`, whatever it is asked: torch's checks of
    a backward's gradients, asked about given gradients."""

    class Answer(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.autograd.grad:
                return tuple(grads)
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    return torch.zeros(1, dtype=torch.float64, device="cpu").as_subclass(Answer)


def _apply(cls: type[Function]) -> Apply:
    apply: Apply = cls.apply
    return apply


def nondeterministic_backward() -> Apply:
    """The identity, whose backward scales by how often it ran: two passes differ."""
    calls = [0]

    class Nondeterministic(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return g * calls[0]

    return _apply(Nondeterministic)


def item_in_backward() -> Apply:
    """The identity, whose backward reads its grad_output's value: vmap over it raises."""

    class ItemInBackward(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            g.item()
            return g

    return _apply(ItemInBackward)


def item_in_jvp() -> Apply:
    """The identity, whose jvp reads its tangent's value: vmap over it raises."""

    def jvp(t: torch.Tensor) -> torch.Tensor:
        t.item()
        return t.clone()

    return _identity_with_jvp("ItemInJvp", jvp)


def real_with_complex_tangent() -> Apply:
    """The identity of a real input, whose jvp returns a complex tangent."""
    return _identity_with_jvp("ComplexTangent", lambda t: t.to(torch.complex128))


def _identity_with_jvp(name: str, jvp: Callable[[torch.Tensor], torch.Tensor]) -> Apply:
    """The identity as an autograd.Function (a plain backward) whose jvp is `jvp(tangent)`."""

    class Identity(Function):
        @staticmethod
        def forward(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            pass

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g

        @staticmethod
        def jvp(ctx: Any, t: torch.Tensor) -> torch.Tensor:
            return jvp(t)

    Identity.__name__ = Identity.__qualname__ = name
    return _apply(Identity)


def crash_on_undefined_grad() -> Apply:
    """The identity, whose backward raises RuntimeError for an undefined grad_output."""

    class CrashOnUndefined(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.set_materialize_grads(False)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor | None) -> torch.Tensor:
            if g is None:
                raise RuntimeError("undefined grad_output")
            return g

    return _apply(CrashOnUndefined)


def nonzero_for_undefined_grad() -> Apply:
    """The identity, whose backward returns ones for an undefined grad_output."""

    class NonzeroForUndefined(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor | None) -> torch.Tensor:
            return torch.ones_like(ctx.saved_tensors[0]) if g is None else g

    return _apply(NonzeroForUndefined)


def undefined_tangent_matters() -> Apply:
    """x + y, whose jvp doubles x's tangent when y's is undefined (a zero tangent gives x's)."""

    class UndefinedTangentMatters(Function):
        @staticmethod
        def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            ctx.set_materialize_grads(False)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return g, g

        @staticmethod
        def jvp(ctx: Any, tx: torch.Tensor | None, ty: torch.Tensor | None) -> torch.Tensor | None:
            if tx is None:  # one of the two is defined
                return ty
            return 2 * tx if ty is None else tx + ty

    return _apply(UndefinedTangentMatters)
