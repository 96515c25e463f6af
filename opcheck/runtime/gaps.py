"""The memory between a strided sample's elements: the sample makers fill it with NaN, so that an op
reading outside its input's elements shows. A failure made of that NaN is the fill's, not the op's:
the check runs again with the gaps holding 0, and its verdict is the test's, with a note saying what
the NaN showed (gaps_note, lowprec_gaps_note).

A layout with gaps is one with a slice step (`strides: [8, 2]`) or `noncontiguous: true`; a
permutation or an expanded dim has none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def nan_gaps(args: Any, kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The call's tensors (by argument name) whose memory between elements holds NaN; a tensor that
    shares its memory with another of the call's (an OpInfo sample's views of one buffer) is left
    out, since its gaps may be the other's elements."""
    tensors = list(_tensors(args, kwargs))
    buffers = [t.untyped_storage().data_ptr() for _, t in tensors]
    return [
        (name, t)
        for (name, t), buffer in zip(tensors, buffers)
        if buffers.count(buffer) == 1 and bool(_gap_values(t).isnan().any())
    ]


def fill_gaps(tensors: list[tuple[str, torch.Tensor]], value: float = 0.0) -> None:
    """Put `value` in the memory between each tensor's elements (their values stay as they are)."""
    with torch.no_grad():
        for _, t in tensors:
            flat, outside = _flat(t)
            flat[outside] = value


def nonfinite(*tensors: torch.Tensor | None) -> bool:
    return any(t is not None and not bool(torch.isfinite(t.detach()).all()) for t in tensors)


def gaps_note(names: list[str], rerun_failed: bool) -> str:
    """What a non-finite failure with NaN in the gaps of `names` showed."""
    which = ", ".join(names)
    head = (
        f"with NaN in the memory between the elements of {which} (the sample maker's fill, so that reading "
        "outside a tensor's elements shows), the result was NaN or inf: the op reads that memory, so it does "
        "not follow the input's strides (a kernel indexing it as if contiguous, or an unmasked load)"
    )
    if rerun_failed:
        return head + "; the engine report below is of the check run again with 0 there"
    return head + "; run again with 0 there, the check passes, so the values it reads there do not reach the result"


def lowprec_gaps_note(names: list[str], what: str, rerun_failed: bool) -> str:
    """A low-precision check that failed (`what` differed) with NaN between the elements of `names`,
    and failed again (rerun_failed) or passed with 0 there."""
    if rerun_failed:
        return (
            f"run with 0 in the memory between the elements of {', '.join(names)}; with NaN there (the sample "
            f"maker's fill) it failed too ({what})"
        )
    return (
        f"with NaN in the memory between the elements of {', '.join(names)} (the sample maker's fill), "
        f"{what} differed from the float64 reference; run again with 0 there, the check passes: the op reads "
        "that memory (it does not follow the input's strides, or loads a whole block and masks it), but what it "
        "reads there does not reach the result"
    )


def _tensors(args: Any, kwargs: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    def walk(value: Any, name: str) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(value, torch.Tensor):
            if value.layout == torch.strided and (value.is_floating_point() or value.is_complex()):
                yield name, value
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield from walk(item, f"{name}[{i}]")

    for i, a in enumerate(args):
        yield from walk(a, f"args[{i}]")
    for k, v in kwargs.items():
        yield from walk(v, k)


def _flat(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor's whole storage as a flat tensor, and which of its positions are no element's."""
    size = t.untyped_storage().nbytes() // t.element_size()
    flat = t.detach().as_strided((size,), (1,), 0)
    outside = torch.ones(size, dtype=torch.bool, device=t.device)
    if t.numel():
        index = torch.arange(size, device=t.device).as_strided(t.shape, t.stride(), t.storage_offset())
        outside[index.reshape(-1)] = False
    return flat, outside


def _gap_values(t: torch.Tensor) -> torch.Tensor:
    if t.numel() == 0 or t.is_contiguous():
        return t.new_empty(0)
    flat, outside = _flat(t)
    return flat[outside]
