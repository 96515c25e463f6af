"""Fuzzing: whatever the text, load_spec_text returns OpSpecs or raises SpecError, nothing else.

Four sources of input: arbitrary text, arbitrary YAML-able structures, structures grown from the
format's own keys with values that are mostly plausible and sometimes junk, so the fuzzer reaches
the deep rules (samples, tensors, where, families and their defaults) and not only the top-level
type check; and those structures written out as YAML that safe_dump never writes: anchors and
aliases (cycles too), `<<` merges, tags, numbers past their limits and deep nesting.

Each test runs a modest number of examples by default; OPCHECK_FUZZ_EXAMPLES=N runs N each
(e.g. `OPCHECK_FUZZ_EXAMPLES=20000 python -m pytest -p no:cacheprovider tests/spec/test_fuzz.py`).
"""

import itertools
import json
import math
import os

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opcheck.spec import SpecError, load_spec_text, model, schema_path
from opcheck.spec.model import OpSpec
from opcheck.spec.yamlload import MAX_DEPTH, nesting_bound


def _property_names(node) -> set[str]:
    if isinstance(node, list):
        return set().union(*map(_property_names, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    return set(node.get("properties", {})) | set().union(*map(_property_names, node.values()))


SCHEMA_KEYS = sorted(_property_names(json.loads(schema_path().read_text(encoding="utf-8"))))
_EXAMPLES = int(os.environ.get("OPCHECK_FUZZ_EXAMPLES", "0"))


def _fuzz(examples: int) -> settings:
    return settings(
        max_examples=_EXAMPLES or examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


FUZZ = _fuzz(200)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 50)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
keys = st.sampled_from(SCHEMA_KEYS) | st.text(max_size=8)
anything = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4), max_leaves=25
)


def _mostly(plausible, junk=anything):
    """Plausible values 29 times in 30: the fuzzer gets past the type checks to the deeper rules.

    Junk is a middle value of the roll: Hypothesis draws the bounds (0 above all) far more often
    than 1 in 30, and shrinks towards 0, which is then the plausible value.
    """
    return st.integers(0, 29).flatmap(lambda roll: junk if roll == 17 else plausible)


# Ops from a fixed set: a random path would import whatever module it happens to name.
ops = _mostly(
    st.sampled_from(
        [
            "torch.sin",
            "torch.add",
            "torch.nn.functional.softmax",
            "torch.ops.aten.mul.Tensor",
            "torch.Tensor.sum",
            "opcheck_spec_fixture:Square.apply",
        ]
    ),
    st.sampled_from(["torch.sinn", "no_such_mod_x.f", "torch..sin", "__import__('os')"]),
)
names = _mostly(st.sampled_from(["a", "b", "rows", "x.y", "B_2"]), st.sampled_from(["bad name", ""]))
numbers = st.integers(-3, 3) | st.floats(-3, 3) | st.sampled_from([float("inf"), float("nan")])
shapes = st.lists(_mostly(st.integers(0, 4)), max_size=3)
values = st.recursive(numbers | st.booleans(), lambda inner: st.lists(inner, max_size=3), max_leaves=8)
tensors = st.fixed_dictionaries(
    {"shape": _mostly(shapes)},
    optional={
        "dtype": _mostly(st.sampled_from(model.TENSOR_DTYPES)),
        "low": _mostly(numbers),
        "high": _mostly(numbers),
        "requires_grad": _mostly(st.booleans()),
        "noncontiguous": _mostly(st.booleans()),
        "maker": _mostly(st.sampled_from(model.MAKERS + ("spdd",))),
        "avoid": _mostly(st.lists(numbers, max_size=2)),
        "margin": _mostly(numbers),
        "values": _mostly(values),
    },
)
args = st.recursive(
    tensors | scalars | st.fixed_dictionaries({"dtype": st.sampled_from(model.TENSOR_DTYPES)}),
    lambda inner: st.lists(inner, max_size=3) | st.fixed_dictionaries({"tuple": st.lists(inner, max_size=3)}),
    max_leaves=6,
)
sources = st.one_of(
    st.fixed_dictionaries(
        {"args": _mostly(st.lists(args, min_size=1, max_size=3))},
        optional={
            "kwargs": _mostly(
                st.dictionaries(_mostly(st.sampled_from(["dim", "keepdim"]), st.just("bad key")), args, max_size=2)
            )
        },
    ),
    st.fixed_dictionaries({"generator": _mostly(st.just("opcheck_spec_fixture:small_inputs"), st.just("a b:c"))}),
    st.fixed_dictionaries({"opinfo": _mostly(st.sampled_from(["sin", "nn.functional.softmax:with_dtype"]))}),
)
samples = st.tuples(_mostly(names), sources).map(lambda pair: {"name": pair[0], **pair[1]})
sample_lists = _mostly(st.lists(samples, min_size=1, max_size=3, unique_by=lambda s: str(s["name"])))
where = st.fixed_dictionaries(
    {},
    optional={
        "device": _mostly(
            st.sampled_from(model.KNOWN_DEVICES)
            | st.lists(st.sampled_from(model.KNOWN_DEVICES), min_size=1, max_size=2)
        ),
        "check": _mostly(st.sampled_from(model.CHECKS)),
        "sample": _mostly(names | st.lists(names, min_size=1, max_size=2)),
        "dtype": _mostly(st.sampled_from(model.GRAD_DTYPES + model.LOWPREC_DTYPES)),
    },
)
tolerance_rules = st.lists(
    st.fixed_dictionaries(
        {"atol": _mostly(numbers)},
        optional={
            "where": _mostly(where),
            "eps": _mostly(numbers),
            "criterion": _mostly(st.sampled_from(model.LOWPREC_CRITERIA)),
            "factor": _mostly(numbers),
            "floor": _mostly(numbers),
            "reason": st.text(max_size=5),
        },
    ),
    max_size=2,
)
reason_rules = st.lists(
    st.fixed_dictionaries({"reason": _mostly(st.text(min_size=1, max_size=5))}, optional={"where": _mostly(where)}),
    max_size=2,
)
optional_keys = {
    "dtypes": _mostly(st.lists(st.sampled_from(model.GRAD_DTYPES), min_size=1, max_size=2, unique=True)),
    "lowprec_dtypes": _mostly(st.lists(st.sampled_from(model.LOWPREC_DTYPES), max_size=2, unique=True)),
    "devices": _mostly(st.lists(st.sampled_from(model.KNOWN_DEVICES), min_size=1, max_size=3, unique=True)),
    "variant": _mostly(st.sampled_from(["function", "method"])),
    "gradcheck": _mostly(
        st.fixed_dictionaries(
            {},
            optional={
                "fast_mode": st.sampled_from(["auto", True, False]),
                "atol": numbers,
                "check_forward_ad": st.booleans(),
            },
        )
    ),
    "library_opcheck": _mostly(st.booleans()),
    "requires": _mostly(
        st.lists(st.sampled_from(["json", "json.decoder", "no_such_module_xyz", "no_such.sub", "bad name"]), max_size=2)
    ),
    "clone_inputs": _mostly(st.booleans()),
    "reduced_precision": _mostly(
        st.fixed_dictionaries({}, optional={"tf32": st.booleans(), "reduced_precision_reduction": st.booleans()})
    ),
    "tolerances": _mostly(tolerance_rules),
    "skips": _mostly(reason_rules),
    "expected_failures": _mostly(reason_rules),
}
specs = st.fixed_dictionaries(
    {"op": ops, "samples": sample_lists},
    optional={"name": _mostly(st.sampled_from(["x", "sin_x"]), st.just("Bad")), **optional_keys},
)
family_entry = st.fixed_dictionaries(
    {"op": ops}, optional={"samples": sample_lists, "name": st.sampled_from(["p", "q"]), **optional_keys}
)
families = st.fixed_dictionaries(
    {
        "ops": _mostly(
            st.lists(
                # Now and then an entry without `op`, to see that the builder doesn't take one from defaults.
                _mostly(family_entry, family_entry.map(lambda entry: {k: v for k, v in entry.items() if k != "op"})),
                min_size=1,
                max_size=3,
            )
        )
    },
    # `op` and `name` do not belong in defaults: the builder must not read them when they are there.
    optional={
        "defaults": _mostly(
            st.fixed_dictionaries({}, optional={"samples": sample_lists, **optional_keys, "op": ops, "name": anything}),
            anything,
        )
    },
)


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
    assert [(s.name, s.args[0].shape) for s in spec.samples] == [
        (f"s{i}", tuple(shape)) for i, shape in enumerate(shapes)
    ]


# -- YAML that safe_dump never writes ----------------------------------------------------------

TAGS = [
    "!spec",
    "!",
    "!!str",
    "!!int",
    "!!float",
    "!!bool",
    "!!null",
    "!!map",
    "!!seq",
    "!!set",
    "!!omap",
    "!!binary",
    "!!python/tuple",
    "!!python/name:os.system",
    "!<tag:yaml.org,2002:str>",
]
# Scalars at and past the limits, and spellings YAML 1.1 and 1.2 read differently.
ODD_SCALARS = [
    ".nan",
    ".inf",
    "-.inf",
    "1e400",
    "-1e999",
    "1.7e308",
    "0x" + "f" * 400,
    "0x" + "f" * 5000,
    "9" * 309,
    "9" * 310,
    "9" * 4400,
    "!!float 0x" + "f" * 300,
    "!!int 1.5",
    "0o777",
    "0x1f",
    "~",
    "''",
    "yes",
    "1_000",
    "16777217",
    "100000000000000000000000",
    '"\\u0007"',
    "-0",
    "+.5",
]
NESTINGS = [2, 30, MAX_DEPTH - 5, MAX_DEPTH, MAX_DEPTH + 1, 150, 3000]


def _scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # JSON's escapes are YAML's double-quoted ones


def _decorated_yaml(draw, value, anchors: list[str], names=None) -> str:
    """`value` as flow-style YAML, with anchors, aliases, merges, tags, odd scalars and deep
    nesting drawn in at random places. `anchors` are those an alias may name here.

    Decorations are middle values of the roll (see _mostly): about one node in eight has one.
    """
    names = itertools.count() if names is None else names
    roll = draw(st.integers(0, 99))
    if anchors and 40 <= roll < 42:  # an alias instead of the value
        return "*" + draw(st.sampled_from(anchors))
    if roll == 42:
        return draw(st.sampled_from(ODD_SCALARS))
    if roll == 43:
        depth = draw(st.sampled_from(NESTINGS))
        opener = draw(st.sampled_from(["[", "{a: "]))
        closer = "]" if opener == "[" else "}"
        return opener * depth + _decorated_yaml(draw, value, anchors, names) + closer * depth
    props = ""
    if 44 <= roll < 46:
        props += draw(st.sampled_from(TAGS)) + " "
    anchor = None
    if 46 <= roll < 52:
        anchor = f"a{next(names)}"
        props += f"&{anchor} "
        if draw(st.booleans()):  # named before its value is written: an alias inside makes a cycle
            anchors.append(anchor)
            anchor = None
    if isinstance(value, dict):
        items = [
            f"{json.dumps(str(key))}: {_decorated_yaml(draw, item, anchors, names)}" for key, item in value.items()
        ]
        if anchors and draw(st.integers(0, 4)) == 2:
            sources = draw(st.lists(st.sampled_from(anchors), min_size=1, max_size=3))
            merge = "*" + sources[0] if len(sources) == 1 else "[" + ", ".join("*" + s for s in sources) + "]"
            items.insert(draw(st.integers(0, len(items))), "<<: " + merge)
        text = "{" + ", ".join(items) + "}"
    elif isinstance(value, list):
        text = "[" + ", ".join(_decorated_yaml(draw, item, anchors, names) for item in value) + "]"
    else:
        text = _scalar(value)
    if anchor is not None:
        anchors.append(anchor)
    return props + text


@_fuzz(150)
@given(st.data(), specs | families)
def test_decorated_yaml_grown_from_the_format(data, document):
    _load_never_crashes(_decorated_yaml(data.draw, document, []))


@_fuzz(100)
@given(st.data(), anything)
def test_decorated_yaml_of_arbitrary_structures(data, document):
    _load_never_crashes(_decorated_yaml(data.draw, document, []))


@_fuzz(60)
@given(st.data(), specs | families, st.sampled_from(NESTINGS), st.sampled_from(["- ", "? ", "  "]))
def test_deep_block_nesting(data, document, depth, step):
    # Block nesting: compact (`- - - x`, `? ? ? x`) or by indentation, at any key of a document.
    key = data.draw(st.sampled_from(["x", "samples", "gradcheck", "ops", "defaults"]))
    if step == "  ":  # the text grows with the square of the depth: a few levels past the limit do
        depth = min(depth, MAX_DEPTH + 5)
        nested = "".join(f"\n{'  ' * (i + 1)}k{i}:" for i in range(depth)) + " 1"
    else:
        nested = "\n  " + step * depth + "1"
    _load_never_crashes(yaml.safe_dump(document, sort_keys=False) + f"{key}:{nested}\n")


def _composed_depth(text: str) -> int | None:
    """The key-path length of the deepest value PyYAML composes from `text` (None: not YAML)."""
    deepest = open_ = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
                deepest = max(deepest, open_)
            if isinstance(event, yaml.CollectionStartEvent):
                open_ += 1
            elif isinstance(event, yaml.CollectionEndEvent):
                open_ -= 1
    except yaml.YAMLError:
        return None
    return deepest


@_fuzz(150)
@given(st.data(), specs | families | anything, st.booleans())
def test_nesting_bound_is_never_below_the_real_depth(data, document, block):
    # What keeps deep text from libyaml is this bound; it may overestimate, never underestimate.
    if block:
        text = yaml.safe_dump(
            document,
            sort_keys=False,
            default_flow_style=data.draw(st.sampled_from([False, None])),
            width=data.draw(st.sampled_from([20, 80, 10_000])),
        )
    else:
        text = _decorated_yaml(data.draw, document, [])
    depth = _composed_depth(text)
    if depth is not None:
        assert nesting_bound(text, 10**9) >= depth
