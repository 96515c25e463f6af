"""Device types and dtypes: which exist, which this machine has, and why a test is skipped.

A spec names device *types* (`cpu`, `cuda`, `mps`, `xpu`, or another torch.accelerator backend
such as `hpu` or a PrivateUse1 backend); tests run on the type's current device. A type that is
unavailable here skips its tests with a reason saying what torch reported.

For tests of the skip path, `OPCHECK_UNAVAILABLE_DEVICES=cpu,cuda` makes the listed types count as
unavailable whatever the hardware.
"""

from __future__ import annotations

import os

import torch

from opcheck.runtime.context import UNAVAILABLE_ENV

STANDARD_DEVICES = ("cpu", "cuda", "mps", "xpu")

DTYPES = {
    "float64": torch.float64,
    "complex128": torch.complex128,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "complex64": torch.complex64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


def known_device_types() -> tuple[str, ...]:
    """cpu, cuda, mps, xpu, plus the accelerator backend and PrivateUse1 name this torch has."""
    names = list(STANDARD_DEVICES)
    accel = _current_accelerator()
    if accel and accel not in names:
        names.append(accel)
    try:
        private = torch._C._get_privateuse1_backend_name()
    except Exception:  # pragma: no cover - older torch
        private = None
    if private and private != "privateuseone" and private not in names:
        names.append(private)
    return tuple(names)


def _current_accelerator() -> str | None:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return None
    try:
        dev = accelerator.current_accelerator()
    except Exception:
        return None
    return dev.type if dev is not None else None


def faked_unavailable() -> set[str]:
    raw = os.environ.get(UNAVAILABLE_ENV, "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def unavailable_reason(device: str) -> str | None:
    """None when tests can run on `device`, else a sentence saying why not."""
    if device in faked_unavailable():
        return f"{device} is not available on this machine ({UNAVAILABLE_ENV} lists it)"
    if device == "cpu":
        return None
    if device == "cuda":
        if torch.cuda.is_available():
            return None
        return "cuda is not available on this machine (torch.cuda.is_available() is False)"
    if device == "mps":
        backend = getattr(torch.backends, "mps", None)
        if backend is not None and backend.is_available():
            return None
        return "mps is not available on this machine (torch.backends.mps.is_available() is False)"
    module = getattr(torch, device, None)
    if module is not None and hasattr(module, "is_available"):
        if module.is_available():
            return None
        return f"{device} is not available on this machine (torch.{device}.is_available() is False)"
    if _current_accelerator() == device:
        return None
    known = ", ".join(known_device_types())
    return f"{device} is not a device type this torch build knows (it knows {known})"


def unsupported_dtype_reason(device: str, dtype: str) -> str | None:
    """Combinations a backend cannot run at all (skipped, not failed)."""
    if device == "mps" and dtype in ("float64", "complex128"):
        return f"mps has no 64-bit floating point: {dtype} cannot run there"
    return None


def reference_device(device: str) -> str:
    """Where the low-precision check computes its float64 reference."""
    return "cpu" if device == "mps" else device


def seed_global(device: str, seed: int) -> None:
    """Seed the global generators a check on `device` draws from: on the cpu, the cpu's alone
    (torch.manual_seed also queues every accelerator's seeding, with a stack trace for each, where
    none is initialized); elsewhere, as torch.manual_seed does."""
    if device == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
