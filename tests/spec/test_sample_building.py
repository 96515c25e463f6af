"""build_sample: what it checks of a sample the schema found a problem in, which it never builds."""

import pytest

from opcheck.spec.checker import Checker
from opcheck.spec.model import Sample
from opcheck.spec.samples import build_sample
from opcheck.spec.validate import schema_problems
from opcheck.spec.yamlload import load_yaml

NO_GRAD = "no argument requires grad: gradcheck needs at least one floating-point or complex tensor argument"
NOT_SQUARE = "maker 'symmetric' needs at least 2 dims with square last two (e.g. [3, 3] or [2, 4, 4]), got shape [3, 4]"


def _build(sample: str) -> tuple[Sample | None, list[str]]:
    """The first sample of a spec, built beside the schema's problems; the builder's problems."""
    root = load_yaml(f"op: torch.sin\nsamples: [{sample}]\n", "s.yaml").root
    assert root is not None
    ctx = Checker({path for path, _ in schema_problems(root)})
    return build_sample(ctx, root.at(("samples", 0))), [problem.message for problem in ctx.problems]


def test_a_clean_sample_is_built():
    sample, problems = _build("{name: a, args: [{shape: [3]}], kwargs: {dim: 0}}")
    assert problems == [] and sample is not None and sample.kwargs == (("dim", 0),)


@pytest.mark.parametrize(
    "sample",
    [
        "{name: a, args: [{shape: [3], lo: 1}, {shape: [3, 4], maker: symmetric}]}",
        "{name: a, args: [{shape: x}, {shape: [3, 4], maker: symmetric}]}",
        "{name: a, args: [{low: 1}, {shape: [3, 4], maker: symmetric}]}",
        "{name: a, args: [{shape: [3, 4], maker: symmetric}], kwargs: {bad-key: 1}}",
        "{name: a, args: [{shape: [3, 4], maker: symmetric}], note: x}",
        "{args: [{shape: [3, 4], maker: symmetric}]}",
    ],
    ids=[
        "beside_an_unknown_key_of_an_argument",
        "beside_a_mistyped_argument",
        "beside_an_argument_without_shape",
        "beside_a_keyword",
        "beside_an_unknown_key",
        "without_a_name",
    ],
)
def test_a_sample_the_schema_refused_is_not_built_but_its_clean_arguments_are_checked(sample: str):
    assert _build(sample) == (None, [NOT_SQUARE])


def test_whether_an_argument_requires_grad_waits_for_every_argument_and_key():
    # The refused argument, or the unknown key (a misspelled `kwargs`?), may be the one that does.
    assert _build("{name: a, args: [{shape: [3], dtype: int64}, {shape: [3], lo: 1}]}") == (None, [])
    assert _build("{name: a, args: [{shape: [3], dtype: int64}], kwarg: {x: {shape: [3]}}}") == (None, [])
    # A problem of an argument's own says nothing about it.
    _, problems = _build("{name: a, args: [{shape: [3], dtype: int8, high: 1000}]}")
    assert problems == [
        "expected low and high within [-128, 128] for a tensor of dtype int8, got low 0 by default and high 1000",
        NO_GRAD,
    ]
    # Nor a missing name.
    assert _build("{args: [{shape: [3], dtype: int64}]}") == (None, [NO_GRAD])


def test_the_source_of_a_sample_waits_for_its_keys():
    # `generatr` may be the missing source, misspelled.
    assert _build("{name: a, generatr: 'm:f'}") == (None, [])
    assert _build("{generator: 'm:f', args: [{shape: [3]}]}") == (
        None,
        ["a sample needs exactly one of args/kwargs, generator or opinfo; got args/kwargs and generator"],
    )
