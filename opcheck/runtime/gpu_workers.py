"""One pytest-xdist worker per GPU: on a machine with several GPUs, each worker uses its own.

`pytest -n G generated_tests --opcheck-device cuda` on a machine with G GPUs starts G workers,
gw0 ... gw(G-1); worker k takes GPU k mod G of the GPUs the run may use (round-robin). With more
workers than GPUs several workers share a GPU (gw0 and gw2 on GPU 0 of two); with fewer, the other
GPUs stay idle. Outside a worker (no xdist, or `-n 0`), with one GPU or none, or with
OPCHECK_PIN_GPUS=0 in the environment, nothing changes.

The GPUs the run may use are CUDA_VISIBLE_DEVICES's entries when it is set (ordinals or UUIDs,
read the way CUDA reads them), else every GPU NVML counts. Counting goes through NVML because
asking the CUDA driver would initialize it in the worker, and the driver reads
CUDA_VISIBLE_DEVICES only when it initializes.

The worker's device is applied by narrowing CUDA_VISIBLE_DEVICES to its one entry while CUDA is
not yet initialized in the process (the plugin does it in `pytest_configure`, before any test
runs). Then `cuda` and `cuda:0` in that worker are its GPU, for the generated tests, for code that
names `cuda:0`, for Triton, for any subprocess it starts, and the other GPUs' memory is never
touched. Once CUDA is initialized (a conftest that already ran a CUDA op, or a driver that NVML
could not count for) the variable is no longer read, so `torch.cuda.set_device` selects the
device instead: `cuda` is then the worker's GPU, while code that names `cuda:0` explicitly still
reaches the first one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from types import ModuleType

PIN_ENV = "OPCHECK_PIN_GPUS"
"""Set to 0 (or false, no, off) to leave every xdist worker's CUDA devices as they are."""

WORKER_ENV = "PYTEST_XDIST_WORKER"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
BY_ENV = VISIBLE_ENV
BY_SET_DEVICE = "torch.cuda.set_device"
_OFF = ("0", "false", "no", "off")
_UUID_PREFIXES = ("GPU-", "MIG-")


@dataclass(frozen=True)
class Pinning:
    """Which GPU one xdist worker took, and how it was applied.

    device: its index among the `devices` GPUs the run may use; entry: what CUDA_VISIBLE_DEVICES
    names it by (an ordinal or a UUID); how: BY_ENV or BY_SET_DEVICE.
    """

    worker: str
    device: int
    devices: int
    entry: str
    how: str

    def describe(self) -> str:
        where = f"{VISIBLE_ENV}={self.entry}" if self.how == BY_ENV else f"{BY_SET_DEVICE}({self.device})"
        return f"xdist worker {self.worker}: GPU {self.device} of {self.devices} ({where})"


def pinning_enabled(environ: MutableMapping[str, str]) -> bool:
    return environ.get(PIN_ENV, "1").strip().lower() not in _OFF


def worker_number(worker_id: str | None) -> int | None:
    """3 for xdist's `gw3`; None outside a worker or for an id xdist does not make."""
    if not worker_id or not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return None
    return int(worker_id[2:])


def visible_entries(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's devices, as CUDA reads them; None when the variable is unset.

    Ordinals are read like C's strtoul (`1gpu` is 1); the list ends at the first entry that is not
    one (or is negative), a list of UUIDs at the first entry without the first one's prefix, and a
    repeated device makes the list empty. `""` and `-1` hide every device.
    """
    if value is None:
        return None
    items = [item.strip() for item in value.split(",")]
    prefix = next((p for p in _UUID_PREFIXES if items[0].startswith(p)), None)
    entries: list[str] = []
    for item in items:
        if prefix is not None:
            entry = item if item.startswith(prefix) else None
        else:
            digits = item[1:] if item.startswith("+") else item
            n = len(digits) - len(digits.lstrip("0123456789"))
            entry = str(int(digits[:n])) if n else None
        if entry is None:
            break
        if entry in entries:
            return []
        entries.append(entry)
    return entries


def device_for_worker(worker: int, devices: int) -> int:
    """Round-robin: worker k takes device k mod `devices`."""
    if worker < 0 or devices < 1:
        raise ValueError(f"expected a worker number >= 0 and at least one device, got {worker} and {devices}")
    return worker % devices


def plan(worker_id: str | None, entries: list[str], *, how: str = BY_ENV) -> Pinning | None:
    """The device of xdist worker `worker_id` among `entries`; None when there is nothing to choose."""
    worker = worker_number(worker_id)
    if worker is None or len(entries) < 2:
        return None
    device = device_for_worker(worker, len(entries))
    return Pinning(str(worker_id), device, len(entries), entries[device], how)


def pin_xdist_worker(environ: MutableMapping[str, str] | None = None) -> Pinning | None:
    """Pin this xdist worker to its GPU (see the module's doc); None where nothing was changed.

    Call it in the worker before tests run, e.g. from the plugin's `pytest_configure`. torch is
    imported only to count GPUs when CUDA_VISIBLE_DEVICES is unset.
    """
    env = os.environ if environ is None else environ
    if worker_number(env.get(WORKER_ENV)) is None or not pinning_enabled(env):
        return None
    entries = visible_entries(env.get(VISIBLE_ENV))
    if entries is not None and len(entries) < 2:
        return None
    loaded = sys.modules.get("torch")
    initialized = loaded is not None and bool(loaded.cuda.is_initialized())
    if entries is None:
        with_cuda = _torch_with_cuda()
        if with_cuda is None:
            return None
        count, initialized = _device_count(with_cuda, initialized)
        entries = [str(i) for i in range(count)]
    pinning = plan(env.get(WORKER_ENV), entries, how=BY_SET_DEVICE if initialized else BY_ENV)
    if pinning is None:
        return None
    if pinning.how == BY_ENV:
        env[VISIBLE_ENV] = pinning.entry
    else:
        import torch

        torch.cuda.set_device(pinning.device)
    return pinning


def _torch_with_cuda() -> ModuleType | None:
    """torch, or None when this build has no CUDA (nothing to pin)."""
    import torch

    return torch if torch.backends.cuda.is_built() else None


def _device_count(torch: ModuleType, initialized: bool) -> tuple[int, bool]:
    """(GPUs the process may use, whether the CUDA driver is initialized once they are counted)."""
    if not initialized and not torch.version.hip:
        count_nvml = getattr(torch.cuda, "_device_count_nvml", None)
        try:
            count = int(count_nvml()) if count_nvml is not None else -1
        except Exception:  # NVML answers or it does not; an error is "does not"
            count = -1
        if count >= 0:
            return count, False
    # cudaGetDeviceCount initializes the driver, which then no longer reads CUDA_VISIBLE_DEVICES.
    count = int(torch.cuda.device_count())
    return count, initialized or count > 0
