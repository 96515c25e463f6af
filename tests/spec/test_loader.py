"""Valid specs load into exactly the model they describe, with every location where it was written."""

import hashlib
from pathlib import Path

import pytest

from opcheck.spec import load_spec_text, load_specs
from opcheck.spec.build import derive_name
from opcheck.spec.model import (
    KNOWN_DEVICES,
    DtypeArg,
    GradcheckFlags,
    GradgradcheckFlags,
    Location,
    OpSpec,
    Rule,
    Sample,
    TensorArg,
    TensorListArg,
    ToleranceRule,
    TupleArg,
    Where,
)

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
VALID = HERE / "valid"
T = TensorArg


def _load(name: str) -> list[OpSpec]:
    return load_specs([VALID / name], root=ROOT)


def _sha(name: str) -> str:
    return hashlib.sha256((VALID / name).read_bytes()).hexdigest()


def test_format_example_loads_to_the_documented_model():
    [spec] = _load("softmax.yaml")
    assert spec == OpSpec(
        name="softmax",
        op="torch.nn.functional.softmax",
        source="tests/spec/valid/softmax.yaml",
        sha256=_sha("softmax.yaml"),
        samples=(
            Sample("rows", args=(T((3, 5)),), kwargs=(("dim", -1),)),
            Sample("noncontig_cols", args=(T((4, 6), noncontiguous=True, low=-3.0, high=3.0),), kwargs=(("dim", 0),)),
            Sample("scalar", args=(T(()),), kwargs=(("dim", 0),)),
        ),
        dtypes=("float64",),
        lowprec_dtypes=("float32", "bfloat16"),
        devices=("cpu", "cuda"),
        gradcheck=GradcheckFlags(fast_mode="auto", check_batched_grad=True, check_forward_ad=True),
        gradgradcheck=GradgradcheckFlags(check_fwd_over_rev=True),
        tolerances=(
            ToleranceRule(
                where=Where(device=("cuda",)), atol=1e-4, reason="cuDNN softmax accumulates in a different order"
            ),
        ),
        expected_failures=(
            Rule(
                where=Where(check=("gradgradcheck",), device=("mps",)),
                reason="second derivative not implemented on MPS",
            ),
        ),
    )
    # Locations are not part of equality; they are checked on their own.
    assert spec.location == Location("tests/spec/valid/softmax.yaml", 2, 1)
    assert [s.location.line for s in spec.samples] == [7, 10, 13]
    assert spec.tolerances[0].location == Location("tests/spec/valid/softmax.yaml", 23, 5)
    assert spec.expected_failures[0].location == Location("tests/spec/valid/softmax.yaml", 27, 5)


def test_family_merges_defaults_into_every_op():
    specs = _load("family.yaml")
    source, sha = "tests/spec/valid/family.yaml", _sha("family.yaml")
    vec = Sample("vec", args=(T((4,)),))
    skip_cuda = Rule(
        where=Where(device=("cuda",), check=("gradgradcheck", "fwgrad_bwgrad")),
        reason="no second derivative kernel on CUDA",
    )
    shared = dict(
        source=source,
        sha256=sha,
        dtypes=("float64", "complex128"),
        devices=("cpu", "cuda"),
        gradgradcheck=GradgradcheckFlags(check_batched_grad=True),
    )
    flags = GradcheckFlags(check_forward_ad=True, atol=1e-5, fast_mode="false")
    assert specs == [
        OpSpec(
            name="log_softmax",
            op="torch.nn.functional.log_softmax",
            **shared,
            samples=(
                Sample(
                    "rows",
                    args=(T((3, 5), low=-3.0, high=3.0, noncontiguous=True),),
                    kwargs=(("dim", -1), ("dtype", DtypeArg("float64"))),
                ),
            ),
            gradcheck=GradcheckFlags(check_forward_ad=True, atol=1e-5, fast_mode="true"),
            skips=(skip_cuda,),
        ),
        OpSpec(
            name="mul_tensor",
            op="torch.ops.aten.mul.Tensor",
            **shared,
            library_opcheck=True,
            samples=(
                Sample("by_tensor", args=(T((2, 3)), T((3,), requires_grad=False))),
                Sample("by_scalar", args=(T((2, 3)), 2.5)),
            ),
            gradcheck=flags,
            skips=(skip_cuda,),
        ),
        OpSpec(
            name="square_apply",
            op="opcheck_spec_fixture:Square.apply",
            **shared,
            samples=(vec,),
            gradcheck=flags,
            skips=(skip_cuda,),
            tolerances=(
                ToleranceRule(
                    where=Where(sample=("vec",), dtype=("complex128",)), rtol=1e-3, reason="complex accumulation"
                ),
            ),
            expected_failures=(Rule(where=Where(check=("forward_ad",)), reason="Square has no jvp"),),
        ),
        OpSpec(
            name="tensor_sum",
            op="torch.Tensor.sum",
            variant="method",
            **shared,
            samples=(vec,),
            gradcheck=flags,
            skips=(),
        ),
    ]


def test_family_locations_point_where_each_part_was_written():
    log_softmax, mul, square, tensor_sum = _load("family.yaml")
    assert [s.location.line for s in (log_softmax, mul, square, tensor_sum)] == [15, 21, 28, 37]
    # A merged-in skip and an aliased sample keep the location of what was written in `defaults`.
    assert mul.skips[0].location.line == 12
    assert (
        square.samples[0].location == tensor_sum.samples[0].location == Location("tests/spec/valid/family.yaml", 9, 7)
    )


def test_every_argument_kind_and_maker():
    [spec] = _load("kitchen_sink.yaml")
    tensor_list, literals, makers, special, generated, opinfo = spec.samples
    assert tensor_list == Sample(
        "tensor_list",
        args=(TensorListArg((T((2, 3)), T((2, 3), dtype="float32", requires_grad=False))),),
        kwargs=(("dim", 0), ("out", None)),
    )
    # A literal list is a plain tuple in the model (hashable); the runtime passes it as a list.
    assert literals.args == (
        T((2,)),
        (1, 2),
        TupleArg((1, T((1,)), (3, 4))),
        DtypeArg("int64"),
        "mean",
        True,
        None,
        1.5e-3,
        float("inf"),
        "010",
    )
    assert makers.args == tuple(
        T(shape, maker=m)
        for shape, m in [
            ((3,), "positive"),
            ((3, 3), "symmetric"),
            ((3, 3), "spd"),
            ((2, 3, 3), "lower_triangular"),
            ((3, 3), "upper_triangular"),
            ((4,), "unit_norm"),
            ((3, 3), "orthogonal"),
        ]
    )
    assert special == Sample(
        "special.values",
        args=(
            T((2, 2), values=((1, 2), (3, 4.5))),
            T((), values=0.5),
            T((3,), dtype="int64", low=0.0, high=3.0),
            T((2,), dtype="bool", values=(True, False)),
            T((5,), avoid=(0.0, 1.0), margin=0.2),
            T((0, 3)),
        ),
    )
    assert generated == Sample("from_generator", generator="opcheck_spec_fixture:small_inputs")
    assert opinfo == Sample("from_opinfo", opinfo="nn.functional.softmax:with_dtype")
    assert spec.tolerances == (
        ToleranceRule(where=Where(dtype=("float32",), check=("lowprec",)), atol=1e-3, rtol=0.0),
        ToleranceRule(
            where=Where(device=("cuda", "xpu"), sample=("makers", "special.values")), eps=1e-7, nondet_tol=1e-12
        ),
    )
    assert spec.skips == (Rule(where=Where(device=("mps",), dtype=("float64",)), reason="MPS has no float64"),)
    assert spec.devices == KNOWN_DEVICES and spec.lowprec_dtypes == ("float32",)


def test_models_are_hashable_and_hold_no_lists():
    specs = load_specs([VALID], root=ROOT)
    assert len({hash(spec) for spec in specs}) == len(specs) == 6

    def no_lists(value):
        assert not isinstance(value, (list, dict)), value
        if isinstance(value, tuple):
            for item in value:
                no_lists(item)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                no_lists(getattr(value, name))

    for spec in specs:
        no_lists(spec)


def test_directory_means_its_yaml_files_sorted_and_each_file_once():
    specs = load_specs([VALID, VALID / "softmax.yaml"], root=ROOT)
    assert [s.name for s in specs] == [
        "log_softmax",
        "mul_tensor",
        "square_apply",
        "tensor_sum",
        "kitchen_sink",
        "softmax",
    ]
    assert {s.source for s in specs} == {
        f"tests/spec/valid/{n}" for n in ("family.yaml", "kitchen_sink.yaml", "softmax.yaml")
    }


def test_sources_are_relative_to_root(tmp_path):
    (tmp_path / "op_specs").mkdir()
    spec_file = tmp_path / "op_specs" / "sin.yml"
    spec_file.write_text("op: torch.sin\nsamples: [{name: a, args: [{shape: [2]}]}]\n")
    [spec] = load_specs([tmp_path / "op_specs"], root=tmp_path)
    assert spec.source == "op_specs/sin.yml"
    assert spec.location == Location("op_specs/sin.yml", 1, 1)
    assert spec.sha256 == hashlib.sha256(spec_file.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "op, name",
    [
        ("torch.nn.functional.softmax", "softmax"),
        ("torch.ops.aten.mul.Tensor", "mul_tensor"),
        ("torch.ops.aten.sin.default", "sin"),
        ("torch.ops.aten.sin", "sin"),
        ("examples.ops:Square.apply", "square_apply"),
        ("torch.Tensor.__rmul__", "rmul"),
        ("torch.linalg.matrix_norm", "matrix_norm"),
    ],
)
def test_derived_names(op, name):
    assert derive_name(op) == name


def test_yaml_1_2_scalars_and_explicit_tags():
    text = """
op: torch.sin
samples:
  - name: a
    args: [{shape: [010]}, 1e-4, 0x10, 0o17, no, on, 2024-01-01, .NaN, -.inf, ~, !!str 12, !!float 3]
"""
    [spec] = load_spec_text(text, source="s.yaml")
    tensor, small, hexa, octal, no, on, date, nan, minus_inf, null, text12, three = spec.samples[0].args
    assert tensor == T((10,))
    assert (small, hexa, octal) == (1e-4, 16, 15) and isinstance(small, float)
    assert (no, on, date) == ("no", "on", "2024-01-01")
    assert nan != nan and minus_inf == float("-inf") and null is None
    assert (text12, three) == ("12", 3.0) and isinstance(three, float)


def test_kwargs_keep_file_order_and_tolerance_numbers_are_floats():
    text = """
op: torch.sum
samples: [{name: a, args: [{shape: [2, 3]}], kwargs: {keepdim: true, dim: 1, dtype: {dtype: float64}}}]
gradcheck: {eps: 1e-6, atol: 0, nondet_tol: 1}
"""
    [spec] = load_spec_text(text, source="s.yaml")
    assert spec.samples[0].kwargs == (("keepdim", True), ("dim", 1), ("dtype", DtypeArg("float64")))
    assert spec.gradcheck == GradcheckFlags(eps=1e-6, atol=0.0, nondet_tol=1.0)
    assert all(isinstance(x, float) for x in (spec.gradcheck.eps, spec.gradcheck.atol, spec.gradcheck.nondet_tol))


def test_merge_keys_and_anchors_inside_one_spec():
    text = """
op: torch.add
samples:
  - &base {name: a, args: [{shape: [2], low: 1}, {shape: [2]}]}
  - <<: *base
    name: b
  - name: c
    args: [{<<: {shape: [3], low: -1}, high: 5}]
"""
    [spec] = load_spec_text(text, source="s.yaml")
    a, b, c = spec.samples
    assert b == Sample("b", args=a.args)
    assert c.args == (T((3,), low=-1.0, high=5.0),)
    assert (a.location.line, b.location.line, c.location.line) == (4, 5, 7)


def test_gradcheck_fast_mode_spellings():
    def mode(value: str) -> str:
        text = f"op: torch.sin\nsamples: [{{name: a, args: [{{shape: [1]}}]}}]\ngradcheck: {{fast_mode: {value}}}\n"
        return load_spec_text(text, source="s.yaml")[0].gradcheck.fast_mode

    assert [mode(v) for v in ("auto", "true", "false", "True")] == ["auto", "true", "false", "true"]
