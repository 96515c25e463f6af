"""Faults stay in their test: README's main command (`python -m pytest generated_tests`) and its xdist
form on a project whose ops segfault, abort, sleep past the time budget and deadlock in C, beside
ops that work. Each fault fails its own test, saying what happened; every other test runs; the
results file records them all. Real processes: a crash cannot be tested in this one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opcheck.triton import triton_installed
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.long  # each test runs pytest, most of them several times

FAULTY_OPS = '''
import ctypes
import os
import time

import torch


def segfault(x):
    ctypes.string_at(0)
    return x


def abort(x):
    os.abort()
    return x


def sleeps(x):
    time.sleep(120)
    return x * 2


def deadlock(x):
    """Locks a mutex it holds: C code that no signal brings back to Python."""
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
    return x


def _record(name):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{name} {os.getpid()}\\n")


def first(x):
    import warnings

    _record("first")
    warnings.warn("first warns", UserWarning)
    return torch.sin(x)


def cuda_broken(x):
    _record("broken")
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def after(x):
    _record("after")
    return torch.sin(x)
'''

SPECS = {  # module test_<name>.py: the op
    "abrt": "faulty_ops:abort",
    "cos": "torch.cos",
    "hang": "faulty_ops:deadlock",
    "segv": "faulty_ops:segfault",
    "sin": "torch.sin",
    "slow": "faulty_ops:sleeps",
    "cuda_0": "faulty_ops:first",
    "cuda_1": "faulty_ops:cuda_broken",
    "cuda_2": "faulty_ops:after",
}
FAULTS = ["abrt", "cos", "hang", "segv", "sin", "slow"]
CUDA = ["cuda_0", "cuda_1", "cuda_2"]
BUDGET = 3


def nodeid(name: str) -> str:
    return f"generated_tests/test_{name}.py::test_gradcheck[cpu-float64-vec]"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faulty")
    (root / "op_specs").mkdir()
    (root / "faulty_ops.py").write_text(FAULTY_OPS)
    for name, op in SPECS.items():
        (root / "op_specs" / f"{name}.yaml").write_text(
            textwrap.dedent(
                f"""\
                op: {op}
                name: {name}
                devices: [cpu]
                samples:
                  - name: vec
                    args: [{{shape: [3]}}]
                gradcheck: {{check_batched_grad: false}}
                gradgradcheck: {{enabled: false}}
                """
            )
        )
    (root / "pyproject.toml").write_text(
        f'[tool.opcheck]\nresults = "build/results.json"\ntime_budget = {BUDGET}\n\n'
        '[tool.pytest.ini_options]\npythonpath = ["."]\n'
    )
    made = forked_python.run("opcheck", "generate", cwd=root, env=_env())  # forked with torch imported
    assert made.returncode == 0, made.stdout + made.stderr
    return root


@pytest.fixture
def project(generated, tmp_path) -> Path:
    shutil.copytree(generated, tmp_path / "p")
    return tmp_path / "p"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return dict(env, **extra)


def pytest_run(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """README's main command, in the project (without the plugins of this test environment that the
    project does not use: hypothesis' costs a second of each run)."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:hypothesispytest"]
    argv += args
    return subprocess.run(argv, cwd=project, env=_env(**env), capture_output=True, text=True, timeout=600)


def records(project: Path) -> dict[str, dict]:
    data = json.loads((project / "build" / "results.json").read_text())
    return {r["nodeid"]: r for r in data["tests"] if r["device"] == "cpu"}


def modules(names: list[str]) -> list[str]:
    return [f"generated_tests/test_{name}.py" for name in names]


def check_faults(ran: subprocess.CompletedProcess, project: Path) -> None:
    out = ran.stdout
    assert ran.returncode == 1, out[-3000:] + ran.stderr[-3000:]
    assert out.strip().splitlines()[-1].strip("= ").startswith("4 failed, 2 passed"), out[-3000:]
    found = records(project)
    assert {n: r["outcome"] for n, r in found.items()} == {
        nodeid("abrt"): "failed",
        nodeid("cos"): "passed",
        nodeid("hang"): "failed",
        nodeid("segv"): "failed",
        nodeid("sin"): "passed",
        nodeid("slow"): "failed",
    }
    reasons = {name: found[nodeid(name)]["reason"] for name in ("abrt", "segv", "hang", "slow")}
    assert reasons["segv"].startswith("crashed the test process: SIGSEGV (signal 11"), reasons
    assert reasons["abrt"].startswith("crashed the test process: SIGABRT (signal 6"), reasons
    assert reasons["hang"].startswith(
        f"exceeded its time budget of {BUDGET} s and did not stop when interrupted: opcheck ended the test process"
    ), reasons
    assert reasons["slow"].startswith(
        f"opcheck.runtime.budget.TimeBudgetExceeded: opcheck gradcheck exceeded its time budget of {BUDGET} s "
        "([tool.opcheck] time_budget) for faulty_ops:sleeps on cpu/float64, sample 'vec'"
    ), reasons
    segv = found[nodeid("segv")]["message"]
    assert "faulty_ops.py:10 in segfault" in segv and f"rerun: pytest '{nodeid('segv')}'" in segv
    assert "faulty_ops.py:15 in abort" in found[nodeid("abrt")]["message"]
    hang = found[nodeid("hang")]["message"]
    assert "where the time went: " in hang and "in gradcheck (VJP, fast_mode auto from the spec): " in hang
    assert "faulty_ops.py:30 in deadlock" in hang
    slow = found[nodeid("slow")]["message"]
    assert "the op's first call had run" in slow and "faulty_ops.py:20 in sleeps" in slow
    # its first call sleeps past the budget: a hang, whose hints name the call, not a cheaper check
    assert "(a hang: " in slow and "hint: a call of the op (its first) on cpu/float64 with inputs [3]" in slow
    assert "hint: a smaller sample" not in slow and "`fast_mode: true` under `gradcheck:`" not in slow


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_the_main_command_fails_each_fault_alone_and_runs_and_records_the_rest(project):
    ran = pytest_run(project, *modules(FAULTS))
    check_faults(ran, project)
    out = ran.stdout
    for name, what in [("abrt", "crashed the test process: SIGABRT"), ("segv", "crashed the test process: SIGSEGV")]:
        assert f"opcheck: {nodeid(name)} {what}" in out and "the tests after it run in a new process" in out
    assert out.count("test session starts") == 1, out  # the later processes' headers stay quiet
    assert "Fatal Python error" not in out + ran.stderr  # faulthandler's dump is in the failure, not loose


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_under_xdist_the_crashed_tests_are_failures_with_the_signal_in_the_results(project):
    pytest.importorskip("xdist")
    ran = pytest_run(project, "-n", "2", *modules(FAULTS))
    check_faults(ran, project)
    assert "(worker gw" in records(project)[nodeid("segv")]["reason"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_isolation_off_runs_in_pytest_s_own_process(project):
    ran = pytest_run(project, "--opcheck-isolation", "off", *modules(["sin", "segv"]))
    assert ran.returncode == -signal.SIGSEGV, ran.stdout[-2000:]
    assert not (project / "build" / "results.json").exists()


def torch_sees_a_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


PROCESS_MODULES = """
import atexit, json, os, sys

import opcheck.triton

ROLE = "child" if "OPCHECK_SUPERVISED" in os.environ else "parent"  # read as pytest loads this plugin


@atexit.register
def record():  # a supervisor ends without configuring pytest: what its process imported, at its end
    seen = {name: name in sys.modules for name in ("torch", "triton")}
    seen["interpreting"] = opcheck.triton.status().interpreting
    with open(os.path.join(os.environ["PROCESSES_DIR"], ROLE + ".json"), "w") as f:
        json.dump(seen, f)
"""


@pytest.mark.skipif(not triton_installed(), reason="the Triton setup, which imports torch, runs where triton is")
@pytest.mark.parametrize("isolation", ["process", "off"])
def test_the_supervisor_leaves_torch_and_triton_to_the_child_that_runs_the_tests(project, isolation):
    # The supervisor starts in a fraction of a second: it never imports torch, whose GPU it would
    # ask about for the Triton setup. The process that runs the tests sets Triton up, supervised
    # or not, before its conftest files load: with no GPU, its kernels run in the interpreter.
    (project / "process_modules.py").write_text(PROCESS_MODULES)
    out = project / "processes"
    out.mkdir()
    args = ("-p", "process_modules", "--opcheck-isolation", isolation, *modules(["sin"]))
    ran = pytest_run(project, *args, PROCESSES_DIR=str(out), TRITON_INTERPRET="")  # the test process's own: unset
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    seen = {path.stem: json.loads(path.read_text()) for path in out.iterdir()}
    gpu = torch_sees_a_gpu()  # with a GPU, kernels compile for it: Triton is not set up (nor patched)
    runs_tests = {"torch": True, "triton": True, "interpreting": not gpu}
    if gpu:  # whether triton is imported then is up to the tests
        runs_tests.pop("triton")
        for record in seen.values():
            if record.get("torch"):
                record.pop("triton")
    if isolation == "process":
        assert seen == {"parent": {"torch": False, "triton": False, "interpreting": False}, "child": runs_tests}
    else:
        assert seen == {"parent": runs_tests}


@pytest.mark.parametrize("workers", [None, "1"], ids=["serial", "xdist"])
def test_after_a_cuda_error_the_next_tests_run_in_a_new_process(project, workers):
    if workers:
        pytest.importorskip("xdist")
    pids = project / "pids.txt"
    ran = pytest_run(project, *(["-n", workers] if workers else []), *modules(CUDA), PIDS_FILE=str(pids))
    assert ran.returncode == 1, ran.stdout[-3000:]
    summary = ran.stdout.strip().splitlines()[-1].strip("= ")
    assert summary.startswith("1 failed, 2 passed, 1 warning"), ran.stdout[-3000:]  # replayed warnings too
    seen = dict(line.split() for line in pids.read_text().splitlines())
    assert seen["first"] == seen["broken"] != seen["after"], seen
    assert f"opcheck: {nodeid('cuda_1')} left the CUDA device unusable (RuntimeError: CUDA error" in ran.stdout
    found = records(project)
    assert [found[nodeid(n)]["outcome"] for n in CUDA] == ["passed", "failed", "passed"]
    assert "crashed the test process" not in ran.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("method", ["signal", "thread"])
def test_beside_pytest_timeout_whichever_limit_comes_first_ends_the_test(project, method):
    pytest.importorskip("pytest_timeout")
    # The budget first: pytest-timeout's SIGALRM timer is left alone and never fires.
    ran = pytest_run(project, "--timeout", "60", "--timeout-method", method, *modules(["sin", "slow"]))
    assert ran.returncode == 1, ran.stdout[-3000:]
    assert records(project)[nodeid("slow")]["reason"].startswith("opcheck.runtime.budget.TimeBudgetExceeded: ")
    assert "Timeout" not in ran.stdout
    # pytest-timeout first: its signal method fails the test; its thread method ends the process,
    # which the supervisor reports, and the test after it still runs (in a fresh process, whose first
    # check pays its imports within that limit too: seconds on a busy machine).
    ran = pytest_run(
        project, "--timeout", "8", "--timeout-method", method, "--opcheck-time-budget", "60", *modules(["slow", "sin"])
    )
    assert ran.returncode == 1, ran.stdout[-3000:]
    found = records(project)
    assert found[nodeid("sin")]["outcome"] == "passed"
    reason = found[nodeid("slow")]["reason"]
    if method == "signal":
        assert reason.startswith("Failed: Timeout"), reason
    else:
        assert reason == "ended the test process with exit status 1", reason
