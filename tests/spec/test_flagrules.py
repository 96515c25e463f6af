"""Flags set to true whose check another key of the spec turns off."""

import textwrap

import pytest

from opcheck.spec import SpecError, load_spec_text


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(textwrap.dedent(text), source="x.yaml")
    return [str(p) for p in info.value.problems]


def _checks(text: str) -> tuple[str, ...]:
    (spec,) = load_spec_text(textwrap.dedent(text), source="x.yaml")
    return spec.checks()


SAMPLES = "samples: [{name: a, args: [{shape: [3]}]}]\n"


@pytest.mark.parametrize(
    ("keys", "flag", "disablers"),
    [
        (
            "supports_forward_ad: false\ngradcheck: {check_forward_ad: true}",
            "gradcheck.check_forward_ad",
            ["supports_forward_ad: false"],
        ),
        (
            "supports_forward_ad: false\ngradgradcheck: {check_fwd_over_rev: true}",
            "gradgradcheck.check_fwd_over_rev",
            ["supports_forward_ad: false"],
        ),
        (
            "supports_gradgrad: false\ngradgradcheck: {check_fwd_over_rev: true}",
            "gradgradcheck.check_fwd_over_rev",
            ["supports_gradgrad: false"],
        ),
        (
            "gradgradcheck: {enabled: false, check_fwd_over_rev: true}",
            "gradgradcheck.check_fwd_over_rev",
            ["gradgradcheck.enabled: false"],
        ),
        (
            "supports_gradgrad: false\ngradgradcheck: {check_batched_grad: true}",
            "gradgradcheck.check_batched_grad",
            ["supports_gradgrad: false"],
        ),
        (
            "supports_forward_ad: false\ngradcheck: {check_batched_forward_grad: true}",
            "gradcheck.check_batched_forward_grad",
            ["supports_forward_ad: false"],
        ),
    ],
    ids=[
        "forward_ad_unsupported",
        "fwd_over_rev_without_forward_ad",
        "fwd_over_rev_without_gradgrad",
        "fwd_over_rev_gradgrad_disabled",
        "batched_gradgrad_without_gradgrad",
        "batched_forward_grad_without_forward_ad",
    ],
)
def test_a_flag_whose_check_is_turned_off_is_reported_naming_the_key(keys, flag, disablers):
    (problem,) = _problems(f"op: torch.sin\n{keys}\n{SAMPLES}")
    assert f": {flag}: true has no effect with " in problem
    for disabler in disablers:
        assert f"`{disabler}` (line " in problem


def test_the_flags_that_take_effect_are_not_reported():
    checks = _checks(
        f"""
        op: torch.sin
        dtypes: [float64]
        lowprec_dtypes: [float32]
        gradcheck: {{check_forward_ad: true, check_batched_forward_grad: true}}
        gradgradcheck: {{check_fwd_over_rev: true, check_batched_grad: true}}
        {SAMPLES}
        """
    )
    assert checks == ("gradcheck", "forward_ad", "gradgradcheck", "fwgrad_bwgrad", "lowprec")


def test_false_flags_with_their_check_off_are_fine():
    checks = _checks(
        f"""
        op: torch.sin
        supports_forward_ad: false
        supports_gradgrad: false
        gradcheck: {{check_forward_ad: false, check_batched_forward_grad: false}}
        gradgradcheck: {{check_fwd_over_rev: false, check_batched_grad: false}}
        {SAMPLES}
        """
    )
    assert checks == ("gradcheck", "forward_ad_unsupported", "gradgrad_unsupported")


def test_no_grad_dtypes_turns_off_fwd_over_rev_but_not_the_lowprec_jvp():
    problems = _problems(
        """
        op: opcheck_spec_fixture:Square.apply
        dtypes: []
        lowprec_dtypes: [float32]
        reference: torch.square
        gradcheck: {check_forward_ad: true}
        gradgradcheck: {check_fwd_over_rev: true}
        samples: [{name: a, args: [{shape: [3]}]}]
        """
    )
    assert problems == [
        "x.yaml:7:17: gradgradcheck.check_fwd_over_rev: true has no effect with `dtypes: []` (line 3): "
        "no fwgrad_bwgrad test is generated; remove the flag, or the key that turns it off"
    ]


def test_a_family_default_is_not_reported_for_an_op_that_opts_out():
    specs = load_spec_text(
        textwrap.dedent(
            """
            defaults:
              gradcheck: {check_forward_ad: true, check_batched_forward_grad: true}
              gradgradcheck: {check_fwd_over_rev: true, check_batched_grad: true}
            ops:
              - op: torch.sin
                samples: [{name: a, args: [{shape: [3]}]}]
              - op: torch.cos
                supports_forward_ad: false
                supports_gradgrad: false
                samples: [{name: a, args: [{shape: [3]}]}]
            """
        ),
        source="x.yaml",
    )
    assert [spec.checks() for spec in specs] == [
        ("gradcheck", "forward_ad", "gradgradcheck", "fwgrad_bwgrad"),
        ("gradcheck", "forward_ad_unsupported", "gradgrad_unsupported"),
    ]
