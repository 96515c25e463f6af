"""The device guards and queries a launcher makes, answered for CPU tensors.

Launchers written for a GPU wrap their launches in `with torch.cuda.device(x.device.index):` (None
for a CPU tensor: TypeError) or `torch.cuda.device(x.device)` (ValueError: "Expected a cuda
device"), and size their grids from `torch.cuda.get_device_properties(x.device)
.multi_processor_count` (AssertionError without CUDA). Where torch sees no GPU, the guard given a
CPU device, None or a negative index does nothing, and the properties of a CPU device (or of
None) are those of a device with SM_COUNT multiprocessors. Any other argument reaches torch as
before, and on a machine with a GPU nothing is patched at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from opcheck.triton._patch import Patch, is_patched, mark, require

SM_COUNT = 4
"""Multiprocessors a CPU "device" reports. More than one, so that a kernel whose grid is sized from
the SM count (a norm backward's partial sums, one group per SM) runs several programs and its
cross-program reduction adds more than one partial; few, so that the interpreter stays quick."""


@dataclass(frozen=True)
class CpuDeviceProperties:
    """What torch.cuda.get_device_properties answers for a CPU device under the interpreter."""

    name: str = "cpu (Triton interpreter)"
    multi_processor_count: int = SM_COUNT
    major: int = 8
    minor: int = 0
    total_memory: int = 16 * 2**30
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    shared_memory_per_block: int = 48 * 2**10
    shared_memory_per_block_optin: int = 160 * 2**10
    shared_memory_per_multiprocessor: int = 164 * 2**10
    regs_per_multiprocessor: int = 65536
    L2_cache_size: int = 40 * 2**20
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    gcnArchName: str = ""


def _is_cpu(device) -> bool:
    import torch

    if device is None or device == "cpu":
        return True
    if isinstance(device, torch.device):
        return device.type == "cpu"
    return isinstance(device, int) and device < 0


def _device_guard(original: type) -> type:
    class device(original):
        """torch.cuda.device, doing nothing for a CPU device, None or a negative index."""

        def __init__(self, device):
            self._opcheck_cpu = _is_cpu(device)
            if self._opcheck_cpu:
                self.idx = -1
                self.prev_idx = -1
            else:
                super().__init__(device)

        def __enter__(self):
            if not self._opcheck_cpu:
                return super().__enter__()

        def __exit__(self, *exc):
            if not self._opcheck_cpu:
                return super().__exit__(*exc)
            return False

    device.__name__ = device.__qualname__ = original.__name__
    device.__module__ = original.__module__
    return mark(device)


def _properties(original):
    def get_device_properties(device=None):
        import torch

        if not torch.cuda.is_available() and _is_cpu(device):
            return CpuDeviceProperties()
        return original(device)

    return mark(get_device_properties, wraps=original)


def _apply() -> None:
    import torch

    require(not torch.cuda.is_available(), "torch sees a GPU")  # setup() patches nothing then; kept as a guard
    guard = getattr(torch.cuda, "device", None)
    properties = getattr(torch.cuda, "get_device_properties", None)
    require(isinstance(guard, type) and hasattr(guard, "__enter__"), "torch.cuda.device is not a context manager class")
    assert isinstance(guard, type)  # for the type checker: the guard above raised otherwise
    require(callable(properties), "torch.cuda has no get_device_properties")
    if not is_patched(guard):
        setattr(torch.cuda, "device", _device_guard(guard))  # noqa: B010  (a class: mypy refuses the assignment)
    if not is_patched(properties):
        torch.cuda.get_device_properties = _properties(properties)


PATCHES = (
    Patch(
        "device queries",
        f"`with torch.cuda.device(cpu_tensor.device...)` does nothing and torch.cuda.get_device_properties of a CPU "
        f"device reports {SM_COUNT} multiprocessors (both raised without CUDA), so multi-program paths run",
        _apply,
    ),
)
