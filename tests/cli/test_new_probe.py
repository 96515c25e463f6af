"""`opcheck new --shape`: the op is probed at the user's shapes and the spec says what it found."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from opcheck import cli
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]

OPS = '''
import numpy
import torch


def softmax32(x):
    """Computes in float32 whatever it is given, as a Triton kernel does."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def softmax32_reference(x):
    return torch.softmax(x, dim=-1)


def no_float64(x):
    if x.dtype == torch.float64:
        raise TypeError("float64 is not supported")
    return x.sin()


def last_dim_mix(x):
    """Needs a [B, T, D] tensor: [3, 3] fails."""
    b, t, d = x.shape
    return (x @ torch.ones(d, 2, dtype=x.dtype)).sin()


def writes_input(x):
    y = x.sin()
    x.detach().add_(1.0)
    return y


class HostBackward(torch.autograd.Function):
    """A backward that leaves torch (as a kernel launch does): no vmap rule, no double backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        out = torch.empty_like(grad)
        out.copy_(torch.from_numpy(grad.detach().numpy() * numpy.cos(x.detach().numpy())))
        return out


class ScalesGradOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad.mul_(x.cos())
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / ".git").mkdir()
    (tmp_path / "new_probe_ops.py").write_text(OPS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("new_probe_ops", None)
    return tmp_path


def new(project: Path, name: str, op: str, *shapes: str) -> str:
    args = ["new", name, "--op", f"new_probe_ops:{op}"]
    for shape in shapes:
        args += ["--shape", shape]
    assert cli.main(args) == 0
    return (project / "op_specs" / f"{name}.yaml").read_text()


def keys(text: str) -> list[str]:
    """The spec's lines that are not comments, without their comments."""
    return [
        line.split(" #")[0].rstrip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def test_an_op_that_computes_in_float32_gets_a_lowprec_spec_with_its_reference(project, capsys):
    text = new(project, "softmax32", "softmax32", "2,7,33")
    assert "dtypes: []" in keys(text)
    assert re.search(r"\ndtypes: \[\] +# no float64 gradient check: it computes in float32 \(its float64 outputs", text)
    assert "lowprec_dtypes: [float32, bfloat16, float16]" in keys(text)
    assert "reference: new_probe_ops:softmax32_reference" in keys(text)  # found beside the op
    assert "args: [{shape: [2, 7, 33]}]" in text
    assert cli.main(["validate"]) == 0, capsys.readouterr().err


def test_an_op_that_refuses_float64_gets_a_reference_to_fill_in(project):
    text = new(project, "no_float64", "no_float64", "4,5")
    assert "dtypes: []" in keys(text)
    assert "it refuses float64 (TypeError: float64 is not supported)" in text
    assert re.search(r"\nreference: new_probe_ops:no_float64_reference +# fill in: ", text)


def test_the_shapes_given_are_the_sample_and_a_plain_float64_op_gets_no_flags(project):
    assert "could not call" in new(project, "mix3", "last_dim_mix")  # [3, 3] tensors do not fit
    text = new(project, "mix", "last_dim_mix", "2,7,33")
    assert "args: [{shape: [2, 7, 33]}]" in text and "could not call" not in text
    for key in ("dtypes:", "supports_gradgrad:", "supports_forward_ad:", "clone_inputs:", "writes_grad_outputs:"):
        assert not any(line.startswith(key) for line in keys(text)), key
    assert "  check_batched_grad: true" in keys(text)


def test_two_tensor_arguments_and_a_shape_that_does_not_fit(project):
    text = new(project, "hypot", "softmax32", "2,3", "3")  # softmax32 takes one tensor: nothing runs
    assert "could not call new_probe_ops:softmax32 with tensors of shape [2, 3], [3], in float64 or lower" in text
    assert "dtypes: []" not in keys(text)


def test_a_function_without_vmap_rule_or_double_backward_says_so_and_its_tests_pass(project):
    text = new(project, "host", "HostBackward.apply", "2,7,3")
    assert "  check_batched_grad: false" in keys(text)
    assert re.search(r"check_batched_grad: false +# vmap over its backward raises: no vmap rule", text)
    assert "supports_gradgrad: false" in keys(text) and "supports_forward_ad: false" in keys(text)
    assert "compile: true" in keys(text)  # an autograd.Function: the compile check is on
    assert cli.main(["generate"]) == 0
    # forked with torch imported (tests/forked_python.py); the tests run in the fresh process
    # pytest's supervisor starts
    run = forked_python.run(
        "pytest",
        *["-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "generated_tests", "--opcheck-device", "cpu"],
        cwd=project,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(project)])),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def test_writes_into_inputs_and_grad_outputs_are_declared(project):
    text = new(project, "writer", "writes_input", "5")
    assert "clone_inputs: true" in keys(text) and "it writes into args[0]" in text
    text = new(project, "scales", "ScalesGradOutput.apply", "5")
    assert "writes_grad_outputs: true" in keys(text)


def test_a_bad_shape_is_one_line(project, capsys):
    assert cli.main(["new", "x", "--op", "new_probe_ops:softmax32", "--shape", "2,x"]) == 1
    assert (
        capsys.readouterr().err.strip() == "opcheck new: --shape 2,x: expected sizes separated by commas, e.g. 2,7,33"
    )


WRITTEN = """\
op: new_probe_ops:softmax32
name: {name}
devices: [cpu]
samples:
  - name: btd
    args: [{{shape: [2, 7, 33], low: -3, high: 3, noncontiguous: true}}]
"""


def test_sample_probes_at_a_sample_already_written_and_copies_it(project, capsys):
    (project / "op_specs").mkdir()
    (project / "op_specs" / "first.yaml").write_text(WRITTEN.format(name="first"))
    assert cli.main(["new", "again", "--op", "new_probe_ops:softmax32", "--sample", "btd"]) == 0
    text = (project / "op_specs" / "again.yaml").read_text()
    assert "args: [{shape: [2, 7, 33], low: -3.0, high: 3.0, noncontiguous: true}]" in text
    assert "dtypes: []" in keys(text)  # probed at that sample: float32 inside
    # the spec being rewritten is read first
    assert cli.main(["new", "first", "--op", "new_probe_ops:softmax32", "--sample", "btd", "--force"]) == 0
    assert "dtypes: []" in keys((project / "op_specs" / "first.yaml").read_text())
    capsys.readouterr()
    assert cli.main(["new", "x", "--op", "new_probe_ops:softmax32", "--sample", "nope"]) == 1
    assert "--sample nope: no valid spec in op_specs for new_probe_ops:softmax32" in capsys.readouterr().err
    assert cli.main(["new", "x", "--op", "new_probe_ops:softmax32", "--sample", "btd", "--shape", "3"]) == 1
    assert "--shape and --sample both give the sample" in capsys.readouterr().err
