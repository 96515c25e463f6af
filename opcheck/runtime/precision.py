"""Reduced-precision switches: set while a low-precision test runs, restored after.

On Ampere and newer GPUs, float32 convolutions use TF32 by default (torch.backends.cudnn.allow_tf32)
and matmuls may (torch.backends.cuda.matmul.allow_tf32, torch.set_float32_matmul_precision);
float16 and bfloat16 matmuls may reduce in low precision. A low-precision test sets these as the
spec's `reduced_precision:` block declares (default: all off, the strict setting), restores every
one after (also when the test fails), and its failure header says which were on. The flags exist
on a CPU build too, where they change nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from opcheck.spec.model import ReducedPrecision


@dataclass(frozen=True)
class Switches:
    """The torch flags a ReducedPrecision block controls, as they stand."""

    matmul_tf32: bool
    cudnn_tf32: bool
    fp16_reduction: bool
    bf16_reduction: bool
    float32_matmul_precision: str

    @staticmethod
    def read() -> Switches:
        matmul = torch.backends.cuda.matmul
        return Switches(
            matmul_tf32=bool(matmul.allow_tf32),
            cudnn_tf32=bool(torch.backends.cudnn.allow_tf32),
            fp16_reduction=bool(matmul.allow_fp16_reduced_precision_reduction),
            bf16_reduction=bool(matmul.allow_bf16_reduced_precision_reduction),
            float32_matmul_precision=torch.get_float32_matmul_precision(),
        )

    def apply(self) -> None:
        """Set the matmul switches; cuDNN's go through `cudnn_flags` (torch.testing forbids setting
        them directly once it has been imported)."""
        matmul = torch.backends.cuda.matmul
        matmul.allow_tf32 = self.matmul_tf32
        matmul.allow_fp16_reduced_precision_reduction = self.fp16_reduction
        matmul.allow_bf16_reduced_precision_reduction = self.bf16_reduction
        # allow_tf32 and the matmul precision are one setting seen two ways; restore both.
        if torch.get_float32_matmul_precision() != self.float32_matmul_precision:
            torch.set_float32_matmul_precision(self.float32_matmul_precision)


def wanted(block: ReducedPrecision) -> Switches:
    return Switches(
        matmul_tf32=block.tf32,
        cudnn_tf32=block.tf32,
        fp16_reduction=block.reduced_precision_reduction,
        bf16_reduction=block.reduced_precision_reduction,
        float32_matmul_precision="high" if block.tf32 else "highest",
    )


def cudnn_flags(allow_tf32: bool) -> contextlib.AbstractContextManager[None]:
    """cuDNN's TF32 switch for a block, its other flags as they stand (torch restores them after)."""
    c = torch.backends.cudnn
    return c.flags(
        enabled=c.enabled,
        benchmark=c.benchmark,
        benchmark_limit=c.benchmark_limit,
        deterministic=c.deterministic,
        allow_tf32=allow_tf32,
    )


@contextlib.contextmanager
def reduced_precision(block: ReducedPrecision) -> Iterator[Switches]:
    """Set the switches as `block` declares for the duration; restore the previous ones after."""
    before = Switches.read()
    target = wanted(block)
    try:
        with cudnn_flags(target.cudnn_tf32):
            target.apply()
            yield Switches.read()
    finally:
        before.apply()


def describe(block: ReducedPrecision) -> str:
    """`TF32 off (matmul, cuDNN), reduced-precision fp16/bf16 matmul reductions off (spec default)`."""
    tf32 = "on" if block.tf32 else "off"
    reduction = "on" if block.reduced_precision_reduction else "off"
    declared = block != ReducedPrecision()
    return f"TF32 {tf32} (matmul, cuDNN), reduced-precision float16/bfloat16 matmul reductions {reduction}" + (
        " (set by the spec's reduced_precision:)" if declared else " (the strict default)"
    )
