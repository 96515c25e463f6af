"""`opcheck list --cost`: per spec, the costliest tests, those over the threshold with what would
make them cheaper, and the total; devices and options as pytest takes them. Counts and wording
only: no clock decides anything here."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import forked_python

REPO = Path(__file__).resolve().parents[2]

KERNELS = '''
import torch


class _Cube(torch.autograd.Function):
    """x**3 computed outside torch, as a compiled kernel is: no vmap rule, no forward AD, no double backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.from_numpy(x.detach().numpy() ** 3)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.from_numpy(3 * x.numpy() ** 2 * g.numpy())


def cube(x):
    return _Cube.apply(x)
'''


def opcheck(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m opcheck ARGS` in `cwd`, in a process of its own forked with torch imported
    (tests/forked_python.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCHECK_")}
    env["PYTHONPATH"] = str(REPO)
    return forked_python.run("opcheck", *args, cwd=cwd, env=env, timeout=600)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cost")
    (root / "op_specs").mkdir()
    (root / "kernels.py").write_text(KERNELS)
    (root / "op_specs" / "tanh.yaml").write_text(
        "op: torch.tanh\ndevices: [cpu, cuda]\nsamples:\n  - name: v\n    args: [{shape: [4]}]\n"
    )
    (root / "op_specs" / "kernel.yaml").write_text(
        "op: kernels:cube\nname: kernel\ndevices: [cpu]\nsupports_gradgrad: false\n"
        "samples:\n  - name: rows\n    args: [{shape: [12, 12]}]\n"
    )
    return root


@pytest.fixture(scope="module")
def listed(project: Path) -> subprocess.CompletedProcess:
    return opcheck("list", "--cost", "--threshold", "0.0001", "--top", "3", cwd=project)


def test_it_lists_every_spec_the_costliest_tests_and_the_total(listed):
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout.splitlines()
    assert out[0].startswith("estimated on cpu, 1 torch thread, each spec's fast_mode, Jacobian budget 1048576")
    assert re.match(r"spec +tests +seconds +calls +costliest test$", out[1])
    specs = [line.split()[0] for line in out[2:4]]
    assert sorted(specs) == ["kernel", "tanh"]
    kernel = next(line for line in out if line.startswith("kernel "))  # gradcheck, gradgrad_unsupported
    assert re.match(r"kernel +2 +[\d.]+ m?s +[\d,]+ +test_gradcheck\[cpu-float64-rows\] \([\d.]+ m?s\)$", kernel)
    assert "costliest tests (3 of 4):" in out
    top = out[out.index("costliest tests (3 of 4):") + 2]
    assert re.match(r" +! +[\d.]+ m?s +\d+/\d+/\d+/\d+ +kernel::test_gradcheck\[cpu-float64-rows\] +auto: ", top), top
    assert re.match(
        r"2 spec\(s\), 4 tests estimated on cpu: [\d.]+ m?s, 4 over 0\.1 ms; not estimated: 2 on device types "
        r"unavailable here \(cuda 2\)$",
        out[-1],
    ), out[-1]


def test_a_test_over_the_threshold_says_what_would_make_it_cheaper(listed):
    out = listed.stdout
    assert "over 0.1 ms (--threshold), and what would make each cheaper:" in out
    block = out.split("! kernel::test_gradcheck[cpu-float64-rows]: ", 1)[1].split("\n  !", 1)[0]
    assert re.match(r"[\d.]+ m?s \([\d,]+ calls: \d+ fwd, \d+ bwd, 0 jvp, \d+ batched", block)
    # a backward per output element: the kernel has none of what the engine batches with
    assert "- the engine loops, a call per Jacobian row or column: the op has" in block
    assert "no vmap rule" in block and "no forward AD" in block
    assert "- `gradcheck: {fast_mode: true}`: ~" in block
    assert "- a smaller sample: the loops run once per output element (144 here)" in block


def test_the_options_apply_only_with_cost(project):
    result = opcheck("list", "--threshold", "1", cwd=project)
    assert result.returncode == 2 and "--threshold apply only with --cost" in result.stderr
    plain = opcheck("list", cwd=project)
    assert plain.returncode == 0 and "seconds" not in plain.stdout


def test_an_unavailable_device_is_said_not_estimated(project):
    result = opcheck("list", "--cost", "--device", "cuda", "--specs", "op_specs/tanh.yaml", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (
        "1 spec(s), 0 tests estimated on no device: 0.0 ms, 0 over 1.0 s; not estimated: 2 on device types "
        "unavailable here (cuda 2)" in result.stdout
    )


def test_a_policy_replaces_the_specs_fast_mode(project):
    result = opcheck("list", "--cost", "--policy", "fast", "--specs", "op_specs/kernel.yaml", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "--opcheck-policy fast" in result.stdout
    assert "fast mode (random projections)" in result.stdout
    bad = opcheck("list", "--cost", "--budget", "many", cwd=project)
    assert bad.returncode == 2 and "--budget" in bad.stderr


def test_spec_paths_are_arguments(project):
    result = opcheck("list", "--cost", "op_specs/tanh.yaml", "--device", "cpu", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("1 spec(s), 2 tests estimated on cpu: ")
    both = opcheck("list", "op_specs/tanh.yaml", "op_specs/kernel.yaml", cwd=project)
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines()[-1] == "2 spec(s), 6 tests"


def test_a_missing_or_non_spec_path_is_named(project):
    (project / "notes.txt").write_text("not a spec\n")
    result = opcheck("list", "--cost", "op_specs/tanh.yaml", "missing.yaml", "notes.txt", cwd=project)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "missing.yaml: no such file or folder",
        "notes.txt: not a spec: expected a *.yaml or *.yml file, or a folder of them",
    ]


def test_spec_paths_and_specs_together_are_refused(project):
    result = opcheck("list", "--specs", "op_specs", "op_specs/tanh.yaml", cwd=project)
    assert result.returncode == 2 and "give spec paths or --specs, not both" in result.stderr


@pytest.fixture
def budgeted(project: Path, tmp_path: Path) -> Path:
    """The project's specs under a time budget that the kernel's gradcheck cannot keep."""
    (tmp_path / "op_specs").mkdir()
    (tmp_path / "kernels.py").write_text(KERNELS)
    for name in ("tanh", "kernel"):
        (tmp_path / "op_specs" / f"{name}.yaml").write_text((project / "op_specs" / f"{name}.yaml").read_text())
    (tmp_path / "pyproject.toml").write_text('[tool.opcheck]\ntime_budget = "0.0001"\n')
    return tmp_path


def test_generate_with_cost_warns_of_tests_past_the_time_budget(budgeted):
    result = opcheck("generate", "--cost", cwd=budgeted)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("2 written, 0 unchanged, 0 deleted (generated_tests)")
    warning = result.stderr.split("warning: ", 1)[1]
    assert re.match(
        r"\d+ generated test\(s\) estimated past the time budget of 0\.1 ms \(\[tool\.opcheck\] time_budget\); "
        r"each stops there and fails:\n",
        warning,
    ), warning
    block = warning.split("  generated_tests/test_kernel.py::test_gradcheck[cpu-float64-rows]: ~", 1)[1]
    assert "- a smaller sample: the loops run once per output element (144 here)" in block.split("\n  gen")[0]
    again = opcheck("generate", "--cost", cwd=budgeted)  # nothing to write: the estimate still runs
    assert again.returncode == 0 and "test_kernel.py::test_gradcheck[cpu-float64-rows]" in again.stderr


def test_generate_estimates_nothing_unless_asked(budgeted):
    result = opcheck("generate", cwd=budgeted)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    refused = opcheck("generate", "--check", "--cost", cwd=budgeted)
    assert refused.returncode == 2 and "--cost applies when writing" in refused.stderr
