"""Pinning xdist workers to GPUs, on CPU: fake worker ids, CUDA_VISIBLE_DEVICES and device counts."""

from __future__ import annotations

import textwrap

import pytest
import torch

from opcheck.runtime import gpu_workers
from opcheck.runtime.gpu_workers import (
    BY_ENV,
    BY_SET_DEVICE,
    PIN_ENV,
    Pinning,
    device_for_worker,
    pin_xdist_worker,
    plan,
    visible_entries,
    worker_number,
)


@pytest.mark.parametrize(
    "worker_id, expected",
    [("gw0", 0), ("gw3", 3), ("gw12", 12), (None, None), ("", None), ("master", None), ("gw", None), ("gwx", None)],
)
def test_worker_number(worker_id, expected):
    assert worker_number(worker_id) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("0,1", ["0", "1"]),
        (" 2 , 3 ", ["2", "3"]),
        ("1gpu,2", ["1", "2"]),  # strtoul: the leading digits
        ("0,-1,2", ["0"]),  # a negative entry ends the list
        ("0,x,2", ["0"]),  # so does one that is no number
        ("", []),
        ("-1", []),
        ("0,0", []),  # a repeated device hides them all
        ("GPU-aa,GPU-bb", ["GPU-aa", "GPU-bb"]),
        ("GPU-aa,1", ["GPU-aa"]),
        ("MIG-aa,MIG-bb,MIG-cc", ["MIG-aa", "MIG-bb", "MIG-cc"]),
    ],
)
def test_visible_entries_read_cuda_visible_devices_like_cuda(value, expected):
    assert visible_entries(value) == expected


def test_round_robin():
    assert [device_for_worker(w, 2) for w in range(5)] == [0, 1, 0, 1, 0]
    assert [device_for_worker(w, 4) for w in range(3)] == [0, 1, 2]  # fewer workers: GPU 3 idle
    with pytest.raises(ValueError):
        device_for_worker(0, 0)
    with pytest.raises(ValueError):
        device_for_worker(-1, 2)


def test_plan_takes_the_workers_entry():
    assert plan("gw3", ["GPU-a", "GPU-b"]) == Pinning("gw3", 1, 2, "GPU-b", BY_ENV)
    assert plan("gw1", ["4", "6", "7"], how=BY_SET_DEVICE) == Pinning("gw1", 1, 3, "6", BY_SET_DEVICE)


@pytest.mark.parametrize("entries", [[], ["0"]])
def test_plan_with_one_gpu_or_none_changes_nothing(entries):
    assert plan("gw0", entries) is None


def test_plan_outside_a_worker_changes_nothing():
    assert plan(None, ["0", "1"]) is None


# ------------------------------------------------------------------------ pin_xdist_worker
@pytest.fixture
def no_cuda_calls(monkeypatch):
    """Fail on any call that would count or select CUDA devices."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a CUDA call")

    monkeypatch.setattr(torch.cuda, "set_device", forbidden)
    monkeypatch.setattr(torch.cuda, "device_count", forbidden)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", forbidden, raising=False)


def test_each_worker_narrows_cuda_visible_devices_to_its_gpu(no_cuda_calls):
    seen = []
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        env = {"PYTEST_XDIST_WORKER": worker, "CUDA_VISIBLE_DEVICES": "4,6"}
        pinning = pin_xdist_worker(env)
        assert pinning is not None and pinning.how == BY_ENV
        seen.append(env["CUDA_VISIBLE_DEVICES"])
    assert seen == ["4", "6", "4", "6"]  # two workers per GPU
    assert (
        "CUDA_VISIBLE_DEVICES=6"
        in pin_xdist_worker({"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "4,6"}).describe()
    )


def test_pinning_twice_keeps_the_first_choice(no_cuda_calls):
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert pin_xdist_worker(env) is not None
    assert pin_xdist_worker(env) is None  # one device left: nothing to choose
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VISIBLE_DEVICES": "0,1"},  # not an xdist worker
        {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "0,1", PIN_ENV: "0"},
        {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "0,1", PIN_ENV: "off"},
        {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "3"},  # one GPU
        {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": ""},  # none
        {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "-1"},
    ],
)
def test_no_op_cases(env, no_cuda_calls):
    before = dict(env)
    assert pin_xdist_worker(env) is None
    assert env == before


def test_without_cuda_visible_devices_nvml_counts(monkeypatch):
    monkeypatch.setattr(gpu_workers, "_torch_with_cuda", lambda: torch)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 3, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: pytest.fail("would initialize the driver"))
    env = {"PYTEST_XDIST_WORKER": "gw4"}
    assert pin_xdist_worker(env) == Pinning("gw4", 1, 3, "1", BY_ENV)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_without_nvml_the_driver_counts_and_set_device_pins(monkeypatch):
    selected = []
    monkeypatch.setattr(gpu_workers, "_torch_with_cuda", lambda: torch)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: -1, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    env = {"PYTEST_XDIST_WORKER": "gw1"}
    assert pin_xdist_worker(env) == Pinning("gw1", 1, 2, "1", BY_SET_DEVICE)
    assert selected == [1] and "CUDA_VISIBLE_DEVICES" not in env


def test_once_cuda_is_initialized_set_device_pins(monkeypatch):
    selected = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    env = {"PYTEST_XDIST_WORKER": "gw2", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert pin_xdist_worker(env) == Pinning("gw2", 0, 2, "0", BY_SET_DEVICE)
    assert selected == [0] and env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the driver no longer reads it


def test_a_build_without_cuda_changes_nothing(monkeypatch):
    monkeypatch.setattr(gpu_workers, "_torch_with_cuda", lambda: None)
    env = {"PYTEST_XDIST_WORKER": "gw1"}
    assert pin_xdist_worker(env) is None and env == {"PYTEST_XDIST_WORKER": "gw1"}


def test_no_gpu_changes_nothing(monkeypatch):
    monkeypatch.setattr(gpu_workers, "_torch_with_cuda", lambda: torch)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 0, raising=False)
    env = {"PYTEST_XDIST_WORKER": "gw1"}
    assert pin_xdist_worker(env) is None and env == {"PYTEST_XDIST_WORKER": "gw1"}


def test_real_xdist_workers_take_distinct_devices(pytester, monkeypatch):
    """Two real xdist workers, each pinned in its pytest_configure, see one entry each."""
    pytest.importorskip("xdist")
    pytester.makeconftest(
        textwrap.dedent(
            """
            from opcheck.runtime.gpu_workers import pin_xdist_worker

            def pytest_configure(config):
                pin_xdist_worker()
            """
        )
    )
    pytester.makepyfile(
        test_pinned=textwrap.dedent(
            """
            import os
            import pytest

            @pytest.mark.parametrize("i", range(4))
            def test_sees_its_gpu(i):
                worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
                assert os.environ["CUDA_VISIBLE_DEVICES"] == ["GPU-a", "GPU-b"][worker]
            """
        )
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b")
    monkeypatch.delenv(PIN_ENV, raising=False)
    # Run from an xdist worker, the inner controller would take this worker's id for its own.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-p", "no:opcheck")
    result.assert_outcomes(passed=4)
