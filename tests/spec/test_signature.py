"""Samples' arguments checked against the op's Python signature, where it has one."""

import functools
import inspect
import textwrap

import opcheck_spec_fixture
import pytest
import torch

from opcheck.spec import SpecError, load_spec_text
from opcheck.spec.signature import callable_signature, describe


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(textwrap.dedent(text), source="x.yaml")
    return [str(p) for p in info.value.problems]


def _loads(text: str) -> None:
    assert load_spec_text(textwrap.dedent(text), source="x.yaml")


def _wrapped(*args, **kwargs):
    return opcheck_spec_fixture.scaled(*args, **kwargs)


@pytest.mark.parametrize(
    "obj",
    [
        torch.sin,  # a builtin
        opcheck_spec_fixture.Square.apply,  # autograd.Function.apply takes *args
        opcheck_spec_fixture.takes_anything,
        torch.ops.aten.mul.Tensor,
        torch.Tensor.mul,
        torch.nn.Linear,  # a class: not judged
        functools.wraps(opcheck_spec_fixture.scaled)(_wrapped),  # what a wrapper takes is not known
    ],
    ids=["builtin", "function_apply", "var_positional", "overload", "method_descriptor", "class", "wrapper"],
)
def test_no_signature_when_python_cannot_tell(obj):
    assert callable_signature(obj) is None


def test_signature_of_python_functions_and_methods():
    assert str(callable_signature(torch.nn.functional.softmax)).startswith("(input")
    assert str(callable_signature(torch.Tensor.split)) == "(self, split_size, dim=0)"


def test_describe_shows_parameter_kinds_without_defaults():
    sig = inspect.signature(opcheck_spec_fixture.scaled)
    assert describe(sig) == "(x, /, scale=..., *, shift)"
    assert describe(inspect.signature(opcheck_spec_fixture.with_options)) == "(x, **options)"
    assert describe(inspect.signature(lambda a, *, b=1: a)) == "(a, *, b=...)"


def test_positional_only_and_keyword_only_parameters():
    problems = _problems(
        """
        op: opcheck_spec_fixture:scaled
        samples:
          - name: x_by_name
            kwargs: {x: {shape: [3]}, shift: 1.0}
          - name: shift_positionally
            args: [{shape: [3]}, 2.0, 1.0]
          - name: fine
            args: [{shape: [3]}]
            kwargs: {scale: 2.0, shift: 1.0}
        """
    )
    call = "opcheck_spec_fixture:scaled(x, /, scale=..., *, shift)"
    assert problems == [
        f"x.yaml:5:14: samples[0].kwargs.x: 'x' is positional-only in {call}; pass it in `args`",
        f"x.yaml:7:5: samples[1].args: {call} is missing 1 required argument: 'shift'",
        f"x.yaml:7:5: samples[1].args: {call} takes at most 2 positional arguments, got 3",
    ]


def test_var_keyword_takes_any_keyword():
    _loads(
        """
        op: opcheck_spec_fixture:with_options
        samples:
          - name: a
            args: [{shape: [3]}]
            kwargs: {anything: 1, x_again: 2}
        """
    )


def test_method_variant_binds_self_to_args_0():
    problems = _problems(
        """
        op: torch.Tensor.split
        variant: method
        samples:
          - name: ok
            args: [{shape: [4]}, 2]
            kwargs: {dim: 0}
          - name: typo
            args: [{shape: [4]}, 2]
            kwargs: {dimm: 0}
        """
    )
    assert problems == [
        "x.yaml:10:14: samples[1].kwargs.dimm: unknown keyword argument 'dimm' for "
        "torch.Tensor.split(self, split_size, dim=...); did you mean 'dim'?"
    ]


def test_unknown_signatures_and_generated_samples_are_not_judged():
    _loads(
        """
        op: opcheck_spec_fixture:Square.apply
        samples:
          - name: too_many_for_square
            args: [{shape: [3]}, 1, 2]
        """
    )
    _loads(
        """
        op: torch.nn.functional.softmax
        samples:
          - name: from_generator
            generator: opcheck_spec_fixture:small_inputs
        """
    )


def test_a_problem_inside_an_argument_leaves_the_call_judged():
    # The misspelled keyword used to be reported only once the tensor's unknown key was fixed.
    problems = _problems(
        """
        op: torch.nn.functional.softmax
        samples:
          - name: rows
            args: [{shape: [3, 5], lo: -1}]
            kwargs: {dimm: -1}
          - args: [{shape: [4]}, 0, 3, null, 5]
        """
    )
    call = "torch.nn.functional.softmax(input, dim=..., _stacklevel=..., dtype=...)"
    assert problems == [
        "x.yaml:5:28: samples[0].args[0].lo: unknown key 'lo'; did you mean 'low'?",
        f"x.yaml:6:14: samples[0].kwargs.dimm: unknown keyword argument 'dimm' for {call}; did you mean 'dim'?",
        "x.yaml:7:5: samples[1]: missing required key 'name'",
        f"x.yaml:7:5: samples[1].args: {call} takes at most 4 positional arguments, got 5",
    ]


def test_keywords_are_judged_when_args_cannot_be_read():
    # What args binds is unknown: neither "also given positionally" nor a missing argument is said.
    problems = _problems(
        """
        op: opcheck_spec_fixture:scaled
        samples:
          - name: a
            args: {shape: [3]}
            kwargs: {x: 1.0, scael: 2.0}
        """
    )
    call = "opcheck_spec_fixture:scaled(x, /, scale=..., *, shift)"
    assert problems == [
        "x.yaml:5:11: samples[0].args: expected a list of arguments, got a mapping",
        f"x.yaml:6:14: samples[0].kwargs.x: 'x' is positional-only in {call}; pass it in `args`",
        f"x.yaml:6:22: samples[0].kwargs.scael: unknown keyword argument 'scael' for {call}; did you mean 'scale'?",
    ]


@pytest.mark.parametrize(
    "sample, problem",
    [
        ("{name: a, args: [{shape: [3]}], kwarg: {shift: 1.0}}", "samples[0].kwarg: unknown key 'kwarg'"),
        ("{name: a, args: [{shape: [3]}], kwargs: {shift!: 1.0}}", "samples[0].kwargs['shift!']: expected a keyword"),
    ],
    ids=["unknown_key_in_the_sample", "keyword_that_is_no_identifier"],
)
def test_no_argument_is_said_missing_while_a_key_of_the_sample_is_not_understood(sample: str, problem: str):
    # The key may be the one that passes the argument that seems missing ('shift'); a keyword
    # the schema refused is reported once, by the schema.
    [reported] = _problems(f"op: opcheck_spec_fixture:scaled\nsamples: [{sample}]\n")
    assert problem in reported
