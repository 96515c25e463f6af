"""The device guards and queries a launcher makes, answered for CPU tensors.

Launchers written for a GPU wrap their launches in `with torch.cuda.device(x.device.index):` (None
for a CPU tensor: TypeError) or `torch.cuda.device(x.device)` (ValueError: "Expected a cuda
device"), and size their grids from the SM count, asked of torch
(`torch.cuda.get_device_properties(x.device).multi_processor_count`, or of
`torch.cuda.current_device()`, or of "cuda" hard-coded: AssertionError without CUDA) or of Triton's
driver (`triton.runtime.driver.active.utils.get_device_properties(i)["multiprocessor_count"]`, as
Triton's tutorials and flash-linear-attention do: "0 active drivers"). Where torch sees no GPU the
interpreter runs every kernel on the CPU, so the one device a launcher can mean is that one: a CPU
device, None, a negative index, and the first CUDA device ("cuda", "cuda:0", index 0, which
`torch.cuda.current_device()` names). The guard given it does nothing, and its properties are those
of a device with SM_COUNT multiprocessors. Any other device (index 1, "cuda:1") reaches torch as
before, and on a machine with a GPU nothing is patched at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from opcheck.triton._patch import Patch, is_patched, mark, parameters, require

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


def _is_interpreted(device) -> bool:
    """Whether `device` names the device interpreted kernels run on (see the module's docstring)."""
    import torch

    if device is None:
        return True
    if isinstance(device, int) and not isinstance(device, bool):
        return device <= 0
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:  # not a device name: torch says so
            return False
    if isinstance(device, torch.device):
        return device.type == "cpu" or (device.type == "cuda" and device.index in (None, 0))
    return False


def _device_guard(original: type) -> type:
    class device(original):
        """torch.cuda.device, doing nothing for the device interpreted kernels run on."""

        def __init__(self, device):
            self._opcheck_interpreted = _is_interpreted(device)
            if self._opcheck_interpreted:
                self.idx = -1
                self.prev_idx = -1
            else:
                super().__init__(device)

        def __enter__(self):
            if not self._opcheck_interpreted:
                return super().__enter__()

        def __exit__(self, *exc):
            if not self._opcheck_interpreted:
                return super().__exit__(*exc)
            return False

    device.__name__ = device.__qualname__ = original.__name__
    device.__module__ = original.__module__
    return mark(device)


def _properties(original):
    def get_device_properties(device=None):
        import torch

        if not torch.cuda.is_available() and _is_interpreted(device):
            return CpuDeviceProperties()
        return original(device)

    return mark(get_device_properties, wraps=original)


def _current_device(original):
    def current_device() -> int:
        """torch.cuda.current_device: 0, the interpreter's device, where torch sees no GPU."""
        import torch

        if not torch.cuda.is_available():
            return 0
        return original()

    return mark(current_device, wraps=original)


def _apply() -> None:
    import torch

    require(not torch.cuda.is_available(), "torch sees a GPU")  # setup() patches nothing then; kept as a guard
    guard = getattr(torch.cuda, "device", None)
    properties = getattr(torch.cuda, "get_device_properties", None)
    current = getattr(torch.cuda, "current_device", None)
    require(isinstance(guard, type) and hasattr(guard, "__enter__"), "torch.cuda.device is not a context manager class")
    assert isinstance(guard, type)  # for the type checker: the guard above raised otherwise
    require(callable(properties), "torch.cuda has no get_device_properties")
    require(callable(current) and parameters(current) == [], "torch.cuda.current_device takes arguments")
    if not is_patched(guard):
        setattr(torch.cuda, "device", _device_guard(guard))  # noqa: B010  (a class: mypy refuses the assignment)
    if not is_patched(properties):
        torch.cuda.get_device_properties = _properties(properties)
    if not is_patched(current):
        torch.cuda.current_device = _current_device(current)


# ------------------------------------------------------------------------------------ Triton's driver
def driver_properties() -> dict[str, int]:
    """What `triton.runtime.driver.active.utils.get_device_properties(i)` answers for the interpreter's
    device: the keys Triton's CUDA driver gives, the values of CpuDeviceProperties."""
    torch_like = CpuDeviceProperties()
    return {
        "max_shared_mem": torch_like.shared_memory_per_block_optin,
        "max_num_regs": torch_like.regs_per_multiprocessor,
        "multiprocessor_count": torch_like.multi_processor_count,
        "warpSize": torch_like.warp_size,
        "sm_clock_rate": 1_410_000,  # kHz, as CUDA reports it
        "mem_clock_rate": 1_215_000,
        "mem_bus_width": 5120,
    }


class _NoDriver:
    """Raises, for any attribute not answered, the error Triton raised without a GPU driver."""

    def __init__(self, error: RuntimeError) -> None:
        self._error_text = str(error)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and repr look for these: not a driver query
            raise AttributeError(name)
        raise RuntimeError(self._error_text)


class InterpreterUtils(_NoDriver):
    """`driver.active.utils` under the interpreter: device properties, nothing else."""

    def get_device_properties(self, device=None) -> dict[str, int]:
        if not _is_interpreted(device):
            raise RuntimeError(
                f"no device {device!r}: Triton's interpreter runs kernels on one device, the CPU "
                "(index 0, as torch.cuda.current_device() says)"
            )
        return driver_properties()


class InterpreterDriver(_NoDriver):
    """`triton.runtime.driver.active` where no GPU driver is: answers the device queries a launcher
    makes (the current device, 0; the torch device, the CPU; the device properties, SM_COUNT
    multiprocessors). Everything else (the target, the benchmarker, launching a compiled kernel)
    raises the error Triton raised, so that what needed a GPU driver still says so."""

    def __init__(self, error: RuntimeError, torch_device: bool) -> None:
        super().__init__(error)
        self.utils = InterpreterUtils(error)
        if torch_device:  # the drivers of this release have it (triton 3.1's do not)
            self.get_active_torch_device = _cpu_device

    def get_current_device(self) -> int:
        return 0


def _cpu_device():
    import torch

    return torch.device("cpu")


def _no_target(original):
    def current_target():
        """No GPU target under the interpreter, as before a driver answered: is_cuda() is False."""
        from triton.runtime import driver

        try:
            active = driver.active
        except RuntimeError:
            return original()
        return None if isinstance(active, InterpreterDriver) else original()

    # triton's own marker of a function its kernels may call, kept
    current_target.__triton_builtin__ = True
    return mark(current_target, wraps=original)


def _apply_driver() -> None:
    import triton.language
    import triton.runtime
    from triton.backends.driver import DriverBase

    config = getattr(triton.runtime, "driver", None)
    require(callable(getattr(config, "set_active", None)), "triton.runtime.driver has no set_active")
    assert config is not None  # for the type checker: the guard above raised otherwise
    try:
        active = config.active
        active.get_current_device  # noqa: B018  (triton 3.1 makes its driver on first use)
    except RuntimeError as e:
        error = e
    else:
        require(isinstance(active, InterpreterDriver), "a GPU driver is active")
        return
    # tl.target_info (not in triton 3.1) takes "no driver" for "no GPU target": kept so once a driver answers
    target_info = getattr(triton.language, "target_info", None)
    original_target = getattr(target_info, "current_target", None)
    if target_info is not None:
        require(callable(original_target) and parameters(original_target) == [], "current_target takes arguments")
    config.set_active(InterpreterDriver(error, torch_device=hasattr(DriverBase, "get_active_torch_device")))
    if target_info is not None and not is_patched(original_target):
        target_info.current_target = _no_target(original_target)


PATCHES = (
    Patch(
        "device queries",
        f"`with torch.cuda.device(...)` of a CPU tensor's device does nothing, torch.cuda.current_device() is 0, and "
        f'torch.cuda.get_device_properties of a CPU device, None, 0 or "cuda" reports {SM_COUNT} multiprocessors '
        "(all raised without CUDA), so multi-program paths run",
        _apply,
    ),
    Patch(
        "driver queries",
        f"triton.runtime.driver.active.utils.get_device_properties(...) reports {SM_COUNT} multiprocessors, "
        'get_current_device() is 0 and get_active_torch_device() the CPU (all raised "0 active drivers"); '
        "anything else of the driver still raises",
        _apply_driver,
    ),
)
