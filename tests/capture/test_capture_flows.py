"""`opcheck capture` end to end: each kind of command and of `--op`, and the options, each run as a
user runs it (`python -m opcheck capture ... -- COMMAND`) in a scratch project of its own."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from opcheck.spec import load_specs
from tests.capture.scratch import capture, opcheck, project, python, shown


def spec_data(tmp: Path, name: str) -> dict:
    return yaml.safe_load((tmp / "op_specs" / f"{name}.yaml").read_text(encoding="utf-8"))


def sample_names(tmp: Path, name: str) -> list[str]:
    return [s["name"] for s in spec_data(tmp, name)["samples"]]


def line_of(tmp: Path, file: str, needle: str) -> int:
    lines = (tmp / file).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def comments_of(text: str, sample: str) -> list[str]:
    """The comment lines right above `- name: SAMPLE`."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == f"- name: {sample}")
    out = []
    while at > 0 and lines[at - 1].lstrip().startswith("#"):
        at -= 1
        out.insert(0, lines[at].strip())
    return out


GELU_TWO_SHAPES = """
    import torch
    import torch.nn.functional as F

    x = torch.randn(4, 7)
    for _ in range(3):
        F.gelu(x)  # the frequent call
    F.gelu(torch.randn(2, 13, 96))  # the big one
"""

# The user's module: the spec tests' Square (an autograd.Function), and two plain functions.
MODULES = {
    "mypkg/__init__.py": "",
    "mypkg/mod.py": (Path(__file__).parents[1] / "spec" / "opcheck_spec_fixture.py").read_text(encoding="utf-8")
    + """


def fn(x, scale):
    return x * scale


def takes_module(module, x):
    return module(x)
""",
}


# ------------------------------------------------------------------------------ command forms
def test_script_records_two_shapes_and_the_generated_tests_pass(tmp_path):
    tmp = project(tmp_path, {"model.py": GELU_TWO_SHAPES})
    result = capture(tmp, ["torch.nn.functional.gelu"], ["python", "model.py"])
    assert result.returncode == 0, shown(result)
    assert "wrote op_specs/gelu.yaml: 4x7, 2x13x96" in result.stdout
    assert "4 call(s), 2 distinct" in result.stdout

    (spec,) = load_specs([tmp / "op_specs"], root=tmp)
    assert spec.op == "torch.nn.functional.gelu"
    assert [s.name for s in spec.samples] == ["4x7", "2x13x96"]
    assert [s.args[0].shape for s in spec.samples] == [(4, 7), (2, 13, 96)]
    text = (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8")
    frequent, big = line_of(tmp, "model.py", "the frequent call"), line_of(tmp, "model.py", "the big one")
    assert any(f"3 calls, first at model.py:{frequent} (<module>)" in c for c in comments_of(text, "4x7")), text
    assert any(f"1 call, first at model.py:{big} (<module>)" in c for c in comments_of(text, "2x13x96")), text

    generated = opcheck(tmp, "generate", "--specs", "op_specs", "--out", "gen")
    assert generated.returncode == 0, shown(generated)
    assert (tmp / "gen" / "test_gelu.py").is_file()
    tests = python(tmp, "-m", "pytest", "gen", "-q", "-p", "no:cacheprovider")
    assert tests.returncode == 0, shown(tests)
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_module_mode_records(tmp_path):
    tmp = project(
        tmp_path,
        {
            "mypkg/__init__.py": "",
            "mypkg/run.py": """
                import torch
                import torch.nn.functional as F

                if __name__ == "__main__":
                    F.gelu(torch.randn(3, 5))
            """,
        },
    )
    result = capture(tmp, ["torch.nn.functional.gelu"], ["python", "-m", "mypkg.run"])
    assert result.returncode == 0, shown(result)
    assert sample_names(tmp, "gelu") == ["3x5"]
    text = (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8")
    assert f"mypkg/run.py:{line_of(tmp, 'mypkg/run.py', 'F.gelu')}" in text


def test_pytest_mode_records_the_tests_calls(tmp_path):
    tmp = project(
        tmp_path,
        {
            "test_x.py": """
                import torch
                import torch.nn.functional as F


                def test_gelu():
                    F.gelu(torch.randn(5, 6))
            """
        },
    )
    result = capture(tmp, ["torch.nn.functional.gelu"], ["pytest", "test_x.py", "-q", "-p", "no:cacheprovider"])
    assert result.returncode == 0, shown(result)
    assert "1 passed" in result.stdout  # the user's pytest output
    assert "exited with status 0" in result.stdout
    assert sample_names(tmp, "gelu") == ["5x6"]
    text = (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8")
    # The project's folder (this test's tmp_path) has `_pytest` in its name: still the user's code.
    assert "_pytest" in str(tmp)
    assert f"test_x.py:{line_of(tmp, 'test_x.py', 'F.gelu')} (test_gelu)" in text


def test_pytest_with_xdist_is_refused(tmp_path):
    tmp = project(tmp_path, {"test_x.py": "def test_nothing():\n    pass\n"})
    result = capture(tmp, ["torch.nn.functional.gelu"], ["pytest", "-n", "2", "test_x.py"])
    assert result.returncode == 2, shown(result)
    assert "xdist" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp / "op_specs").exists()


# ------------------------------------------------------------------------------ kinds of --op
def _digests(tmp: Path) -> dict[str, str]:
    """The user's files (not what capture writes, nor Python's caches), by content."""
    return {
        p.relative_to(tmp).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in tmp.rglob("*")
        if p.is_file() and "op_specs" not in p.parts and "__pycache__" not in p.parts
    }


def test_python_callable_and_autograd_function_by_path(tmp_path):
    tmp = project(
        tmp_path,
        {
            **MODULES,
            "use.py": """
                import torch
                from mypkg.mod import fn, Square

                x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
                y = fn(x, 2.0)
                z = Square.apply(x)
                (y.sum() + z.sum()).backward()
            """,
        },
    )
    before = _digests(tmp)
    result = capture(tmp, ["mypkg.mod:fn", "mypkg.mod:Square.apply"], ["python", "use.py"])
    assert result.returncode == 0, shown(result)
    assert _digests(tmp) == before  # nothing of the user's changed (the patches are in memory)

    fn, square = spec_data(tmp, "fn"), spec_data(tmp, "square_apply")
    assert fn["op"] == "mypkg.mod:fn"
    assert square["op"] == "mypkg.mod:Square.apply"
    assert [s["name"] for s in fn["samples"]] == ["3x4"]
    assert fn["samples"][0]["args"][0]["shape"] == [3, 4]
    assert fn["samples"][0]["args"][1] == 2.0
    assert [s["name"] for s in square["samples"]] == ["3x4"]
    assert "mypkg.mod:fn: 1 call(s), 1 distinct" in result.stdout
    assert "mypkg.mod:Square.apply: 1 call(s), 1 distinct" in result.stdout
    assert "FutureWarning" not in result.stderr  # the patching scans modules without tripping their warnings


def test_custom_op_by_namespace(tmp_path):
    tmp = project(
        tmp_path,
        {
            "mypkg/__init__.py": "",
            "mypkg/lib.py": """
                import torch


                @torch.library.custom_op("capt::scale", mutates_args=())
                def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
                    return x * factor


                def _setup(ctx, inputs, output):
                    ctx.factor = inputs[1]


                def _backward(ctx, grad):
                    return grad * ctx.factor, None


                scale.register_autograd(_backward, setup_context=_setup)
            """,
            "run_lib.py": """
                import torch
                from mypkg.lib import scale

                x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
                scale(x, 2.0).sum().backward()
                torch.ops.capt.scale(torch.randn(2, 5), 0.5)
            """,
        },
    )
    result = capture(tmp, ["torch.ops.capt"], ["python", "run_lib.py"])
    assert result.returncode == 0, shown(result)
    data = spec_data(tmp, "scale")
    assert data["op"] == "torch.ops.capt.scale"
    assert data["imports"] == ["mypkg.lib"]
    assert sorted(s["name"] for s in data["samples"]) == ["2x5", "3x8"]


def test_aten_op_records_forward_calls_and_counts_the_backward_ones(tmp_path):
    tmp = project(
        tmp_path,
        {
            "mm.py": """
                import torch

                x = torch.randn(4, 6, requires_grad=True)
                w = torch.randn(6, 3, requires_grad=True)
                (x @ w).sum().backward()
            """
        },
    )
    result = capture(tmp, ["aten.mm"], ["python", "mm.py"])
    assert result.returncode == 0, shown(result)
    data = spec_data(tmp, "mm")
    assert data["op"] == "torch.ops.aten.mm"
    # The backward's mm calls (4x3 @ 3x6, 6x4 @ 4x3) are not samples, only a note.
    assert [s["name"] for s in data["samples"]] == ["4x6_6x3"]
    assert "torch.ops.aten.mm: 1 call(s), 1 distinct" in result.stdout
    assert "note: 2 call(s) inside backward passes (derivatives) not recorded" in result.stdout


def test_unwritable_argument_is_reported_and_nothing_recorded_writes_nothing(tmp_path):
    tmp = project(
        tmp_path,
        {
            **MODULES,
            "use.py": """
                import torch
                from mypkg.mod import takes_module

                takes_module(torch.nn.Identity(), torch.randn(2, 3))
            """,
        },
    )
    result = capture(tmp, ["mypkg.mod:takes_module", "torch.nn.functional.silu"], ["python", "use.py"])
    assert result.returncode == 1, shown(result)
    assert "mypkg.mod:takes_module: 1 call(s), 0 distinct" in result.stdout
    assert (
        "note: 1 call(s) not recorded: an argument a spec cannot write: torch.nn.modules.linear.Identity"
        in result.stdout
    )
    assert "torch.nn.functional.silu: no call recorded" in result.stdout
    assert result.stdout.rstrip().endswith("nothing written")
    assert list((tmp / "op_specs").glob("*.yaml")) == []


# ------------------------------------------------------------------------------ options
def _tree(tmp: Path) -> set[str]:
    return {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if "__pycache__" not in p.parts}


def test_values_saves_each_samples_tensors_beside_the_spec(tmp_path):
    tmp = project(
        tmp_path,
        {
            "vals.py": """
                import torch
                import torch.nn.functional as F

                F.gelu(torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10 - 0.5)
            """
        },
    )
    before = _tree(tmp)
    result = capture(tmp, ["torch.nn.functional.gelu"], ["python", "vals.py"], "--values")
    assert result.returncode == 0, shown(result)
    assert "values: op_specs/values/gelu/3x4.pt" in result.stdout
    assert _tree(tmp) - before == {  # nothing outside the specs folder
        "op_specs",
        "op_specs/gelu.yaml",
        "op_specs/values",
        "op_specs/values/gelu",
        "op_specs/values/gelu/3x4.pt",
    }
    (spec,) = load_specs([tmp / "op_specs"], root=tmp)
    (arg,) = spec.samples[0].args
    assert (arg.values_file, arg.values_key) == ("op_specs/values/gelu/3x4.pt", "args.0")
    saved = torch.load(tmp / arg.values_file, weights_only=True)
    expected = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10 - 0.5
    assert set(saved) == {"args.0"}
    assert saved["args.0"].dtype == torch.float32
    assert torch.equal(saved["args.0"], expected)


def test_values_structured_saves_only_tensors_with_structure(tmp_path):
    tmp = project(
        tmp_path,
        {
            "masked.py": """
                import torch

                mask = torch.ones(3, 4, dtype=torch.bool)
                mask[1] = False  # a row all off
                logits = torch.linspace(-1, 1, 12).reshape(3, 4)
                logits[:, 2] += 10  # a dominant class in every row
                plain = torch.linspace(-2, 3, 12).reshape(3, 4)
                torch.where(mask, logits, plain)
            """
        },
    )
    result = capture(tmp, ["torch.where"], ["python", "masked.py"], "--values", "structured")
    assert result.returncode == 0, shown(result)
    (spec,) = load_specs([tmp / "op_specs"], root=tmp)
    mask, logits, plain = spec.samples[0].args
    assert (mask.values_key, logits.values_key) == ("args.0", "args.1")
    assert mask.values_file == logits.values_file
    assert plain.values_file is None
    assert plain.low is not None and plain.high is not None and plain.low < plain.high
    saved = torch.load(tmp / mask.values_file, weights_only=True)
    assert set(saved) == {"args.0", "args.1"}
    expected_mask = torch.ones(3, 4, dtype=torch.bool)
    expected_mask[1] = False
    expected_logits = torch.linspace(-1, 1, 12).reshape(3, 4)
    expected_logits[:, 2] += 10
    assert torch.equal(saved["args.0"], expected_mask)
    assert torch.equal(saved["args.1"], expected_logits)


def test_reduce_writes_a_twin_with_tails_kept(tmp_path):
    tmp = project(
        tmp_path,
        {
            "big.py": """
                import torch
                import torch.nn.functional as F

                F.gelu(torch.linspace(-3, 3, 900).reshape(3, 300))
            """
        },
    )
    result = capture(tmp, ["torch.nn.functional.gelu"], ["python", "big.py"], "--reduce")
    assert result.returncode == 0, shown(result)
    data = spec_data(tmp, "gelu")
    assert [s["name"] for s in data["samples"]] == ["3x300", "3x172"]  # 300 -> 128 + 300 % 128
    assert data["samples"][1]["args"][0]["shape"] == [3, 172]
    text = (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8")
    assert any("reduced twin of 3x300" in c for c in comments_of(text, "3x172"))


def test_max_samples_keeps_one_and_names_the_dropped(tmp_path):
    tmp = project(tmp_path, {"model.py": GELU_TWO_SHAPES})
    result = capture(tmp, ["torch.nn.functional.gelu"], ["python", "model.py"], "--max-samples", "1")
    assert result.returncode == 0, shown(result)
    assert sample_names(tmp, "gelu") == ["4x7"]
    dropped = [line for line in result.stdout.splitlines() if line.strip().startswith("dropped:")]
    assert len(dropped) == 1
    assert "2x13x96" in dropped[0] and "past the cap of 1" in dropped[0]


def test_cost_estimate_is_a_comment(tmp_path):
    tmp = project(
        tmp_path,
        {
            "one.py": """
                import torch
                import torch.nn.functional as F

                F.gelu(torch.randn(4, 7))
            """
        },
    )
    result = capture(tmp, ["torch.nn.functional.gelu"], ["python", "one.py"], cost=True)
    assert result.returncode == 0, shown(result)
    text = (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8")
    costs = [c for c in comments_of(text, "4x7") if c.startswith("# estimated cost on this cpu:")]
    assert len(costs) == 1 and "gradcheck float64" in costs[0], text
    assert load_specs([tmp / "op_specs"], root=tmp)[0].samples[0].name == "4x7"


# ------------------------------------------------------------------------------ usage errors
@pytest.mark.parametrize(
    ("ops", "options", "command", "says"),
    [
        (["torch.nn.functional.gelu"], [], [], "no command"),
        (["torch.nn.functional.gelu"], [], ["bash", "run.sh"], "cannot run 'bash'"),
        (["torch.ops.aten"], [], ["python", "model.py"], "not the whole namespace"),
        (["torch.nn.functional.gelu"], ["--specs", "some.yaml"], ["python", "model.py"], "expected the folder"),
    ],
    ids=["no-command", "bash", "aten-namespace", "specs-file"],
)
def test_usage_errors(tmp_path, ops, options, command, says):
    tmp = project(tmp_path, {"model.py": GELU_TWO_SHAPES, "run.sh": "python model.py\n"})
    result = capture(tmp, ops, command, *options)
    assert result.returncode == 2, shown(result)
    assert says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp / "op_specs").exists() and not (tmp / "some.yaml").exists()
