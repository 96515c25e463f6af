"""The YAML layer: locations, duplicate keys, merges, YAML 1.2 scalars, and pathological input."""

import subprocess
import sys

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
    text = (
        "op: torch.sin\n"
        "samples:\n"
        "  - name: a\n"
        "    args: [{shape: [3], shape: [4]}]\n"
        "gradcheck: {atol: 1.0, atol: 2.0}\n"
    )
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
        " (while parsing a flow node at 3:1)"
    ]


def test_unprintable_character_is_located():
    assert _errors("op: torch.sin\nname: a\x07b\n") == [
        "s.yaml:2:8: malformed YAML: character U+0007 is not allowed in YAML text"
    ]


def test_alias_bomb_is_stopped_after_a_bounded_number_of_values(monkeypatch):
    # Nine levels of ten aliases each stand for 10**9 values. Past MAX_NODES every value still to
    # be converted is refused without looking inside it, so the converter sees only a handful
    # more; one that kept expanding is stopped here rather than left to run for minutes.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
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


def test_deep_nesting_is_one_located_problem():
    text = "op: torch.sin\nx: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"
    [problem] = _errors(text)
    # The document stops at the first value past the limit, at its line and column, with its path.
    assert problem == f"s.yaml:2:{4 + MAX_DEPTH}: x{'[0]' * MAX_DEPTH}: nesting deeper than {MAX_DEPTH} levels"


@pytest.mark.parametrize("kind", ["flow", "flow_mapping", "block_sequence", "block_mapping", "unclosed"])
def test_deep_nesting_never_reaches_libyaml(monkeypatch, kind):
    # libyaml built without its own nesting limit takes time and memory per level; PyYAML's
    # Cython composer recursed in C per level and segfaulted past about 100,000 of them.
    deep = {
        "flow": "x: " + "[" * 5000 + "]" * 5000,
        "flow_mapping": "x: " + "{a: " * 5000 + "1" + "}" * 5000,
        "block_sequence": "x:\n" + "- " * 5000 + "a",
        "block_mapping": "".join(" " * i + f"k{i}:\n" for i in range(150)) + " " * 150 + "v",
        "unclosed": "x: " + "[" * 5000,
    }[kind] + "\n"
    seen = []

    class Recording(yamlload._CComposer):
        def __init__(self, text):
            seen.append(text)
            super().__init__(text)

    monkeypatch.setattr(yamlload, "_CComposer", Recording)
    [problem] = _errors(deep)
    assert problem.endswith(f": nesting deeper than {MAX_DEPTH} levels") and problem.startswith("s.yaml:")
    assert seen == []
    # Shallow text still goes to libyaml.
    load_yaml("x: [[1]]\n", "s.yaml")
    assert seen == ["x: [[1]]\n"]


def test_both_composers_stop_at_the_depth_limit_without_recursing():
    # The guard, not the stack, stops deep input, whichever parser reads it (the pre-scan decides
    # which one does, so a text it misjudged still cannot overflow anything).
    text = "x: " + "[" * 900 + "]" * 900 + "\n"  # this libyaml stops at 1000 by itself
    for composer in filter(None, [yamlload._Composer, yamlload._CComposer]):
        with pytest.raises(yamlload._TooDeep) as info:
            yamlload._compose_with(composer, text)
        assert len(info.value.path) == MAX_DEPTH + 1 and info.value.mark.column == 3 + MAX_DEPTH


def test_a_hundred_thousand_brackets_are_a_problem_in_a_subprocess():
    # A segfault would kill the test run itself; in a child process it is a failed assertion.
    code = (
        "from opcheck.spec import SpecError, load_spec_text\n"
        "try:\n"
        "    load_spec_text('x: ' + '[' * 100_000 + ']' * 100_000 + '\\n', source='s.yaml')\n"
        "except SpecError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"s.yaml:1:{4 + MAX_DEPTH}: x{'[0]' * MAX_DEPTH}: nesting deeper than {MAX_DEPTH} levels\n"


def test_aliases_cannot_nest_past_the_limit_either():
    # Each alias adds a level without a bracket in the text: the converter counts the levels.
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, MAX_DEPTH + 5)]
    errors = _errors("\n".join(lines) + "\n")
    assert any(e.endswith(f"nesting deeper than {MAX_DEPTH} levels (after expanding aliases)") for e in errors)


@pytest.mark.parametrize(
    "text, bound",
    [
        ("a: 1\n", 2),
        ("a: [[1]]\n", 4),
        ("a:\n  - b: [1]\n", 11),
        ("- - - x\n", 14),
        ("a: '[[[['\n", 2),
        ('a: "[[\\"[["\n', 2),
        ("a: [1] # [[[[\n", 3),
        ("a: |\n  [[[[\nb: 1\n", 6),
        ("a: don't [x]\n", 3),
        ("a: &x '[['\n", 2),
        ('a: !t "[["\n', 2),
    ],
)
def test_nesting_bound_counts_structure_not_text_inside_scalars(text, bound):
    assert yamlload.nesting_bound(text, 1000) == bound


@pytest.mark.parametrize(
    "text, value",
    [
        ("1e-4", 1e-4),
        ("1.0e-4", 1e-4),
        ("-3", -3),
        ("+7", 7),
        ("010", 10),
        ("0o10", 8),
        ("0x1f", 31),
        (".5", 0.5),
        ("1.", 1.0),
        (".inf", float("inf")),
        ("-.Inf", float("-inf")),
        ("TRUE", True),
        ("False", False),
        ("~", None),
        ("null", None),
        ("", None),
        ("yes", "yes"),
        ("off", "off"),
        ("1_000", "1_000"),
        ("1:30", "1:30"),
        ("2024-01-01", "2024-01-01"),
        ("'1e-4'", "1e-4"),
    ],
)
def test_scalars_follow_the_yaml_1_2_core_schema(text, value):
    got = load_yaml(f"v: {text}\n", "s.yaml").root.plain()["v"]
    assert got == value and type(got) is type(value)


def test_nan_is_a_float():
    got = load_yaml("v: .nan\n", "s.yaml").root.plain()["v"]
    assert isinstance(got, float) and got != got


@pytest.mark.parametrize(
    "text, message",
    [
        ("v: !!int 1.5\n", "s.yaml:1:4: v: '1.5' is not a valid !!int"),
        ("v: !!bool yes\n", "s.yaml:1:4: v: 'yes' is not a valid !!bool"),
        ("v: !!set {a}\n", "s.yaml:1:4: v: unsupported YAML tag '!!set'"),
        ("v: !custom 1\n", "s.yaml:1:4: v: unsupported YAML tag '!custom'"),
        ("? [a]\n: 1\n", "s.yaml:1:3: expected a string key, got a collection"),
    ],
)
def test_tags_outside_the_core_schema_are_refused(text, message):
    assert message in [str(p) for p in load_yaml(text, "s.yaml").problems]


def test_numbers_beyond_range_are_problems_with_short_messages():
    huge = "9" * 400
    errors = _errors(
        f"op: torch.sin\nsamples: [{{name: a, args: [{{shape: [2], low: {huge}}}]}}]\n"
        f"gradcheck: {{atol: {'9' * 5000}}}\n"
    )
    assert errors == [
        "s.yaml:2:46: samples[0].args[0].low: expected an integer of at most 309 digits, got "
        "'9999999999999999999999999999999999999999999999999999999...' (400 digits)",
        "s.yaml:3:19: gradcheck.atol: expected an integer of at most 309 digits, got "
        "'9999999999999999999999999999999999999999999999999999999...' (5000 digits)",
    ]


@pytest.mark.parametrize("text", ["0x" + "f" * 5000, "0o" + "7" * 5000, "-" + "1" * 4301])
def test_integers_past_the_digit_limit_are_refused_before_python_converts_them(text):
    # Python refuses str(int) past 4300 digits (ValueError in every message that shows one) and
    # int(str) likewise; hexadecimal and octal are converted without a limit, and break later.
    doc = load_yaml(f"v: {text}\n", "s.yaml")
    digits = len(text.lstrip("-")) - (2 if text.startswith("0") else 0)
    assert [str(p) for p in doc.problems] == [
        f"s.yaml:1:4: v: expected an integer of at most {yamlload.MAX_INT_DIGITS} digits, got {text[:55]!r}"[:-1]
        + f"...' ({digits} digits)"
    ]
    assert doc.tainted == {("v",)}


def test_an_integer_past_the_digit_limit_in_a_shape_is_a_problem_not_a_crash():
    assert _errors(f"op: torch.sin\nsamples: [{{name: a, args: [{{shape: [0x{'f' * 5000}]}}]}}]\n") == [
        "s.yaml:2:37: samples[0].args[0].shape[0]: expected an integer of at most 309 digits, got "
        "'0xfffffffffffffffffffffffffffffffffffffffffffffffffffff...' (5000 digits)"
    ]


@pytest.mark.parametrize("text", ["!!float 0x" + "f" * 300, "1e400", "-1.5e999", "!!float " + "9" * 400])
def test_floats_beyond_float64_are_problems(text):
    doc = load_yaml(f"v: {text}\n", "s.yaml")
    [problem] = doc.problems
    assert "v: expected a number within float64's range (about ±1.8e308), got '" in str(problem)
    assert doc.tainted == {("v",)}


def test_floats_written_as_infinity_are_still_floats():
    assert load_yaml("v: [.inf, -.inf, 1.7e308, !!float 0x10]\n", "s.yaml").root.plain()["v"] == [
        float("inf"),
        float("-inf"),
        1.7e308,
        16.0,
    ]


def test_merging_a_value_that_contains_the_merge_is_a_cycle_not_a_crash():
    assert _errors("op: torch.sin\nsamples: [{name: a, args: [{shape: [2]}]}]\ngradcheck: &g {<<: *g}\n") == [
        "s.yaml:3:12: gradcheck: an alias refers to a value that contains it (a cycle)"
    ]


def test_merge_bomb_is_stopped_by_the_node_limit():
    # Ten merges of ten merges of ...: 10**8 conversions for a handful of keys. Past MAX_NODES
    # every merge source is refused, and a refused source merges nothing.
    lines = ["m0: &m0 {a: 1}"] + [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}]}}" for i in range(1, 9)]
    doc = load_yaml("\n".join(lines) + "\n", "s.yaml")
    assert [str(p) for p in doc.problems] == [
        f"s.yaml:1:5: m5: too many values (over {MAX_NODES}, after expanding aliases)"
    ]
    assert doc.root.plain()["m1"] == {"a": 1}


def test_a_tagged_collection_is_reported_and_its_contents_still_judged():
    # The tag is reported where it is written; the rest of the document is judged as usual.
    assert _errors("!spec\nop: torch.sin\nsamples: [{args: [{shape: [2]}]}]\ngradcheck: {bogus: 1}\n") == [
        "s.yaml:1:1: unsupported YAML tag '!spec'",
        "s.yaml:3:11: samples[0]: missing required key 'name'",
        "s.yaml:4:13: gradcheck.bogus: unknown key 'bogus' (expected one of: fast_mode, eps, atol, rtol, "
        "nondet_tol, check_batched_grad, check_forward_ad, check_batched_forward_grad, check_undefined_grad, "
        "check_grad_dtypes, masked)",
    ]
    doc = load_yaml("v: !!set {a: null}\nw: !t [1]\n", "s.yaml")
    assert doc.tainted == set() and yamlload.tagged_paths(doc.root) == {("v",), ("w",)}
