"""`lowprec_parts:` rules: read into the model, merged in families, and rendered into generated modules."""

from opcheck.codegen import render_module
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import LOWPREC_PARTS, Location, LowprecPart, LowprecPartsRule, Where

GLU = """\
op: torch.nn.functional.glu
lowprec_dtypes: [float32, bfloat16]
gradcheck: {check_forward_ad: true}
samples:
  - name: rows
    args: [{shape: [4, 6]}]
lowprec_parts:
  - where: {dtype: bfloat16, device: [cpu, cuda]}
    parts: [output, vjp]
    reason: glu_jvp_cpu has no bfloat16 kernel
  - parts: [jvp]
    reason: only the JVP
"""


def test_rules_are_read_with_their_where_parts_reason_and_location():
    (spec,) = load_spec_text(GLU, source="op_specs/glu.yaml")
    first, second = spec.lowprec_parts
    assert first == LowprecPartsRule(
        Where(device=("cpu", "cuda"), dtype=("bfloat16",)), ("output", "vjp"), "glu_jvp_cpu has no bfloat16 kernel"
    )
    assert first.location == Location("op_specs/glu.yaml", 8, 5)
    assert (second.where, second.parts) == (Where(), ("jvp",))


def test_without_rules_every_part_is_compared():
    (spec,) = load_spec_text(GLU.split("lowprec_parts:")[0], source="op_specs/glu.yaml")
    assert spec.lowprec_parts == ()
    assert LowprecPartsRule().parts == LOWPREC_PARTS == ("output", "vjp", "jvp")
    assert [LowprecPart(p).label for p in LOWPREC_PARTS] == ["output", "VJP", "JVP"]


def test_a_family_shares_rules_through_defaults_and_an_entry_replaces_them():
    text = """\
defaults:
  lowprec_dtypes: [bfloat16]
  gradcheck: {check_forward_ad: true}
  samples: [{name: rows, args: [{shape: [4, 6]}]}]
  lowprec_parts: [{where: {dtype: bfloat16}, parts: [output, vjp], reason: no bfloat16 JVP}]
ops:
  - op: torch.nn.functional.glu
  - op: torch.sin
    lowprec_parts: [{parts: [output], reason: outputs only}]
"""
    glu, sin = load_spec_text(text, source="op_specs/fam.yaml")
    assert [r.parts for r in glu.lowprec_parts] == [("output", "vjp")]
    assert glu.lowprec_parts[0].location.line == 5  # where the rule is written, in `defaults`
    assert [r.parts for r in sin.lowprec_parts] == [("output",)]


def test_the_generated_spec_literal_renders_the_rules():
    (spec,) = load_spec_text(GLU, source="op_specs/glu.yaml")
    module = render_module(spec)
    assert "LowprecPartsRule(" in module and "parts=('output', 'vjp')" in module.replace('"', "'")
    namespace: dict[str, object] = {}
    exec(compile(module, "test_glu.py", "exec"), namespace)
    rendered = namespace["SPEC"]
    assert rendered == spec
    assert [r.location for r in rendered.lowprec_parts] == [r.location for r in spec.lowprec_parts]
