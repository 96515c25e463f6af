"""opcheck.parametrize: the grid a generated test function is parametrized over, and the rules' marks."""

from __future__ import annotations

import pytest

from opcheck.parametrize import PARAMS, grid, reason, skip, xfail
from opcheck.spec import model as M
from opcheck.spec.case import cases_of

SAMPLES = (M.Sample("b", args=(M.TensorArg(shape=(2,)),)), M.Sample("a", args=(M.TensorArg(shape=(2,)),)))


def _spec(**overrides) -> M.OpSpec:
    fields = dict(
        name="demo",
        op="torch.sin",
        source="op_specs/demo.yaml",
        sha256="0" * 64,
        samples=SAMPLES,
        dtypes=("float64", "complex128"),
        lowprec_dtypes=("float32",),
        devices=("cpu", "mps"),
    )
    fields.update(overrides)
    return M.OpSpec(**fields)


def _params(mark):
    assert mark.name == "parametrize" and mark.args[0] == PARAMS == ("device", "dtype", "sample")
    return list(mark.args[1])


def test_the_grid_is_the_cases_of_the_check_with_their_ids_in_order():
    spec = _spec()
    params = _params(grid(spec, "gradcheck", devices=("cpu",), dtypes=("float64", "complex128")).mark)
    assert [(p.values, p.id, p.marks) for p in params] == [
        (("cpu", "float64", "b"), "cpu-float64-b", ()),
        (("cpu", "float64", "a"), "cpu-float64-a", ()),
        (("cpu", "complex128", "b"), "cpu-complex128-b", ()),
        (("cpu", "complex128", "a"), "cpu-complex128-a", ()),
    ]
    lowprec = _params(grid(spec, "lowprec", devices=("cpu", "mps"), dtypes=("float32",)).mark)
    assert [p.id for p in lowprec] == [c.param_id for c in cases_of(spec) if c.check == "lowprec"]


def test_pairs_that_never_run_are_left_out_of_any_grid():
    spec = _spec(dtypes=("float64",), lowprec_dtypes=())
    params = _params(grid(spec, "gradcheck", devices=("cpu",), dtypes=("float64",)).mark)
    # mps × float64 is no case of the spec, so naming mps gives the same grid.
    assert params == _params(grid(spec, "gradcheck", devices=("cpu", "mps"), dtypes=("float64",)).mark)


@pytest.mark.parametrize(
    ("devices", "dtypes"),
    [
        (("cpu",), ("float64",)),  # a dtype missing
        (("mps", "cpu"), ("float32",)),  # not the spec's order
        (("cpu", "mps", "cuda"), ("float32",)),  # a device the spec does not name
    ],
)
def test_a_grid_that_is_not_the_specs_is_refused(devices, dtypes):
    check = "lowprec" if dtypes == ("float32",) else "gradcheck"
    with pytest.raises(
        ValueError,
        match=rf"^op_specs/demo.yaml: test_{check} over devices .* is not what the "
        r"spec generates; regenerate the module",
    ):
        grid(_spec(), check, devices=devices, dtypes=dtypes)


def test_marked_tests_get_their_marks_and_no_other_test_does():
    spec = _spec()
    known = pytest.mark.xfail(reason="known", strict=True)
    marked = {"test_gradcheck[cpu-complex128-a]": known, "test_lowprec[cpu-float32-b]": pytest.mark.skip(reason="x")}
    params = _params(grid(spec, "gradcheck", devices=("cpu",), dtypes=("float64", "complex128"), marked=marked).mark)
    assert {p.id: p.marks for p in params} == {
        "cpu-float64-b": (),
        "cpu-float64-a": (),
        "cpu-complex128-b": (),
        "cpu-complex128-a": (known,),
    }


def test_a_marked_test_the_grid_does_not_have_is_refused():
    marked = {"test_gradcheck[cpu-float32-a]": pytest.mark.skip(reason="x")}
    with pytest.raises(
        ValueError,
        match=r"marked tests that test_gradcheck does not have: "
        r"test_gradcheck\[cpu-float32-a\]",
    ):
        grid(_spec(), "gradcheck", devices=("cpu",), dtypes=("float64", "complex128"), marked=marked)


def test_rule_marks_carry_the_reason_and_where_it_is_written():
    rule = M.Rule(where=M.Where(sample=("a",)), reason="no kernel", location=M.Location("op_specs/x.yaml", 7, 5))
    assert reason(rule) == "no kernel (op_specs/x.yaml:7:5)"
    assert reason(M.Rule(reason="no kernel")) == "no kernel"
    assert skip(rule).mark.name == "skip" and skip(rule).mark.kwargs == {"reason": "no kernel (op_specs/x.yaml:7:5)"}
    assert xfail(rule).mark.name == "xfail"
    assert xfail(rule).mark.kwargs == {"reason": "no kernel (op_specs/x.yaml:7:5)", "strict": True}


def test_a_generated_module_collects_its_marks_once_per_marked_test(pytester):
    pytester.makepyfile(
        test_demo="""
import pytest

from opcheck.parametrize import grid, xfail
from opcheck.spec.model import Location, OpSpec, Rule, Sample, TensorArg, Where

SPEC = OpSpec(name="demo", op="torch.sin", source="op_specs/demo.yaml", sha256="0" * 64, devices=("cpu",),
              samples=(Sample("v", args=(TensorArg(shape=(3,)),)), Sample("w", args=(TensorArg(shape=(3,)),))),
              expected_failures=(Rule(where=Where(sample=("w",)), reason="sin is not cos",
                                      location=Location("op_specs/demo.yaml", 9, 5)),))
XFAIL_0 = xfail(SPEC.expected_failures[0])
MARKED = {"test_gradcheck[cpu-float64-w]": XFAIL_0}


@pytest.mark.gradcheck
@grid(SPEC, "gradcheck", devices=("cpu",), dtypes=("float64",), marked=MARKED)
def test_gradcheck(device, dtype, sample):
    assert sample != "w"
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rx", "-o", "addopts=")
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        ["XFAIL test_demo.py::test_gradcheck[[]cpu-float64-w[]] - sin is not cos (op_specs/demo.yaml:9:5)"]
    )


TORCH_CONDITIONS = """\
op: torch.sin
devices: [cpu]
samples:
  - {name: a, args: [{shape: [3]}]}
  - {name: b, args: [{shape: [3]}]}
  - {name: c, args: [{shape: [3]}]}
skips:
  - where: {sample: a, torch: ">=999.0"}
    reason: never on this torch
  - where: {sample: [b, c], torch: "<999.0"}
    reason: always on this torch
expected_failures:
  - where: {sample: c}
    reason: unconditional, behind a conditional skip
  - where: {sample: a, torch: ">=999.0"}
    reason: never expected to fail on this torch
"""


def test_a_rule_with_a_torch_condition_marks_its_tests_when_they_are_collected(pytester):
    from opcheck.codegen import render_module
    from opcheck.spec.loader import load_spec_text

    (spec,) = load_spec_text(TORCH_CONDITIONS, source="op_specs/demo.yaml")
    module = render_module(spec)
    # Rendered the same on every torch: each rule's mark, and behind a conditional rule the next.
    assert "SKIP_0 = skip(SPEC.skips[0])" in module and "XFAIL_1 = xfail(SPEC.expected_failures[1])" in module
    assert '"test_gradcheck[cpu-float64-a]": (SKIP_0, XFAIL_1),' in module
    assert '"test_gradcheck[cpu-float64-b]": SKIP_1,' in module
    assert '"test_gradcheck[cpu-float64-c]": (SKIP_1, XFAIL_0),' in module
    pytester.makepyfile(test_demo=module)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "-o", "addopts=")
    result.assert_outcomes(passed=2, skipped=4)  # gradcheck and gradgradcheck of a pass; b and c skip
    result.stdout.fnmatch_lines(["SKIPPED [[]2[]] test_demo.py:*: always on this torch (op_specs/demo.yaml:10:5)"])


def test_a_torch_condition_becomes_the_marks_condition():
    never = M.Rule(where=M.Where(torch=">=999.0"), reason="r")
    always = M.Rule(where=M.Where(torch="<999.0"), reason="r")
    assert skip(never).mark.name == "skipif" and skip(never).mark.args == (False,)
    assert skip(always).mark.args == (True,)
    assert xfail(never).mark.args == (False,) and xfail(always).mark.args == (True,)
    assert xfail(always).mark.kwargs == {"reason": "r", "strict": True}
