"""Low-precision check: correct float32/float16/bfloat16/complex64 kernels pass, wrong ones fail."""

from dataclasses import replace

import pytest
import torch

from opcheck.runtime import LowPrecisionMismatch, run_check
from opcheck.runtime.lowprec import compare, upcast
from opcheck.runtime.tolerances import Tolerances
from opcheck.spec.model import GradcheckFlags, OpSpec, Sample, TensorArg

# Below 2048 elements on purpose: see test_sizes_are_below_mkl_vml_chunking.
SAMPLES = (
    Sample("vec", args=(TensorArg(shape=(40,)),)),
    Sample("rows", args=(TensorArg(shape=(6, 9), noncontiguous=True),), kwargs=(("dim", -1),)),
    Sample("mm", args=(TensorArg(shape=(8, 33)), TensorArg(shape=(33, 5)))),
)


def spec(op, *samples, forward_ad=False, lowprec=("float32", "float16", "bfloat16", "complex64")):
    return OpSpec(
        name="lp",
        op=op,
        source="op_specs/lp.yaml",
        sha256="0",
        samples=samples or SAMPLES,
        lowprec_dtypes=lowprec,
        gradcheck=GradcheckFlags(check_forward_ad=forward_ad),
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    "op, sample", [("torch.sin", "vec"), ("torch.nn.functional.softmax", "rows"), ("torch.matmul", "mm")]
)
def test_correct_kernels_pass(op, sample, dtype):
    run_check(spec(op, forward_ad=True), "lowprec", "cpu", dtype, sample)


@pytest.mark.parametrize("op, sample", [("torch.sin", "vec"), ("torch.matmul", "mm")])
def test_complex64_against_complex128(op, sample):
    run_check(spec(op, forward_ad=True), "lowprec", "cpu", "complex64", sample)


def test_a_float32_only_backward_bug_is_caught_and_localized():
    s = spec("runtime_ops:sin_wrong_in_float32", Sample("vec", args=(TensorArg(shape=(40,)),)))
    run_check(s, "gradcheck", "cpu", "float64", "vec")  # the float64 path is right
    run_check(s, "lowprec", "cpu", "bfloat16", "vec")  # and 1% hides in bfloat16's own rounding
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(s, "lowprec", "cpu", "float32", "vec")
    text = str(info.value)
    assert "VJP: gradient of input 0 differs from the float64 run" in text
    assert "check path:  VJP at float32 against the float64 reference" in text
    assert "tolerances:  criterion=baseline (default), factor=2 (default), floor=256 (default for float32)" in text
    assert "entries beyond the bound" in text and "worst entries (op error / baseline error" in text
    assert "float32 against float64" in text


def test_a_float32_forward_bug_fails_on_the_output():
    s = spec("runtime_ops:exp_float32_forward_off", Sample("vec", args=(TensorArg(shape=(10,)),)))
    with pytest.raises(LowPrecisionMismatch, match="output 0 differs from the float64 run"):
        run_check(s, "lowprec", "cpu", "float32", "vec")


def test_jvp_is_compared_when_the_spec_checks_forward_ad():
    s_vec = Sample("vec", args=(TensorArg(shape=(10,)),))
    run_check(spec("runtime_ops:square_wrong_jvp_in_float32", s_vec), "lowprec", "cpu", "float32", "vec")
    with pytest.raises(LowPrecisionMismatch, match="JVP: tangent of output 0 differs"):
        run_check(
            spec("runtime_ops:square_wrong_jvp_in_float32", s_vec, forward_ad=True), "lowprec", "cpu", "float32", "vec"
        )


def test_compare_formula_scales_atol_and_keeps_integers_exact():
    tol = Tolerances(eps=1e-6, atol=1e-3, rtol=1e-2, nondet_tol=0.0)
    ref = torch.tensor([100.0, 0.0, 1.0], dtype=torch.float64)
    assert compare(ref + torch.tensor([0.0, 0.09, 0.01]), ref, tol, "x") is None  # 1e-3 * 100 + 1e-2 * |ref|
    report = compare(ref + torch.tensor([0.0, 0.11, 0.0]), ref, tol, "x")
    assert report.startswith("x: 1 of 3 entries beyond the bound") and "[1]: float64 0.11, float64 0" in report
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.float64)
    assert compare(nan.clone(), nan, tol, "x") is None
    assert "1 of 2" in compare(torch.tensor([0.0, 1.0], dtype=torch.float64), nan, tol, "x")
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 2]), tol, "i") is None
    assert "must match exactly" in compare(torch.tensor([1, 3]), torch.tensor([1, 2]), tol, "i")


def test_upcast_keeps_values_strides_and_requires_grad():
    base = torch.rand(4, 12, dtype=torch.bfloat16)[:, ::2].requires_grad_()
    up = upcast(base, "cpu")
    assert up.dtype == torch.float64 and up.stride() == base.stride() and up.requires_grad and up.is_leaf
    assert torch.equal(up.detach().to(torch.bfloat16), base.detach())


def test_sizes_are_below_mkl_vml_chunking():
    # On MKL CPU builds, a float32 torch.sin over more than 2048 elements sometimes (first call in a
    # process, other threads) comes out with errors of 1.5e-4: a real low-precision difference,
    # and a flaky one. The samples here stay below it so these tests only test opcheck.
    assert all(torch.Size(a.shape).numel() < 2048 for s in SAMPLES for a in s.args)


def test_a_kernel_without_float64_path_is_checked_against_the_reference():
    vec = Sample("vec", args=(TensorArg(shape=(40,)),))
    good = OpSpec(
        name="f32",
        op="examples.ops:fused_gelu_f32",
        source="op_specs/f32.yaml",
        sha256="0",
        samples=(vec,),
        dtypes=(),
        lowprec_dtypes=("float32",),
        reference="examples.ops:gelu_reference",
    )
    assert good.checks() == ("lowprec",)
    run_check(good, "lowprec", "cpu", "float32", "vec")
    bad = replace(good, op="runtime_ops:gelu_f32_wrong_backward")
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(bad, "lowprec", "cpu", "float32", "vec")
    assert "differs from the float64 reference examples.ops:gelu_reference" in str(info.value)
    assert "VJP" in str(info.value)


GLU_PARTS_SPEC = """\
op: torch.nn.functional.glu
lowprec_dtypes: [float32, bfloat16]
gradcheck: {check_forward_ad: true}
samples:
  - name: rows
    args: [{shape: [4, 6]}]
lowprec_parts:
  - where: {dtype: bfloat16}
    parts: [output, vjp]
    reason: glu_jvp_cpu has no bfloat16 kernel
"""


def _glu_spec(text=GLU_PARTS_SPEC):
    from opcheck.spec.loader import load_spec_text

    (glu,) = load_spec_text(text, source="op_specs/glu.yaml")
    return glu


def _spy_parts(monkeypatch):
    import opcheck.runtime.checks as checks

    seen = []
    real = checks.compare_lowprec

    def spy(*args, **kwargs):
        seen.append(tuple(kwargs["parts"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(checks, "compare_lowprec", spy)
    return seen


def test_a_parts_rule_drops_the_bfloat16_jvp_torch_does_not_implement(monkeypatch, capsys):
    from opcheck.runtime import CheckCrashed
    from opcheck.runtime.context import ItemContext, Settings, current_item

    glu = _glu_spec()
    without_rule = replace(glu, lowprec_parts=())
    with pytest.raises(CheckCrashed, match="glu_jvp_cpu"):  # what the rule is for
        run_check(without_rule, "lowprec", "cpu", "bfloat16", "rows")
    seen = _spy_parts(monkeypatch)
    item = ItemContext(nodeid="t", rerun="", settings=Settings.from_env())
    token = current_item.set(item)
    try:
        run_check(glu, "lowprec", "cpu", "bfloat16", "rows")
        bf16_props = _parts_notes(item.user_properties)
        run_check(glu, "lowprec", "cpu", "float32", "rows")
    finally:
        current_item.reset(token)
    assert seen == [("output", "vjp"), ("output", "vjp", "jvp")]
    note = "JVP not compared (op_specs/glu.yaml:8:5: glu_jvp_cpu has no bfloat16 kernel)"
    assert bf16_props == [("opcheck_lowprec_parts", note)]
    assert _parts_notes(item.user_properties) == bf16_props  # float32 leaves nothing out, and says nothing
    assert capsys.readouterr().out.splitlines() == [f"opcheck lowprec: {note}"]


def _parts_notes(user_properties: list) -> list:
    """The parts notes among a report's user_properties (a pass also puts its margin there)."""
    return [p for p in user_properties if p[0] == "opcheck_lowprec_parts"]


def test_parts_left_out_still_leave_the_others_checked(monkeypatch):
    # With only the VJP compared, a float32-only backward bug still fails, and the failure names
    # what the rule left out.
    text = GLU_PARTS_SPEC.replace("torch.nn.functional.glu", "runtime_ops:sin_wrong_in_float32")
    text = text.replace("[4, 6]", "[40]").replace("{dtype: bfloat16}", "{dtype: float32}")
    text = text.replace("glu_jvp_cpu has no bfloat16 kernel", "only the VJP")
    s = _glu_spec(text.replace("parts: [output, vjp]", "parts: [vjp]"))
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(s, "lowprec", "cpu", "float32", "rows")
    assert "VJP: gradient of input 0 differs" in str(info.value)
    assert "note:        output and JVP not compared (op_specs/glu.yaml:8:5: only the VJP)" in str(info.value)
    run_check(_glu_spec(text.replace("parts: [output, vjp]", "parts: [output]")), "lowprec", "cpu", "float32", "rows")


def test_resolve_parts_most_specific_then_last_rule_wins_and_jvp_needs_forward_ad():
    from opcheck.runtime.lowprec import resolve_parts
    from opcheck.spec.model import Location, LowprecPartsRule, Where

    rules = (
        LowprecPartsRule(Where(dtype=("bfloat16",)), ("output",), "a", Location("x.yaml", 3, 5)),
        LowprecPartsRule(Where(), ("vjp",), "b", Location("x.yaml", 6, 5)),
        LowprecPartsRule(Where(), ("output", "jvp"), None, Location("x.yaml", 9, 5)),
    )
    s = replace(spec("torch.sin", forward_ad=True), lowprec_parts=rules)
    bf16 = resolve_parts(s, "cpu", "bfloat16", "vec")
    assert (bf16.parts, bf16.dropped, bf16.note()) == (
        ("output",),
        ("vjp", "jvp"),
        "VJP and JVP not compared (x.yaml:3:5: a)",
    )
    f32 = resolve_parts(s, "cpu", "float32", "vec")
    assert (f32.parts, f32.note()) == (("output", "jvp"), "VJP not compared (x.yaml:9:5)")
    assert resolve_parts(replace(s, lowprec_parts=()), "cpu", "float32", "vec").parts == ("output", "vjp", "jvp")
    no_fwd = replace(s, gradcheck=GradcheckFlags())
    assert resolve_parts(no_fwd, "cpu", "float32", "vec").dropped == ("vjp",)  # the JVP was never compared
    assert resolve_parts(replace(no_fwd, lowprec_parts=()), "cpu", "float32", "vec").parts == ("output", "vjp")


def test_resolve_parts_honours_the_rules_torch_condition():
    from opcheck.runtime.lowprec import resolve_parts
    from opcheck.spec.model import Location, LowprecPartsRule, Where

    never = LowprecPartsRule(Where(torch=">=999.0"), ("output",), "never", Location("x.yaml", 3, 5))
    always = LowprecPartsRule(Where(torch="<999.0"), ("vjp",), "always", Location("x.yaml", 6, 5))
    s = spec("torch.sin")
    assert resolve_parts(replace(s, lowprec_parts=(never,)), "cpu", "float32", "vec").parts == ("output", "vjp")
    assert resolve_parts(replace(s, lowprec_parts=(never, always)), "cpu", "float32", "vec").parts == ("vjp",)
    assert resolve_parts(replace(s, lowprec_parts=(always, never)), "cpu", "float32", "vec").parts == ("vjp",)


NARROW_HINT = "is a kernel computing in a narrower dtype?"


def _lowprec_failure(op, dtype="float32") -> str:
    s = spec(op, Sample("vec", args=(TensorArg(shape=(40,)),)))
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(s, "lowprec", "cpu", dtype, "vec")
    return str(info.value)


def test_a_float32_gradient_rounded_to_bfloat16_is_named():
    run_check(spec("tests.broken_ops:sin_grad_in_float32"), "lowprec", "cpu", "float32", "vec")  # the twin
    text = _lowprec_failure("tests.broken_ops:sin_grad_in_bfloat16_for_float32")
    assert "VJP: gradient of input 0 differs from the float64 run" in text.splitlines()[0]
    (hint,) = [line for line in text.splitlines() if NARROW_HINT in line]
    assert hint.startswith("hint: errors of the size of bfloat16 rounding (relative ")
    assert "bfloat16's unit roundoff is 3.9e-03" in hint


@pytest.mark.parametrize(
    "op", ["tests.broken_ops:sin_grad_one_percent_off_for_float32", "runtime_ops:sin_wrong_in_float32"]
)
def test_a_wrong_float32_gradient_is_not_called_rounding(op):
    assert NARROW_HINT not in _lowprec_failure(op)


FLOAT32_TOL = Tolerances(eps=1e-6, atol=1e-5, rtol=1e-4, nondet_tol=0.0)


def _values(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return (torch.rand(64, generator=g, dtype=torch.float64) + 0.5).to(dtype)


@pytest.mark.parametrize("narrow, roundoff", [(torch.float16, "4.9e-04"), (torch.bfloat16, "3.9e-03")])
def test_compare_names_the_narrower_dtype_of_float32_results(narrow, roundoff):
    ref = _values(torch.float32).to(torch.float64)
    low = ref.to(narrow).to(torch.float32)
    report = compare(low, ref, FLOAT32_TOL, "x")
    assert report.startswith("x: ")
    assert f"hint: errors of the size of {str(narrow)[6:]} rounding" in report and roundoff in report


def test_compare_names_bfloat16_rounding_of_float16_results():
    tol = Tolerances(eps=1e-3, atol=1e-3, rtol=1e-3, nondet_tol=0.0)
    ref = _values(torch.float16).to(torch.float64)
    report = compare(ref.to(torch.bfloat16).to(torch.float16), ref, tol, "x")
    assert "errors of the size of bfloat16 rounding" in report


def test_compare_does_not_call_a_constant_factor_rounding():
    ref = _values(torch.float32).to(torch.float64)
    # relative errors inside bfloat16's window, inside float16's, and above both: of one sign
    for factor in (1 + 2**-9, 1 + 2**-12, 1.01):
        report = compare((ref * factor).to(torch.float32), ref, FLOAT32_TOL, "x")
        assert report is not None and NARROW_HINT not in report


def test_torchs_jit_script_deprecation_stays_out_of_a_low_precision_test():
    # torch scripts its forward-AD decompositions on first use with a DeprecationWarning (a
    # FutureWarning from torch 2.14) per function; a fresh process shows whether any gets through.
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "from opcheck.runtime import run_check\n"
        "from opcheck.spec.model import GradcheckFlags, OpSpec, Sample, TensorArg\n"
        "spec = OpSpec(name='lp', op='torch.sin', source='op_specs/lp.yaml', sha256='0',\n"
        "              samples=(Sample('vec', args=(TensorArg(shape=(8,)),)),), lowprec_dtypes=('float32',),\n"
        "              gradcheck=GradcheckFlags(check_forward_ad=True))\n"
        "run_check(spec, 'lowprec', 'cpu', 'float32', 'vec')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch.jit.script" not in done.stderr, done.stderr[-3000:]


def test_the_float64_copy_of_an_expanded_input_stays_expanded():
    from opcheck.engine.lowprec.numbers import upcast

    mask = (torch.arange(6) < 4)[None, :].expand(3, 6)  # stride 0 along dim 0: one row in memory
    copy = upcast(mask)
    assert copy.stride() == (0, 1) and torch.equal(copy, mask)
    scale = torch.rand(6, dtype=torch.float32)[:, None].expand(6, 4)
    copy = upcast(scale)
    assert copy.dtype == torch.float64 and copy.stride() == (1, 0) and torch.equal(copy, scale.double())
    # an input to differentiate is a leaf: its copy is dense
    leaf = scale.detach().requires_grad_()
    copy = upcast(leaf)
    assert copy.is_leaf and copy.requires_grad and copy.is_contiguous() and torch.equal(copy, scale.double())
