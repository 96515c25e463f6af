"""The model's fixed sets: enums that read, compare and hash as their plain names."""

import pickle
from pathlib import Path

import pytest

from opcheck.spec import model
from opcheck.spec.model import Check, Device, Dtype, FastMode, LowprecCriterion, OpSpec, Sample, TensorArg

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_sets_keep_their_names_and_order():
    # Ids, schema enums, report columns and the generated modules spell these; renaming one breaks them.
    assert model.CHECKS == (
        "gradcheck",
        "forward_ad",
        "gradgradcheck",
        "fwgrad_bwgrad",
        "lowprec",
        "gradgrad_unsupported",
        "forward_ad_unsupported",
        "library_opcheck",
        "compile",
    )
    assert model.COMPILE_BACKENDS == ("aot_eager", "inductor")
    assert model.COMPILE_CASES == ("aliased", "noncontiguous", "written", "dynamic", "partial_grad", "backward_state")
    assert model.FAST_MODES == ("auto", "true", "false")
    assert model.KNOWN_DEVICES == ("cpu", "cuda", "mps", "xpu")
    assert model.GRAD_DTYPES == ("float64", "complex128")
    assert model.LOWPREC_DTYPES == ("float32", "float16", "bfloat16", "complex64")
    assert model.LOWPREC_PARTS == ("output", "vjp", "jvp")
    assert model.LOWPREC_CRITERIA == ("baseline", "table")
    assert model.INDEX_DTYPES == ("int64", "int32", "int16", "int8", "uint8", "bool")
    assert model.TENSOR_DTYPES == model.GRAD_DTYPES + model.LOWPREC_DTYPES + model.INDEX_DTYPES


def test_the_tuples_hold_plain_strings():
    # They reach YAML, JSON, generated code and messages that repr() a value.
    for names in (
        model.CHECKS,
        model.FAST_MODES,
        model.KNOWN_DEVICES,
        model.TENSOR_DTYPES,
        model.GRAD_DTYPES,
        model.LOWPREC_DTYPES,
        model.LOWPREC_PARTS,
        model.LOWPREC_CRITERIA,
        model.COMPILE_BACKENDS,
        model.COMPILE_CASES,
        model.INDEX_DTYPES,
    ):
        assert all(type(name) is str for name in names), names
    assert repr(model.KNOWN_DEVICES[0]) == "'cpu'"


@pytest.mark.parametrize(
    "member", [Check.FWGRAD_BWGRAD, FastMode.TRUE, Device.CUDA, Dtype.BFLOAT16, LowprecCriterion.BASELINE]
)
def test_a_member_reads_as_its_name(member):
    name = member.value
    assert str(member) == f"{member}" == format(member) == "%s" % member == name  # noqa: UP031  # %-format, as old code writes it
    assert f"{member:>16}" == f"{name:>16}"
    assert f"test_{member}[x]" == f"test_{name}[x]"
    assert member == name and hash(member) == hash(name) and {name: 1}[member] == 1
    assert ", ".join([member, member]) == f"{name}, {name}"
    assert pickle.loads(pickle.dumps(member)) is member


def test_the_old_constants_are_the_members():
    assert model.GRADCHECK is Check.GRADCHECK and model.LIBRARY_OPCHECK is Check.LIBRARY_OPCHECK
    assert [
        model.GRADCHECK,
        model.FORWARD_AD,
        model.GRADGRADCHECK,
        model.FWGRAD_BWGRAD,
        model.LOWPREC,
        model.GRADGRAD_UNSUPPORTED,
        model.FORWARD_AD_UNSUPPORTED,
        model.LIBRARY_OPCHECK,
        model.COMPILE,
    ] == list(Check)


def test_parse_names_the_set_and_its_members():
    assert Device.parse("mps") is Device.MPS
    assert FastMode.parse("false") is FastMode.FALSE
    with pytest.raises(ValueError, match=r"^unknown Device 'tpu'; expected one of cpu, cuda, mps, xpu$"):
        Device.parse("tpu")
    with pytest.raises(ValueError, match="unknown Check 'GradCheck'"):
        Check.parse("GradCheck")
    assert LowprecCriterion.parse("table") is LowprecCriterion.TABLE
    with pytest.raises(ValueError, match=r"^unknown LowprecCriterion 'ulp'; expected one of baseline, table$"):
        LowprecCriterion.parse("ulp")


def test_pyproject_markers_are_the_check_table():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    markers = tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert markers == [f"{check}: {check.description}" for check in Check]


def test_every_check_has_a_description():
    descriptions = [check.description for check in Check]
    assert all(d.startswith("opcheck: ") and len(d) > len("opcheck: ") for d in descriptions)
    assert len(set(descriptions)) == len(descriptions)


def test_checks_are_plain_names_in_order():
    spec = OpSpec(
        name="t",
        op="torch.sin",
        source="t.yaml",
        sha256="0",
        samples=(Sample("a", args=(TensorArg((2,)),)),),
        lowprec_dtypes=("float32",),
        supports_forward_ad=False,
        library_opcheck=True,
    )
    checks = spec.checks()
    assert checks == ("gradcheck", "forward_ad_unsupported", "gradgradcheck", "lowprec", "library_opcheck")
    assert all(type(check) is str for check in checks)  # codegen writes them as Python names


def test_default_fast_mode_is_a_plain_auto():
    default = model.GradcheckFlags().fast_mode
    assert default == FastMode.AUTO and type(default) is str
