"""`where.torch`: a rule's condition on the installed torch's version, read, validated and matched."""

import pytest

from opcheck.codegen.source import to_expr
from opcheck.spec import torch_condition
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import Where
from opcheck.spec.validate import schema

SPEC = """\
op: torch.sin
samples:
  - name: x
    args: [{shape: [3]}]
skips:
  - where: {device: cuda, torch: "<2.14"}
    reason: old cuda kernel
expected_failures:
  - where: {check: gradcheck, torch: ">=2.12, <2.15"}
    reason: broken in 2.12 to 2.14
"""


@pytest.mark.parametrize(
    "version, condition, expected",
    [
        ("2.13.0", "<2.14", True),
        ("2.14.1", "<2.14", False),
        ("2.14.0+cpu", "<2.14", False),
        ("2.13.1+cu130", "<2.14", True),
        ("2.14.1", ">=2.12,<2.15", True),
        ("2.15.0", ">=2.12,<2.15", False),
        ("2.11.9", ">=2.12,<2.15", False),
        ("2.14.1", "==2.14", False),  # 2.14 is 2.14.0
        ("2.14.0", "==2.14", True),
        ("2.14.1", "==2.14.1", True),
        ("2.14.1", "!=2.14.1", False),
        ("2.14.1", ">2.14", True),
        ("2.14.0", "<=2.14.0", True),
        ("2.9.0", "<2.10", True),  # numeric, not lexicographic
        ("2.14.0a0+git1234", "<2.14", False),  # the release part alone
    ],
)
def test_satisfies_compares_release_parts_numerically(version, condition, expected):
    assert torch_condition.satisfies(version, condition) is expected


@pytest.mark.parametrize("bad", ["2.14", "<2", "<2.x", "~=2.14", "<2.14,", "", "<2.14;>2.12", "< 2.14.1.2"])
def test_parse_rejects_what_is_not_a_condition(bad):
    with pytest.raises(ValueError, match="expected a version condition"):
        torch_condition.parse(bad)
    assert not torch_condition.re.fullmatch(torch_condition.PATTERN.strip("^$"), bad)


def test_parse_reads_the_clauses():
    assert torch_condition.parse(" >=2.12 , <2.15.1") == ((">=", (2, 12)), ("<", (2, 15, 1)))


def test_the_schema_pattern_is_the_parsers():
    assert schema()["$defs"]["torchCondition"]["pattern"] == torch_condition.PATTERN


def test_the_installed_torch_decides_matches_but_not_matches_case():
    case = dict(device="cpu", dtype="float64", check="gradcheck", sample="x")
    never, always = Where(torch=">=999.0"), Where(torch="<999.0")
    assert not never.matches(**case) and never.matches_case(**case) and not never.matches_torch()
    assert always.matches(**case) and always.matches_torch()
    assert Where(device=("cuda",), torch="<999.0").matches(**case) is False
    assert Where(torch="<999.0").specificity == 1 and Where(device=("cpu",)).specificity == 1


def test_rules_read_the_condition_and_the_model_renders_it():
    (spec,) = load_spec_text(SPEC, source="op_specs/sin.yaml")
    assert spec.skips[0].where == Where(device=("cuda",), torch="<2.14")
    assert spec.expected_failures[0].where == Where(check=("gradcheck",), torch=">=2.12, <2.15")
    assert to_expr(spec.skips[0].where).flat == 'Where(device=("cuda",), torch="<2.14")'
