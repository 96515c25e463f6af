"""`clone_inputs:`, `reduced_precision:` and the low-precision keys of `tolerances:` rules
(criterion, factor, floor): read into the model, checked where they are written, merged in
families, and rendered into generated modules only when they differ from the defaults."""

from dataclasses import replace

import pytest

from opcheck.codegen import render_module
from opcheck.spec import SpecError
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import Location, OpSpec, ReducedPrecision, ToleranceRule, Where

KERNEL = """\
op: torch.sin
lowprec_dtypes: [float32, bfloat16]
clone_inputs: true
reduced_precision: {tf32: true}
samples:
  - name: rows
    args: [{shape: [4, 6]}]
tolerances:
  - criterion: baseline
    factor: 2
    floor: 0
  - where: {check: [gradcheck, lowprec], dtype: bfloat16}
    atol: 1.0e-3
    criterion: table
    reason: bf16 rounding
"""


def _load(text: str) -> list[OpSpec]:
    return load_spec_text(text, source="op_specs/k.yaml")


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        _load(text)
    return [str(p) for p in info.value.problems]


def test_the_defaults_are_off_and_unset():
    (spec,) = _load("op: torch.sin\nsamples: [{name: a, args: [{shape: [3]}]}]\n")
    assert spec.clone_inputs is False
    assert (
        spec.reduced_precision == ReducedPrecision() == ReducedPrecision(tf32=False, reduced_precision_reduction=False)
    )
    rule = ToleranceRule()
    assert (rule.criterion, rule.factor, rule.floor) == (None, None, None)


def test_the_keys_are_read_into_the_model():
    (spec,) = _load(KERNEL)
    assert spec.clone_inputs is True
    assert spec.reduced_precision == ReducedPrecision(tf32=True)
    first, second = spec.tolerances
    assert first == ToleranceRule(criterion="baseline", factor=2.0, floor=0.0)
    assert type(first.criterion) is str and type(first.factor) is float and type(first.floor) is float
    assert first.location == Location("op_specs/k.yaml", 9, 5)
    assert second == ToleranceRule(
        where=Where(dtype=("bfloat16",), check=("gradcheck", "lowprec")),
        atol=1e-3,
        criterion="table",
        reason="bf16 rounding",
    )


def test_both_switches_and_a_false_clone_inputs_are_read():
    text = KERNEL.replace("clone_inputs: true", "clone_inputs: false").replace(
        "{tf32: true}", "{tf32: false, reduced_precision_reduction: true}"
    )
    (spec,) = _load(text)
    assert spec.clone_inputs is False
    assert spec.reduced_precision == ReducedPrecision(tf32=False, reduced_precision_reduction=True)


@pytest.mark.parametrize(
    "rule",
    [
        "{criterion: table}",
        "{factor: 1.5}",
        "{floor: 1.0e-6, reason: tiny outputs}",
        "{where: {check: lowprec}, factor: 3}",
        "{where: {dtype: [float64, float32]}, atol: 1.0e-5, floor: 0}",
        "{where: {device: cuda, sample: a}, criterion: baseline}",
    ],
)
def test_a_rule_may_set_only_the_lowprec_keys_and_match_any_lowprec_test(rule):
    (spec,) = _load(
        f"op: torch.sin\nlowprec_dtypes: [float32]\nsamples: [{{name: a, args: [{{shape: [3]}}]}}]\n"
        f"tolerances: [{rule}]\n"
    )
    assert len(spec.tolerances) == 1


def test_a_lowprec_key_that_no_lowprec_test_reads_is_reported_at_the_key_all_at_once():
    text = """\
op: torch.sin
lowprec_dtypes: [float32]
samples: [{name: a, args: [{shape: [3]}]}]
tolerances:
  - where: {check: [gradcheck, gradgradcheck]}
    atol: 1.0e-4
    criterion: table
    floor: 1.0e-7
  - where: {dtype: bfloat16}
    factor: 2
  - where: {check: gradcheck}
    atol: 1.0e-4
"""
    assert _problems(text) == [
        "op_specs/k.yaml:7:5: tolerances[0].criterion: applies to the lowprec check only; this rule's "
        "where.check (gradcheck, gradgradcheck) leaves out lowprec; add lowprec to where.check, or move "
        "criterion to a rule of its own",
        "op_specs/k.yaml:8:5: tolerances[0].floor: applies to the lowprec check only; this rule's "
        "where.check (gradcheck, gradgradcheck) leaves out lowprec; add lowprec to where.check, or move "
        "floor to a rule of its own",
        "op_specs/k.yaml:10:5: tolerances[1].factor: applies to the lowprec check only; this rule's "
        "where.dtype (bfloat16) has none of lowprec_dtypes (float32); name one of them, or move factor "
        "to a rule of its own",
    ]


def test_without_lowprec_dtypes_the_lowprec_keys_and_switches_are_reported():
    text = """\
op: torch.sin
reduced_precision: {reduced_precision_reduction: true}
clone_inputs: true
samples: [{name: a, args: [{shape: [3]}]}]
tolerances:
  - where: {check: lowprec}
    factor: 2
  - atol: 1.0e-4
"""
    assert _problems(text) == [
        "op_specs/k.yaml:2:1: reduced_precision: its switches are set only while the low-precision check "
        "runs, and that check does not run without lowprec_dtypes; add them",
        "op_specs/k.yaml:7:5: tolerances[0].factor: applies to the lowprec check only; the spec has no "
        "lowprec_dtypes, so no test reads it; add lowprec_dtypes, or remove it",
    ]


def test_a_rule_without_any_tolerance_names_every_key_it_may_set():
    text = "op: torch.sin\nsamples: [{name: a, args: [{shape: [3]}]}]\ntolerances: [{reason: none}]\n"
    assert _problems(text) == [
        "op_specs/k.yaml:3:14: tolerances[0]: a tolerance rule needs at least one of eps, atol, rtol, "
        "nondet_tol, criterion, factor, floor"
    ]


def test_a_family_merges_the_switches_key_by_key_and_judges_each_op():
    text = """\
defaults:
  lowprec_dtypes: [float32]
  reduced_precision: {tf32: true}
  clone_inputs: true
  samples: [{name: a, args: [{shape: [3]}]}]
  tolerances: [{criterion: baseline, factor: 2}]
ops:
  - op: torch.sin
    reduced_precision: {reduced_precision_reduction: true}
  - op: torch.cos
    clone_inputs: false
"""
    sin, cos = _load(text)
    assert sin.reduced_precision == ReducedPrecision(tf32=True, reduced_precision_reduction=True)
    assert cos.reduced_precision == ReducedPrecision(tf32=True)
    assert (sin.clone_inputs, cos.clone_inputs) == (True, False)
    assert sin.tolerances == cos.tolerances == (ToleranceRule(criterion="baseline", factor=2.0),)
    assert sin.tolerances[0].location.line == 6  # where the rule is written, in `defaults`
    # An op without low-precision tests is told about the rule it inherits, where it is written.
    assert _problems(text + "  - op: torch.tan\n    lowprec_dtypes: []\n") == [
        "op_specs/k.yaml:3:3: defaults.reduced_precision: its switches are set only while the low-precision "
        "check runs, and that check does not run without lowprec_dtypes (op 'torch.tan' has none); add them",
        "op_specs/k.yaml:6:17: defaults.tolerances[0].criterion: applies to the lowprec check only; "
        "op 'torch.tan' has no lowprec_dtypes, so no test reads it; add lowprec_dtypes, or remove it",
        "op_specs/k.yaml:6:38: defaults.tolerances[0].factor: applies to the lowprec check only; "
        "op 'torch.tan' has no lowprec_dtypes, so no test reads it; add lowprec_dtypes, or remove it",
    ]


def test_the_generated_module_writes_what_differs_from_the_defaults():
    (spec,) = _load(KERNEL)
    module = render_module(spec)
    assert "    clone_inputs=True,\n    reduced_precision=ReducedPrecision(tf32=True),\n" in module
    assert 'ToleranceRule(criterion="baseline", factor=2.0, floor=0.0, location=' in module
    assert "import Location, OpSpec, ReducedPrecision, Sample," in " ".join(module.split())
    namespace: dict[str, object] = {}
    exec(compile(module, "test_sin.py", "exec"), namespace)  # noqa: S102 - our own output
    assert namespace["SPEC"] == spec
    assert [r.location for r in namespace["SPEC"].tolerances] == [r.location for r in spec.tolerances]


def test_the_defaults_written_out_leave_the_generated_module_as_it_was():
    plain = "op: torch.sin\nlowprec_dtypes: [float32]\nsamples: [{name: a, args: [{shape: [3]}]}]\n"
    explicit = plain + "clone_inputs: false\nreduced_precision: {tf32: false, reduced_precision_reduction: false}\n"
    (a,), (b,) = _load(plain), _load(explicit)
    assert replace(a, sha256="") == replace(b, sha256="")
    module = render_module(b)
    assert render_module(a).replace(a.sha256, b.sha256) == module
    assert "clone_inputs" not in module and "ReducedPrecision" not in module and "criterion" not in module
