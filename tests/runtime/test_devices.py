"""Device types, availability and dtype names."""

import pytest
import torch

from opcheck.runtime import devices
from opcheck.spec.model import KNOWN_DEVICES, TENSOR_DTYPES


def test_every_spec_device_and_dtype_is_known():
    assert set(KNOWN_DEVICES) <= set(devices.known_device_types())
    assert {n: devices.torch_dtype(n) for n in TENSOR_DTYPES}["bfloat16"] is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        devices.torch_dtype("float8")


def test_availability_reasons(monkeypatch):
    assert devices.unavailable_reason("cpu") is None
    assert (devices.unavailable_reason("cuda") is None) == torch.cuda.is_available()
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cpu,cuda")
    assert (
        devices.unavailable_reason("cpu")
        == "cpu is not available on this machine (OPCHECK_UNAVAILABLE_DEVICES lists it)"
    )
    assert devices.faked_unavailable() == {"cpu", "cuda"}


def test_mps_cannot_run_double_precision():
    assert "no 64-bit floating point" in devices.unsupported_dtype_reason("mps", "float64")
    assert devices.unsupported_dtype_reason("mps", "float32") is None
    assert devices.unsupported_dtype_reason("cuda", "float64") is None
    assert devices.reference_device("mps") == "cpu" and devices.reference_device("cuda") == "cuda"


def test_a_cpu_check_seeds_the_cpu_generator_alone(monkeypatch):
    torch.manual_seed(5)
    expected = torch.randn(4, dtype=torch.float64)
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    devices.seed_global("cpu", 5)
    assert torch.equal(torch.randn(4, dtype=torch.float64), expected) and seeded == []
    devices.seed_global("cuda", 5)  # another device's check seeds as torch.manual_seed does
    assert torch.equal(torch.randn(4, dtype=torch.float64), expected) and seeded == [5]
