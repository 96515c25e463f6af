"""The benchmarks' device: `--device`, clocks that wait for it, and its peak memory beside the host's.

A GPU runs kernels asynchronously, so a clock read while they are queued measures the launches,
not the work: `clock(device)` synchronizes first (on the CPU it is time.perf_counter itself). Peak
device memory is torch's allocator statistic (torch.cuda.max_memory_allocated), reset with
`reset_peak_memory` before each case; on the CPU there is none and it reads as "n/a". Host memory
is the process's peak RSS (getrusage), as before.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch


def add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="where the tensors live: cpu (default), cuda, cuda:1, ...")


def parse_device(name: str) -> torch.device:
    """torch.device(name); exits with torch's reason when this machine does not have it."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise SystemExit(f"--device {name}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: torch {torch.__version__} sees no CUDA device")
    if device.type not in ("cpu", "cuda") and _accelerator(device) is None:
        raise SystemExit(f"--device {name}: not this machine's accelerator")
    return device


def _accelerator(device: torch.device):
    """torch.accelerator where `device` is this machine's accelerator (and not cuda), else None."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return None
    current = accelerator.current_accelerator()
    return accelerator if current is not None and current.type == device.type else None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and (acc := _accelerator(device)) is not None:
        acc.synchronize(device)


def clock(device: torch.device) -> float:
    """time.perf_counter() once the device's queued work is done."""
    synchronize(device)
    return time.perf_counter()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type != "cpu" and (acc := _accelerator(device)) is not None:
        acc.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float | None:
    """Peak device memory allocated by torch since the last reset, in MB (2**20 bytes); None on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type != "cpu" and (acc := _accelerator(device)) is not None:
        return acc.max_memory_allocated(device) / 2**20
    return None


def host_peak_rss_mb() -> float:
    """This process's peak resident set size, in MB (2**20 bytes) (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def fmt_mb(value: float | None, width: int = 0, *, unit: bool = False) -> str:
    """`123` (`123 MB` with unit) or `n/a` where there is no value, right-aligned in `width`."""
    text = "n/a" if value is None else f"{value:.0f}" + (" MB" if unit else "")
    return f"{text:>{width}s}"


def describe(device: torch.device) -> str:
    """`cpu`, or `cuda:INDEX (NAME, MEMORY GiB)`."""
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return f"cuda:{index} ({props.name}, {props.total_memory / 2**30:.0f} GiB)"
