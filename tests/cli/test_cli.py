"""The `opcheck` command: generate, validate, list, new, --version; errors without tracebacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked_python

REPO = Path(__file__).resolve().parents[2]
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
"""For the runs of generated suites: hypothesis' pytest plugin, which they do not use, costs a second of each."""


def opcheck(*args, cwd: Path, fresh: bool = False, **popen) -> subprocess.CompletedProcess:
    """`python -m opcheck ARGS` in `cwd`, in a process of its own forked with torch imported
    (tests/forked_python.py); `fresh`, or with Popen options (a signal's disposition), in a fresh
    interpreter."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not (fresh or popen):
        return forked_python.run("opcheck", *args, cwd=cwd, env=env)
    return subprocess.run(
        [sys.executable, "-m", "opcheck", *args], cwd=cwd, env=env, capture_output=True, text=True, **popen
    )


def pytest_run(*args: str, cwd: Path, pythonpath: str = str(REPO)) -> subprocess.CompletedProcess:
    """`python -m pytest ARGS` in `cwd`, forked with torch imported (tests/forked_python.py): the
    generated tests themselves run in the fresh process its supervisor starts."""
    return forked_python.run("pytest", *args, cwd=cwd, env=dict(os.environ, PYTHONPATH=pythonpath))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "op_specs").mkdir()
    (tmp_path / "op_specs" / "tanh.yaml").write_text(
        "op: torch.tanh\ndevices: [cpu]\nsamples:\n  - name: v\n    args: [{shape: [4]}]\n"
    )
    return tmp_path


def test_validate_and_list(project):
    ok = opcheck("validate", cwd=project)
    assert ok.returncode == 0 and "ok: 1 spec(s)" in ok.stdout
    listed = opcheck("list", cwd=project)
    assert listed.returncode == 0
    assert "tanh" in listed.stdout and "torch.tanh" in listed.stdout and "gradcheck,gradgradcheck" in listed.stdout


def test_bad_spec_reports_file_line_key_and_exits_1(project):
    (project / "op_specs" / "bad.yaml").write_text(
        "op: torch.tanh\nsamples:\n  - name: v\n    args: [{shape: [4]}]\ngradcheck:\n  nondet_tl: 0.1\n"
    )
    for command in (["validate"], ["generate"], ["list"]):
        result = opcheck(*command, cwd=project)
        assert result.returncode == 1, command
        assert "op_specs/bad.yaml:6:3: gradcheck.nondet_tl:" in result.stderr
        assert "nondet_tol" in result.stderr  # the did-you-mean
        assert "Traceback" not in result.stderr
    assert not (project / "generated_tests").exists(), "nothing is generated from an invalid tree"


def test_missing_specs_folder_is_a_clear_error(tmp_path):
    result = opcheck("validate", cwd=tmp_path)
    assert result.returncode == 1 and "op_specs: no such file or folder" in result.stderr


def test_a_python_without_torch_gets_one_line_not_one_per_op(project, monkeypatch, capsys):
    import importlib.util

    from opcheck import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.chdir(project)
    for command in (["validate"], ["generate", "--check"]):
        assert cli.main(command) == 1
        err = capsys.readouterr().err
        assert err.startswith("opcheck: torch is not installed in this Python") and len(err.splitlines()) == 1


def test_new_scaffolds_a_spec_that_validates_generates_and_runs(tmp_path):
    made = opcheck("new", "hypot", "--op", "torch.hypot", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "op_specs" / "hypot.yaml").read_text()
    assert "op: torch.hypot" in text and "{shape: [3, 3]}, {shape: [3, 3]}" in text  # arity probed
    assert "$schema=" in text and text.count("\n#") > 5  # commented
    # a torch op: the compile check is suggested, not on
    assert "\n# compile: true " in text and "\ncompile:" not in text
    assert opcheck("validate", cwd=tmp_path).returncode == 0
    assert opcheck("generate", cwd=tmp_path).returncode == 0
    run = pytest_run("-q", "-p", "no:cacheprovider", *NO_HYPOTHESIS, "generated_tests", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout


CUSTOM_OP = """
import torch


@torch.library.custom_op("opcheck_new_test::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float, *, shift: int) -> torch.Tensor:
    return torch.sin(x) * scale + shift


@scaled_sin.register_fake
def _(x, scale, *, shift):
    return torch.empty_like(x)


def _setup(ctx, inputs, keyword_only_inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x) * ctx.scale, None


scaled_sin.register_autograd(_backward, setup_context=_setup)
"""


@pytest.mark.long
def test_new_reads_a_custom_ops_schema_and_says_what_torch_library_implies(tmp_path):
    (tmp_path / "myops.py").write_text(CUSTOM_OP)
    made = opcheck("new", "scaled_sin", "--op", "myops:scaled_sin", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "op_specs" / "scaled_sin.yaml").read_text()
    # the schema's Tensor, float and keyword-only int, not three [3, 3] tensors
    assert "args: [{shape: [3, 3]}, 1.5]" in text and "kwargs: {shift: 2}" in text
    assert "could not call" not in text
    assert "\nlibrary_opcheck: true" in text and "\nsupports_forward_ad: false" in text
    assert "  check_batched_grad: false" in text and "# check_forward_ad: true" not in text
    assert "\ncompile: true " in text  # a custom op: its fake registration under torch.compile
    assert opcheck("validate", cwd=tmp_path).returncode == 0
    assert opcheck("generate", cwd=tmp_path).returncode == 0
    run = pytest_run(
        "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *NO_HYPOTHESIS,
        "generated_tests", "--opcheck-device", "cpu", "-rA",
        cwd=tmp_path,
        pythonpath=os.pathsep.join([str(REPO), str(tmp_path)]),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for check in ("gradcheck", "gradgradcheck", "forward_ad_unsupported", "library_opcheck", "compile"):
        assert f"PASSED generated_tests/test_scaled_sin.py::test_{check}[cpu-float64-small]" in run.stdout


def test_new_imports_the_module_registering_a_torch_ops_operator_and_writes_it(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text(CUSTOM_OP.replace("opcheck_new_test::", "opcheck_new_import::"))
    op = "torch.ops.opcheck_new_import.scaled_sin"
    refused = opcheck("new", "scaled_sin", "--op", op, cwd=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "list that module in the spec's `imports:`" in refused.stderr
    assert refused.stderr.rstrip().endswith("`opcheck new` imports it with --import mypkg.ops")
    bad = opcheck("new", "scaled_sin", "--op", op, "--import", "my-pkg", cwd=tmp_path)
    assert bad.returncode == 1 and "--import my-pkg: not a dotted module name" in bad.stderr
    made = opcheck("new", "scaled_sin", "--op", op, "--import", "mypkg.ops", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "op_specs" / "scaled_sin.yaml").read_text()
    assert "\nimports: [mypkg.ops]                # imported before the op is resolved\n" in text
    assert "args: [{shape: [3, 3]}, 1.5]" in text and "kwargs: {shift: 2}" in text  # the schema was read
    assert opcheck("validate", cwd=tmp_path).returncode == 0
    assert opcheck("generate", cwd=tmp_path).returncode == 0
    run = pytest_run(
        "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *NO_HYPOTHESIS,
        "generated_tests", "--opcheck-device", "cpu", "-rA", "-k", "gradcheck and not gradgrad",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASSED generated_tests/test_scaled_sin.py::test_gradcheck[cpu-float64-small]" in run.stdout


def test_new_refuses_to_overwrite_and_rejects_bad_input(tmp_path):
    assert opcheck("new", "sin", "--op", "torch.sin", cwd=tmp_path).returncode == 0
    again = opcheck("new", "sin", "--op", "torch.sin", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr
    bad_op = opcheck("new", "x", "--op", "torch.sinn", cwd=tmp_path)
    assert bad_op.returncode == 1 and "did you mean 'sin'" in bad_op.stderr and "Traceback" not in bad_op.stderr
    bad_name = opcheck("new", "Bad-Name", "--op", "torch.sin", cwd=tmp_path)
    assert bad_name.returncode == 1 and "must match" in bad_name.stderr


def test_new_warns_when_the_name_or_the_op_is_taken(project):
    family = project / "op_specs" / "binary.yaml"
    family.write_text(
        "defaults:\n  devices: [cpu]\n  samples:\n    - name: v\n      args: [{shape: [4]}, {shape: [4]}]\n"
        "ops:\n  - op: torch.hypot\n  - op: torch.atan2\n    name: arctan2\n"
    )
    made = opcheck("new", "hypot", "--op", "torch.hypot", cwd=project)
    assert made.returncode == 0 and (project / "op_specs" / "hypot.yaml").exists()  # written all the same
    assert made.stderr.splitlines() == [
        "warning: spec name 'hypot' is already taken by op_specs/binary.yaml:7:9 (torch.hypot), so `opcheck validate` "
        "will report a duplicate name: delete op_specs/hypot.yaml and scaffold under another name "
        "(opcheck new OTHER_NAME --op torch.hypot), or move that spec into op_specs/hypot.yaml"
    ]
    invalid = opcheck("validate", cwd=project)
    assert invalid.returncode == 1 and "duplicate spec name 'hypot'" in invalid.stderr
    # the same op under a free name: a note, not a clash; a free name for a new op: silence
    other = opcheck("new", "atan2_big", "--op", "torch.atan2", cwd=project)
    assert other.returncode == 0 and other.stderr.splitlines() == [
        "warning: torch.atan2 is already tested by spec 'arctan2' (op_specs/binary.yaml:9:11)"
    ]
    fresh = opcheck("new", "logaddexp2", "--op", "torch.logaddexp2", cwd=project)
    assert fresh.returncode == 0 and fresh.stderr == ""
    # a folder whose specs do not validate still tells which names are taken
    (project / "op_specs" / "tanh.yaml").write_text("op: torch.tanh\ndevices: [cpu]\nsamples: 3\n")
    broken = opcheck("new", "tanh", "--op", "torch.tanh", cwd=project)
    assert broken.returncode == 1 and "already exists" in broken.stderr  # its own file: refused as before
    clash = opcheck("new", "tanh2", "--op", "torch.tanh", cwd=project)
    assert clash.returncode == 0 and "already tested" not in clash.stderr  # that spec does not build: no op known


def test_usage_error_exits_2(tmp_path):
    assert opcheck("frobnicate", cwd=tmp_path).returncode == 2


def test_version_is_the_installed_package_version_and_needs_no_torch(tmp_path):
    import importlib.metadata

    import opcheck as package

    try:
        installed = importlib.metadata.version("opcheck")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("opcheck is not installed (pip install -e .)")
    assert package.__version__ == installed, "reinstall (pip install -e .) after changing opcheck.__version__"
    result = opcheck("--version", cwd=tmp_path, fresh=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"opcheck {installed}\n", "")
    probe = (
        "import sys\nfrom opcheck.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit as e:\n"
        "    print(e.code, 'torch' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert loaded.stdout.splitlines()[-1] == "0 False", loaded.stdout + loaded.stderr


def test_pyproject_takes_the_version_from_the_source_and_ships_the_licence():
    # The build reads opcheck.__version__ without importing opcheck, and no metadata form is deprecated.
    pytest.importorskip("setuptools", minversion="77")
    probe = (
        "import sys, warnings\nwarnings.simplefilter('error')\n"
        "from setuptools.dist import Distribution\nfrom setuptools.config.pyprojecttoml import apply_configuration\n"
        "m = apply_configuration(Distribution(), 'pyproject.toml').metadata\n"
        "print(m.version, m.license_expression, m.license_files, 'opcheck' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-I", "-c", probe], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    import opcheck as package

    assert result.stdout.split() == [package.__version__, "BSD-3-Clause", "['LICENSE']", "False"]
    licence = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert licence.startswith("BSD 3-Clause License\n") and "Copyright (c) 2026, the opcheck developers" in licence
    assert f"## {package.__version__}" in (REPO / "CHANGELOG.md").read_text(encoding="utf-8")


def test_noop_generate_uses_the_cache_and_notices_every_change(project):
    assert opcheck("generate", cwd=project).returncode == 0
    module = project / "generated_tests" / "test_tanh.py"
    assert "unchanged since the last run" in opcheck("generate", cwd=project).stdout

    # A hand edit of a generated module is undone, not trusted.
    module.write_text(module.read_text() + "# edited\n")
    assert "1 written" in opcheck("generate", cwd=project).stdout
    assert "# edited" not in module.read_text()

    # A spec change regenerates.
    spec = project / "op_specs" / "tanh.yaml"
    spec.write_text(spec.read_text().replace("[4]", "[5]"))
    assert "1 written" in opcheck("generate", cwd=project).stdout
    assert "shape=(5,)" in module.read_text()

    # --no-cache and --check never skip work.
    assert "0 written, 1 unchanged" in opcheck("generate", "--no-cache", cwd=project).stdout
    assert opcheck("generate", "--check", cwd=project).returncode == 0


def test_a_module_that_exits_or_interrupts_while_imported_is_a_spec_problem(project):
    # What the module prints is its business; what opcheck prints is the problem, and its status.
    (project / "exits_on_import.py").write_text("print('exits_on_import: usage: ...')\nimport sys\nsys.exit(3)\n")
    (project / "interrupts_on_import.py").write_text("raise KeyboardInterrupt\n")
    sample = "samples: [{name: v, args: [{shape: [4]}]}]\n"
    (project / "op_specs" / "exits.yaml").write_text("op: exits_on_import:f\nname: exits\n" + sample)
    (project / "op_specs" / "interrupts.yaml").write_text("op: interrupts_on_import.f\nname: interrupts\n" + sample)
    for command in (["validate"], ["generate"]):
        result = opcheck(*command, cwd=project)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert (
            "op_specs/exits.yaml:1:5: op: importing 'exits_on_import' raised SystemExit(3) while running its "
            "top-level code; code a spec names must not exit or interrupt"
        ) in result.stderr
        assert (
            "op_specs/interrupts.yaml:1:5: op: importing 'interrupts_on_import' raised KeyboardInterrupt() "
            "while running its top-level code"
        ) in result.stderr
        assert "2 problem(s) found." in result.stderr and "Traceback" not in result.stderr
    assert not (project / "generated_tests").exists()


def test_unittest_main_as_an_op_is_a_spec_problem_not_its_usage(project):
    sample = "samples: [{name: v, args: [{shape: [4]}]}]\n"
    (project / "op_specs" / "u.yaml").write_text("op: unittest.__main__:x\n" + sample)
    # unittest's main() reads opcheck's own arguments, prints its usage and exits 2.
    result = opcheck("validate", "--specs", "op_specs/u.yaml", cwd=project)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "op_specs/u.yaml:1:5: op: importing 'unittest.__main__' raised SystemExit(2)" in result.stderr
    assert result.stderr.rstrip().endswith("1 problem(s) found.")


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_a_real_ctrl_c_while_importing_stops_without_a_traceback(project):
    # A SIGINT that arrives while the op's module is imported is the user's Ctrl-C, not a spec problem.
    (project / "slow_import.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    (project / "op_specs" / "slow.yaml").write_text("op: slow_import:f\nsamples: [{name: v, args: [{shape: [4]}]}]\n")
    # SIGINT's default action in the child, as in a terminal: a shell's background job inherits it
    # ignored, and Python then leaves it ignored
    result = opcheck("validate", cwd=project, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert result.returncode == 130 and result.stderr == "opcheck: interrupted\n", result.stderr


def test_a_spec_whose_required_module_is_missing_validates_generates_and_skips(project):
    # As on macOS, where triton has no wheel: the op's module imports a module that is missing.
    missing = "a_module_that_does_not_exist_xyz"
    (project / "kernels_needing_xyz.py").write_text(f"import {missing}\n\n\ndef kernel(x):\n    return x\n")
    (project / "op_specs" / "kernel.yaml").write_text(
        f"op: kernels_needing_xyz:kernel\nrequires: [{missing}]\ndevices: [cpu]\n"
        "samples:\n  - name: v\n    args: [{shape: [4]}, 1]  # one argument too many: not judged\n"
    )
    note = (
        f"op_specs/kernel.yaml: requires {missing}, which is not installed: its op is not imported, "
        "and its tests skip\n"
    )
    for command in (["validate"], ["generate"], ["generate", "--check"], ["list"]):
        result = opcheck(*command, cwd=project)
        assert result.returncode == 0, (command, result.stderr)
        assert result.stderr == note, command
        if command == ["validate"]:
            assert "ok: 2 spec(s)" in result.stdout
    module = (project / "generated_tests" / "test_kernel.py").read_text()
    assert f'requires=("{missing}",),' in module and missing not in module.replace(f'requires=("{missing}",)', "")

    run = pytest_run(
        "-p", "no:cacheprovider", "-p", "no:randomly", *NO_HYPOTHESIS, "-o", "addopts=", "-rs",
        "generated_tests/test_kernel.py",
        cwd=project,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 skipped" in run.stdout and "failed" not in run.stdout and "error" not in run.stdout
    assert f"requires {missing}, which is not installed (op_specs/kernel.yaml: requires: [{missing}])" in run.stdout

    # Without the key the spec is invalid, as it always was: its op does not import.
    spec = project / "op_specs" / "kernel.yaml"
    spec.write_text(spec.read_text().replace(f"requires: [{missing}]\n", ""))
    result = opcheck("validate", cwd=project)
    assert result.returncode == 1 and "op_specs/kernel.yaml:1:5: op: cannot import module" in result.stderr
