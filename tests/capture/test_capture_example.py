"""The README's capture loop on the example model, end to end on the CPU: capture -> generate ->
pytest, green; and the reason for it: a tail-tile mutant of the model's RMSNorm kernel that the
captured sample catches and the hand-written toy sample (op_specs/rms_norm.yaml) does not."""

import os
from pathlib import Path

import pytest

from opcheck.spec import load_specs
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]
TOY_SPEC = REPO / "op_specs" / "rms_norm.yaml"
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
"""For the pytest runs of generated suites: hypothesis' plugin, which they do not use, costs a second of each."""


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def _run(module, *args, cwd):
    """`python -m MODULE ARGS`, in a process of its own forked with torch imported
    (tests/forked_python.py): the generated tests run in the fresh process pytest's supervisor starts."""
    return forked_python.run(module, *args, cwd=cwd, env=_env(), timeout=600)


def _opcheck(*args, cwd):
    return _run("opcheck", *args, cwd=cwd)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A scratch project with the example model's rms_norm and gelu calls captured into op_specs/."""
    project = tmp_path_factory.mktemp("project")
    (project / "pyproject.toml").write_text("[tool.opcheck]\n", encoding="utf-8")
    done = _opcheck(
        "capture",
        "--op",
        "torch.ops.opcheck_examples.rms_norm",
        "--op",
        "torch.nn.functional.gelu",
        "--",
        "python",
        "-m",
        "examples.transformer",
        cwd=project,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return project, done.stdout


def test_the_example_model_is_captured_at_its_real_sizes(captured):
    project, out = captured
    assert "wrote op_specs/rms_norm.yaml: 2x13x80_80" in out
    assert "wrote op_specs/gelu.yaml: 2x13x320" in out
    (rms,) = load_specs([project / "op_specs" / "rms_norm.yaml"], root=project)
    assert rms.op == "torch.ops.opcheck_examples.rms_norm"
    assert rms.imports == ("examples.transformer",)
    assert [s.name for s in rms.samples] == ["2x13x80_80"]
    x, weight, eps = rms.samples[0].args
    assert (x.shape, weight.shape, eps) == ((2, 13, 80), (80,), 1e-6)
    assert rms.lowprec_dtypes == ("float32",)  # the model runs in float32
    assert not rms.supports_forward_ad  # the probe: register_autograd gives no tangent
    text = (project / "op_specs" / "rms_norm.yaml").read_text(encoding="utf-8")
    assert "examples/transformer.py:" in text and "(forward)" in text  # the call site
    assert "estimated cost on this cpu: gradcheck float64" in text


def test_generate_and_pytest_pass_on_the_captured_specs(captured):
    project, _ = captured
    generated = _opcheck("generate", cwd=project)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    ran = _run(
        "pytest", "generated_tests", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", *NO_HYPOTHESIS, cwd=project
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert " passed" in ran.stdout and "failed" not in ran.stdout


def _as_mutant(text: str, name: str) -> str:
    """A spec's text testing the tail-tile mutant instead of the example's op."""
    lines = []
    for line in text.splitlines():
        if line.startswith("op:"):
            line = f"op: torch.ops.opcheck_mutants.rms_norm_tail\nname: {name}"
        elif line.startswith("imports:"):
            line = "imports: [tests.capture.mutants]"
        elif line.startswith("library_opcheck:"):
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_a_tail_tile_mutant_fails_the_captured_sample_and_passes_the_toy_one(captured, tmp_path):
    project, _ = captured
    (tmp_path / "pyproject.toml").write_text("[tool.opcheck]\n", encoding="utf-8")
    specs = tmp_path / "op_specs"
    specs.mkdir()
    captured_text = (project / "op_specs" / "rms_norm.yaml").read_text(encoding="utf-8")
    (specs / "captured.yaml").write_text(_as_mutant(captured_text, "captured_mutant"), encoding="utf-8")
    (specs / "toy.yaml").write_text(_as_mutant(TOY_SPEC.read_text(encoding="utf-8"), "toy_mutant"), encoding="utf-8")
    generated = _opcheck("generate", cwd=tmp_path)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    ran = _run(
        "pytest",
        "generated_tests",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:warnings",
        *NO_HYPOTHESIS,
        "-k",
        "test_gradcheck",
        "-rf",
        cwd=tmp_path,
    )
    failed = {line.split(" ")[1].split("::")[0] for line in ran.stdout.splitlines() if line.startswith("FAILED")}
    assert failed == {"generated_tests/test_captured_mutant.py"}, ran.stdout[-3000:]
    assert "1 failed, 1 passed" in ran.stdout
