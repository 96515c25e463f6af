"""`values_file:` at run time: the file's exact values at the test's dtype, read from the project
root, checked again against the spec, cached per process without sharing a tensor between tests."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

from opcheck.codegen import apply_plan, plan_generation
from opcheck.runtime import CheckCrashed, CheckFailed, run_check
from opcheck.runtime import file_values as fv
from opcheck.runtime.cost.estimate import estimate_spec
from opcheck.runtime.makers import SampleError
from opcheck.runtime.project_root import project_root, set_project_root
from opcheck.runtime.samples import build_calls, is_random
from opcheck.spec import load_specs
from opcheck.spec import values_file as spec_values_file
from opcheck.spec.model import GradcheckFlags, Location, OpSpec, Sample, TensorArg

SOURCE = "op_specs/x.yaml"
# A mask-like input: its middle row is all off (exactly 0.0), a value uniform draws never hit.
ROWS = torch.tensor([[0.5, -1.25, 1.5, 0.75], [0.0, 0.0, 0.0, 0.0], [-0.5, 1.0, -1.75, 0.25]], dtype=torch.float32)


@pytest.fixture
def project(tmp_path: Path):
    """A project root with op_specs/values/; the runtime reads values files from it."""
    (tmp_path / "op_specs" / "values").mkdir(parents=True)
    set_project_root(tmp_path)
    fv.clear_cache()
    yield tmp_path
    set_project_root(None)
    fv.clear_cache()


def _save(root: Path, name: str, obj) -> str:
    """torch.save `obj` as op_specs/values/<name>; its path relative to the project root."""
    path = f"op_specs/values/{name}"
    torch.save(obj, root / path)
    return path


def _spec(*samples: Sample, op: str = "torch.sin", **fields) -> OpSpec:
    return OpSpec(name="x", op=op, source=SOURCE, sha256="0", samples=samples, devices=("cpu",), **fields)


def _tensors(spec: OpSpec, sample: str, dtype: str = "float64", seed: int = 1) -> list[torch.Tensor]:
    (call,) = build_calls(spec, spec.sample(sample), "cpu", dtype, seed)
    return list(call.args)


def test_the_values_are_the_files_upcast_for_gradient_checks_and_as_saved_at_low_precision(project):
    path = _save(project, "rows.pt", ROWS + 0.1)  # 0.1 is not a float32: the upcast keeps float32's value
    spec = _spec(Sample("file", args=(TensorArg(shape=(3, 4), values_file=path),)))
    (x64,) = _tensors(spec, "file", "float64")
    assert x64.dtype == torch.float64 and x64.requires_grad and x64.is_contiguous()
    assert torch.equal(x64.detach(), (ROWS + 0.1).double())
    (x32,) = _tensors(spec, "file", "float32")
    assert x32.dtype == torch.float32 and torch.equal(x32.detach(), ROWS + 0.1)


def test_a_dict_entry_noncontiguous_and_an_integer_tensor(project):
    path = _save(project, "sample.pt", {"args.0": ROWS, "args.1": torch.tensor([2, 0, 1])})
    spec = _spec(
        Sample(
            "s",
            args=(
                TensorArg(shape=(3, 4), values_file=path, values_key="args.0", noncontiguous=True),
                TensorArg(shape=(3,), dtype="int64", values_file=path, values_key="args.1"),
            ),
        )
    )
    x, index = _tensors(spec, "s")
    assert not x.is_contiguous() and torch.equal(x.detach(), ROWS.double())
    assert index.dtype == torch.int64 and not index.requires_grad and index.tolist() == [2, 0, 1]


def test_a_file_draws_no_random_numbers(project):
    path = _save(project, "rows.pt", ROWS)
    drawn = TensorArg(shape=(5,))
    from_file = _spec(Sample("s", args=(TensorArg(shape=(3, 4), values_file=path), drawn)))
    explicit = _spec(Sample("s", args=(TensorArg(shape=(3, 4), values=tuple(map(tuple, ROWS.tolist()))), drawn)))
    assert torch.equal(_tensors(from_file, "s")[1], _tensors(explicit, "s")[1])
    assert is_random(from_file.sample("s"))  # its drawn tensor
    assert not is_random(Sample("f", args=(TensorArg(shape=(3, 4), values_file=path),), kwargs=(("k", 1),)))


def test_a_backward_wrong_only_at_the_files_values_fails_there_and_passes_on_random_values(project):
    path = _save(project, "rows.pt", ROWS)
    spec = _spec(
        Sample("file", args=(TensorArg(shape=(3, 4), values_file=path),), location=Location(SOURCE, 5, 5)),
        Sample("drawn", args=(TensorArg(shape=(3, 4)),), location=Location(SOURCE, 7, 5)),
        op="runtime_ops:square_wrong_at_zero",
    )
    run_check(spec, "gradcheck", "cpu", "float64", "drawn")
    with pytest.raises(CheckFailed) as failure:
        run_check(spec, "gradcheck", "cpu", "float64", "file")
    assert f"values from {path}" in str(failure.value)


def test_a_low_precision_test_reads_a_float32_file(project):
    path = _save(project, "rows.pt", ROWS + 0.1)
    spec = _spec(
        Sample("file", args=(TensorArg(shape=(3, 4), values_file=path),), location=Location(SOURCE, 5, 5)),
        lowprec_dtypes=("float32",),
    )
    run_check(spec, "lowprec", "cpu", "float32", "file")
    (x,) = _tensors(spec, "file", "float32")
    assert torch.equal(x.detach(), ROWS + 0.1)


def test_a_file_that_changed_since_validation_is_a_sample_error_naming_it(project):
    (project / "op_specs" / "x.yaml").write_text(
        "op: torch.sin\nsamples:\n  - name: file\n    args: [{shape: [3, 4], values_file: values/rows.pt}]\n"
    )
    _save(project, "rows.pt", ROWS)
    (spec,) = load_specs([project / "op_specs"], root=project)
    assert spec.samples[0].args[0].values_file == "op_specs/values/rows.pt"
    _save(project, "rows.pt", torch.zeros(4, 3))  # the file changed after generation
    with pytest.raises(SampleError, match=r"values_file op_specs/values/rows.pt: it has shape \[4, 3\], but `shape`"):
        _tensors(spec, "file")
    with pytest.raises(CheckCrashed) as crash:
        run_check(spec, "gradcheck", "cpu", "float64", "file")
    text = str(crash.value)
    assert "opcheck could not build sample 'file'" in text and "sample:  'file' at op_specs/x.yaml:3:5" in text
    assert "SampleError: args[0]: values_file op_specs/values/rows.pt: it has shape [4, 3]" in text
    _save(project, "rows.pt", ROWS.int())
    with pytest.raises(SampleError, match="it holds int32 values; without `dtype`"):
        _tensors(spec, "file")
    os.remove(project / "op_specs" / "values" / "rows.pt")
    with pytest.raises(SampleError, match=r"values_file op_specs/values/rows.pt: no such file \(relative to the"):
        _tensors(spec, "file")


def test_complex_values_in_a_test_of_a_real_dtype_are_refused(project):
    path = _save(project, "z.pt", torch.ones(3, dtype=torch.complex64))
    spec = _spec(Sample("z", args=(TensorArg(shape=(3,), values_file=path),)))
    assert _tensors(spec, "z", "complex128")[0].dtype == torch.complex128
    with pytest.raises(SampleError, match="holds complex values, and this test's dtype is float64"):
        _tensors(spec, "z", "float64")


def test_the_cache_reads_a_file_once_and_never_hands_out_a_tensor_a_test_changed(project, monkeypatch):
    path = _save(project, "rows.pt", ROWS)
    reads = []
    real_read = spec_values_file.read
    monkeypatch.setattr(spec_values_file, "read", lambda root, p: reads.append(p) or real_read(root, p))
    spec = _spec(Sample("s", args=(TensorArg(shape=(3, 4), values_file=path),)))
    (first,) = _tensors(spec, "s", "float32")
    with torch.no_grad():
        first.fill_(7.0)  # a kernel writing into its input
    (second,) = _tensors(spec, "s", "float32")
    assert torch.equal(second.detach(), ROWS) and reads == [path]
    stat = os.stat(project / path)
    _save(project, "rows.pt", ROWS * 2)
    os.utime(project / path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # coarse clocks: a new mtime
    (third,) = _tensors(spec, "s", "float32")
    assert torch.equal(third.detach(), ROWS * 2) and reads == [path, path]


def test_the_project_root_is_the_working_directory_until_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    set_project_root(None)
    assert project_root() == Path.cwd()
    set_project_root(tmp_path / "a" / ".." / "b")
    try:
        assert project_root() == tmp_path / "b"
    finally:
        set_project_root(None)


def test_the_cost_probe_builds_samples_from_files(project):
    path = _save(project, "rows.pt", ROWS)
    spec = _spec(
        Sample("file", args=(TensorArg(shape=(3, 4), values_file=path),), location=Location(SOURCE, 5, 5)),
        gradcheck=GradcheckFlags(check_forward_ad=True),
    )
    estimates = estimate_spec(spec, devices=["cpu"])
    assert estimates and all(e.skipped is None and e.calls.total > 0 for e in estimates), estimates


def test_a_generated_module_runs_at_the_files_values_from_any_folder(pytester, monkeypatch):
    """Generated as a user would, run by pytest from the folder above the project: the plugin finds
    the project root from the spec's path, and the file's sample fails where the drawn one passes."""
    root = pytester.path / "proj"
    (root / "op_specs" / "values").mkdir(parents=True)
    torch.save({"args.0": ROWS}, root / "op_specs" / "values" / "rows.pt")
    (root / "op_specs" / "x.yaml").write_text(
        textwrap.dedent(
            """\
            op: runtime_ops:square_wrong_at_zero
            devices: [cpu]
            gradgradcheck: {enabled: false}
            samples:
              - name: file
                args: [{shape: [3, 4], values_file: values/rows.pt, values_key: args.0}]
              - name: drawn
                args: [{shape: [3, 4]}]
            """
        )
    )
    specs = load_specs([root / "op_specs"], root=root)
    apply_plan(plan_generation(specs, root / "generated_tests"))
    assert (
        'values_file="op_specs/values/rows.pt", values_key="args.0"'
        in (root / "generated_tests" / "test_square_wrong_at_zero.py").read_text()
    )
    set_project_root(None)
    fv.clear_cache()
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "-q", "proj/generated_tests")
    finally:
        set_project_root(None)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAILED*test_gradcheck?cpu-float64-file?*"])
    out = result.stdout.str()
    assert "could not build sample" not in out and "values from op_specs/values/rows.pt['args.0']" in out
