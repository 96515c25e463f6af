"""The YAML layer: locations, duplicate keys, merges, YAML 1.2 scalars, and pathological input."""

import pytest

from opcheck.spec import SpecError, load_spec_text, yamlload
from opcheck.spec.model import Location
from opcheck.spec.yamlload import MAX_DEPTH, MAX_NODES, load_yaml


def _errors(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, source="s.yaml")
    return [str(p) for p in info.value.problems]


def test_every_node_knows_its_line_column_path_and_key():
    doc = load_yaml("op: torch.sin\nsamples:\n  - name: a\n    args: [{shape: [3, 4]}]\n", "s.yaml")
    dim = doc.root.at(("samples", 0, "args", 0, "shape", 1))
    assert (dim.value, dim.loc, dim.path) == (4, Location("s.yaml", 4, 24), ("samples", 0, "args", 0, "shape", 1))
    name = doc.root.at(("samples", 0, "name"))
    assert (name.loc, name.key_loc) == (Location("s.yaml", 3, 11), Location("s.yaml", 3, 5))
    assert doc.problems == [] and doc.tainted == set()


def test_duplicate_keys_at_any_depth_point_at_the_second():
    text = ("op: torch.sin\n"
            "samples:\n"
            "  - name: a\n"
            "    args: [{shape: [3], shape: [4]}]\n"
            "gradcheck: {atol: 1.0, atol: 2.0}\n")
    assert _errors(text) == [
        "s.yaml:4:25: samples[0].args[0].shape: duplicate key 'shape' (first at 4:13)",
        "s.yaml:5:24: gradcheck.atol: duplicate key 'atol' (first at 5:13)",
    ]


def test_a_key_given_after_a_merge_overrides_it_and_is_no_duplicate():
    doc = load_yaml("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n", "s.yaml")
    assert doc.root.plain() == {"base": {"x": 1, "y": 2}, "use": {"x": 1, "y": 3}}
    assert doc.problems == []
    # The merged value keeps the location where the anchor wrote it.
    assert doc.root.at(("use", "x")).loc == Location("s.yaml", 1, 14)


def test_earlier_merge_sources_win():
    doc = load_yaml("a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc: {<<: [*a, *b]}\n", "s.yaml")
    assert doc.root.plain()["c"] == {"x": 1, "y": 2}


def test_merging_a_scalar_is_a_problem():
    assert _errors("op: torch.sin\n<<: 3\n") == [
        "s.yaml:1:1: missing required key 'samples'",
        "s.yaml:2:5: '<<' merges a mapping or a list of mappings (e.g. `<<: *defaults`)",
    ]


def test_malformed_yaml_is_located():
    assert _errors("op: torch.sin\nsamples: [\n") == [
        "s.yaml:3:1: malformed YAML: expected the node content, but found '<stream end>'"
        " (while parsing a flow node at 3:1)"]


def test_unprintable_character_is_located():
    assert _errors("op: torch.sin\nname: a\x07b\n") == [
        "s.yaml:2:8: malformed YAML: character U+0007 is not allowed in YAML text"]


def test_alias_bomb_is_stopped_after_a_bounded_number_of_values(monkeypatch):
    # Nine levels of ten aliases each stand for 10**9 values. Past MAX_NODES every value still to
    # be converted is refused without looking inside it, so the converter sees only a handful
    # more; one that kept expanding is stopped here rather than left to run for minutes.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, "
              f"*a{i-1}]" for i in range(1, 9)]
    visits = 0
    convert = yamlload._Converter.convert

    def counted(self, *args, **kwargs):
        nonlocal visits
        visits += 1
        if visits > 2 * MAX_NODES:
            raise AssertionError("the converter expands aliases past MAX_NODES")
        return convert(self, *args, **kwargs)

    monkeypatch.setattr(yamlload._Converter, "convert", counted)
    errors = _errors("\n".join(lines) + "\n")
    assert any("too many values (over 100000, after expanding aliases)" in e for e in errors)
    assert MAX_NODES < visits <= MAX_NODES + 9 * 10  # at most the pending siblings: ten per level


def test_deep_nesting_is_a_problem_not_a_crash():
    shallow_enough = "x: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"
    assert any(f"nested deeper than {MAX_DEPTH} levels" in e for e in _errors(shallow_enough))
    very_deep = "x: " + "[" * 5000 + "]" * 5000 + "\n"
    # libyaml composes it and the converter stops at MAX_DEPTH; the pure-Python parser runs out
    # of stack first. Either way: one clear problem, no crash.
    assert any("nested deeper than" in e or "nesting too deep" in e for e in _errors(very_deep))


@pytest.mark.parametrize("text, value", [
    ("1e-4", 1e-4), ("1.0e-4", 1e-4), ("-3", -3), ("+7", 7), ("010", 10), ("0o10", 8), ("0x1f", 31),
    (".5", 0.5), ("1.", 1.0), (".inf", float("inf")), ("-.Inf", float("-inf")), ("TRUE", True),
    ("False", False), ("~", None), ("null", None), ("", None), ("yes", "yes"), ("off", "off"),
    ("1_000", "1_000"), ("1:30", "1:30"), ("2024-01-01", "2024-01-01"), ("'1e-4'", "1e-4"),
])
def test_scalars_follow_the_yaml_1_2_core_schema(text, value):
    got = load_yaml(f"v: {text}\n", "s.yaml").root.plain()["v"]
    assert got == value and type(got) is type(value)


def test_nan_is_a_float():
    got = load_yaml("v: .nan\n", "s.yaml").root.plain()["v"]
    assert isinstance(got, float) and got != got


@pytest.mark.parametrize("text, message", [
    ("v: !!int 1.5\n", "s.yaml:1:4: v: '1.5' is not a valid !!int"),
    ("v: !!bool yes\n", "s.yaml:1:4: v: 'yes' is not a valid !!bool"),
    ("v: !!set {a}\n", "s.yaml:1:4: v: unsupported YAML tag '!!set'"),
    ("v: !custom 1\n", "s.yaml:1:4: v: unsupported YAML tag '!custom'"),
    ("? [a]\n: 1\n", "s.yaml:1:3: expected a string key, got a collection"),
])
def test_tags_outside_the_core_schema_are_refused(text, message):
    assert message in [str(p) for p in load_yaml(text, "s.yaml").problems]


def test_numbers_beyond_range_are_problems_with_short_messages():
    huge = "9" * 400
    errors = _errors(f"op: torch.sin\nsamples: [{{name: a, args: [{{shape: [2], low: {huge}}}]}}]\n"
                     f"gradcheck: {{atol: {'9' * 5000}}}\n")
    assert errors == [
        "s.yaml:2:46: samples[0].args[0].low: expected a finite number, got "
        "99999999999999999999999999999999999999999999999999999999...",
        "s.yaml:3:19: gradcheck.atol: '9999999999999999999999999999999999999999999999999999999...' is not a "
        "valid !!int",
    ]
