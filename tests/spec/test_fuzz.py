"""Fuzzing: whatever the text, load_spec_text returns OpSpecs or raises SpecError, nothing else.

Three sources of input: arbitrary text, arbitrary YAML-able structures, and structures grown from
the format's own keys with values that are mostly plausible and sometimes junk, so the fuzzer
reaches the deep rules (samples, tensors, where) and not only the top-level type check.
"""

import json

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opcheck.spec import SpecError, load_spec_text, schema_path
from opcheck.spec import model
from opcheck.spec.model import OpSpec



def _property_names(node) -> set[str]:
    if isinstance(node, list):
        return set().union(*map(_property_names, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    return set(node.get("properties", {})) | set().union(*map(_property_names, node.values()))


SCHEMA_KEYS = sorted(_property_names(json.loads(schema_path().read_text(encoding="utf-8"))))
FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = (st.none() | st.booleans() | st.integers(-5, 50) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=12))
keys = st.sampled_from(SCHEMA_KEYS) | st.text(max_size=8)
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                        max_leaves=25)


def _mostly(plausible, junk=anything):
    """Plausible values 29 times in 30: the fuzzer gets past the type checks to the deeper rules."""
    return st.integers(0, 29).flatmap(lambda roll: plausible if roll else junk)


# Ops from a fixed set: a random path would import whatever module it happens to name.
ops = _mostly(st.sampled_from(["torch.sin", "torch.add", "torch.nn.functional.softmax", "torch.ops.aten.mul.Tensor",
                               "torch.Tensor.sum", "opcheck_spec_fixture:Square.apply"]),
              st.sampled_from(["torch.sinn", "no_such_mod_x.f", "torch..sin", "__import__('os')"]))
names = _mostly(st.sampled_from(["a", "b", "rows", "x.y", "B_2"]), st.sampled_from(["bad name", ""]))
numbers = st.integers(-3, 3) | st.floats(-3, 3) | st.sampled_from([float("inf"), float("nan")])
shapes = st.lists(_mostly(st.integers(0, 4)), max_size=3)
values = st.recursive(numbers | st.booleans(), lambda inner: st.lists(inner, max_size=3), max_leaves=8)
tensors = st.fixed_dictionaries({"shape": _mostly(shapes)}, optional={
    "dtype": _mostly(st.sampled_from(model.TENSOR_DTYPES)),
    "low": _mostly(numbers), "high": _mostly(numbers),
    "requires_grad": _mostly(st.booleans()), "noncontiguous": _mostly(st.booleans()),
    "maker": _mostly(st.sampled_from(model.MAKERS + ("spdd",))),
    "avoid": _mostly(st.lists(numbers, max_size=2)), "margin": _mostly(numbers), "values": _mostly(values),
})
args = st.recursive(tensors | scalars | st.fixed_dictionaries({"dtype": st.sampled_from(model.TENSOR_DTYPES)}),
                    lambda inner: st.lists(inner, max_size=3) | st.fixed_dictionaries({"tuple": st.lists(inner, max_size=3)}),
                    max_leaves=6)
sources = st.one_of(
    st.fixed_dictionaries({"args": _mostly(st.lists(args, min_size=1, max_size=3))}, optional={
        "kwargs": _mostly(st.dictionaries(_mostly(st.sampled_from(["dim", "keepdim"]), st.just("bad key")), args,
                                          max_size=2))}),
    st.fixed_dictionaries({"generator": _mostly(st.just("opcheck_spec_fixture:small_inputs"), st.just("a b:c"))}),
    st.fixed_dictionaries({"opinfo": _mostly(st.sampled_from(["sin", "nn.functional.softmax:with_dtype"]))}),
)
samples = st.tuples(_mostly(names), sources).map(lambda pair: {"name": pair[0], **pair[1]})
sample_lists = _mostly(st.lists(samples, min_size=1, max_size=3, unique_by=lambda s: str(s["name"])))
where = st.fixed_dictionaries({}, optional={
    "device": _mostly(st.sampled_from(model.KNOWN_DEVICES) | st.lists(st.sampled_from(model.KNOWN_DEVICES),
                                                                       min_size=1, max_size=2)),
    "check": _mostly(st.sampled_from(model.CHECKS)),
    "sample": _mostly(names | st.lists(names, min_size=1, max_size=2)),
    "dtype": _mostly(st.sampled_from(model.GRAD_DTYPES + model.LOWPREC_DTYPES)),
})
tolerance_rules = st.lists(st.fixed_dictionaries({"atol": _mostly(numbers)}, optional={
    "where": _mostly(where), "eps": _mostly(numbers), "reason": st.text(max_size=5)}), max_size=2)
reason_rules = st.lists(st.fixed_dictionaries({"reason": _mostly(st.text(min_size=1, max_size=5))}, optional={
    "where": _mostly(where)}), max_size=2)
optional_keys = {
    "dtypes": _mostly(st.lists(st.sampled_from(model.GRAD_DTYPES), min_size=1, max_size=2, unique=True)),
    "devices": _mostly(st.lists(st.sampled_from(model.KNOWN_DEVICES), min_size=1, max_size=3, unique=True)),
    "variant": _mostly(st.sampled_from(["function", "method"])),
    "gradcheck": _mostly(st.fixed_dictionaries({}, optional={"fast_mode": st.sampled_from(["auto", True, False]),
                                                             "atol": numbers, "check_forward_ad": st.booleans()})),
    "library_opcheck": _mostly(st.booleans()),
    "tolerances": _mostly(tolerance_rules), "skips": _mostly(reason_rules),
    "expected_failures": _mostly(reason_rules),
}
specs = st.fixed_dictionaries({"op": ops, "samples": sample_lists},
                              optional={"name": _mostly(st.sampled_from(["x", "sin_x"]), st.just("Bad")),
                                        **optional_keys})
families = st.fixed_dictionaries({"ops": st.lists(st.fixed_dictionaries({"op": ops}, optional={
    "samples": sample_lists, "name": st.sampled_from(["p", "q"])}), min_size=1, max_size=3)},
    optional={"defaults": st.fixed_dictionaries({}, optional={"samples": sample_lists, **optional_keys})})


def _load_never_crashes(text: str) -> None:
    try:
        result = load_spec_text(text, source="fuzz.yaml")
    except SpecError as e:
        assert e.problems and all(str(p).startswith("fuzz.yaml") for p in e.problems)
        return
    assert isinstance(result, list) and all(isinstance(spec, OpSpec) for spec in result)
    assert all(hash(spec) is not None for spec in result)


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text(text):
    _load_never_crashes(text)


@FUZZ
@given(anything)
@example({"defaults": None, "skips": [{}]})  # a family without ops; the skip has no reason
@example({"op": None, "os": None})  # `os` is nearly `ops`: still one op, whose op is null
def test_arbitrary_structures(data):
    _load_never_crashes(yaml.safe_dump(data))


@FUZZ
@given(specs | families)
def test_structures_grown_from_the_format(data):
    _load_never_crashes(yaml.safe_dump(data, sort_keys=False))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=4, unique_by=tuple))
def test_valid_specs_round_trip(shapes):
    samples = [{"name": f"s{i}", "args": [{"shape": shape}]} for i, shape in enumerate(shapes)]
    [spec] = load_spec_text(yaml.safe_dump({"op": "torch.sin", "samples": samples}), source="fuzz.yaml")
    assert [(s.name, s.args[0].shape) for s in spec.samples] == [(f"s{i}", tuple(shape))
                                                                 for i, shape in enumerate(shapes)]
