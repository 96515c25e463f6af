"""Problems are collected across everything, sorted, located, phrased with a fix; the API around them."""

from dataclasses import replace
from pathlib import Path

import pytest

from opcheck.spec import Problem, SpecError, load_spec_text, load_specs
from opcheck.spec.build import NameClaim
from opcheck.spec.case import cases_of
from opcheck.spec.checker import Checker
from opcheck.spec.loader import cross_spec_problems, generated_test_ids
from opcheck.spec.model import GradgradcheckFlags, Location, OpSpec, Sample, TensorArg
from opcheck.spec.problems import KeyOf
from opcheck.spec.yamlload import load_yaml

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
GOOD = "op: torch.sin\nsamples: [{name: a, args: [{shape: [3]}]}]\n"


def _problems(text: str) -> list[Problem]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, source="op_specs/x.yaml")
    return info.value.problems


def test_problem_text_with_and_without_a_key_path():
    loc = Location("op_specs/x.yaml", 14, 5)
    assert str(Problem(loc, "samples[2].args[0].shape", "expected a list of non-negative integers, got 'x'")) == (
        "op_specs/x.yaml:14:5: samples[2].args[0].shape: expected a list of non-negative integers, got 'x'"
    )
    assert str(Problem(loc, "", "empty spec")) == "op_specs/x.yaml:14:5: empty spec"
    assert str(Problem(Location("op_specs/x.yaml"), "", "not UTF-8")) == "op_specs/x.yaml: not UTF-8"


def test_spec_error_sorts_by_file_line_col_and_drops_repeats():
    b = Problem(Location("b.yaml", 1, 1), "", "m")
    a2 = Problem(Location("a.yaml", 2, 1), "", "m")
    a1 = Problem(Location("a.yaml", 1, 9), "", "m")
    error = SpecError([b, a2, a1, b])
    assert error.problems == [a1, a2, b]
    assert str(error) == "a.yaml:1:9: m\na.yaml:2:1: m\nb.yaml:1:1: m"


def test_every_problem_of_a_file_is_reported_at_once_sorted_with_suggestions():
    problems = _problems("""\
op: torch.sin
sampels: []
gradcheck: {nondet_tl: 1, atol: -1}
samples:
  - name: a
    args: [{shape: [2, -1], requries_grad: true}]
  - name: a
    args: [{shape: [2], low: 5}]
""")
    assert [(p.location.line, p.location.col) for p in problems] == sorted(
        (p.location.line, p.location.col) for p in problems
    )
    assert [p.path for p in problems] == [
        "sampels",
        "gradcheck.nondet_tl",
        "gradcheck.atol",
        "samples[0].args[0].shape[1]",
        "samples[0].args[0].requries_grad",
        "samples[1].name",
        "samples[1].args[0].low",
    ]
    messages = "\n".join(p.message for p in problems)
    assert "did you mean 'samples'?" in messages
    assert "did you mean 'nondet_tol'?" in messages
    assert "did you mean 'requires_grad'?" in messages


def test_unknown_key_without_a_close_match_lists_the_known_keys():
    [problem] = _problems("op: torch.sin\nsamples: [{name: a, args: [{shape: [3]}]}]\ngradgradcheck: {zzz: 1}\n")
    assert problem.message == (
        "unknown key 'zzz' (expected one of: enabled, check_batched_grad, "
        "check_fwd_over_rev, gen_non_contig_grad_outputs)"
    )
    assert (problem.location.line, problem.location.col) == (3, 17)


def test_problems_of_all_files_come_together(tmp_path):
    (tmp_path / "a.yaml").write_text("op: torch.sin\nsamples: [{name: a, args: [{shape: x}]}]\n")
    (tmp_path / "b.yaml").write_text("op: torch.sinn\nsamples: [{name: a, args: [{shape: [1]}]}]\n")
    (tmp_path / "c.yaml").write_text(GOOD.replace("[3]", "[4]"))  # valid, but named like a.yaml
    with pytest.raises(SpecError) as info:
        load_specs([tmp_path, tmp_path / "missing.yaml"], root=tmp_path)
    assert [str(p).split(": ", 1)[0] for p in info.value.problems] == [
        "a.yaml:2:36",
        "b.yaml:1:5",
        "c.yaml:1:5",
        "missing.yaml",
    ]
    # A file with other problems still claims its name: the clash is reported now, not on the next run.
    assert "duplicate spec name 'sin': a.yaml:1:5 and c.yaml:1:5" in str(info.value)


def test_a_directory_without_specs_is_a_problem(tmp_path):
    with pytest.raises(SpecError, match="no \\*.yaml or \\*.yml spec files here"):
        load_specs([tmp_path], root=tmp_path)


def test_duplicate_names_within_a_family_name_both_places():
    text = (
        "ops:\n"
        "  - {op: torch.sin, samples: [{name: a, args: [{shape: [3]}]}]}\n"
        "  - {op: torch.Tensor.sin, variant: method, samples: [{name: a, args: [{shape: [3]}]}]}\n"
    )
    [problem] = _problems(text)
    assert str(problem) == (
        "op_specs/x.yaml:3:10: ops[1].op: duplicate spec name 'sin': op_specs/x.yaml:2:10 "
        "and op_specs/x.yaml:3:10 (derived from `op`; set `name:` to tell them apart)"
    )


def _spec(*sample_names: str, name: str = "sin") -> OpSpec:
    return OpSpec(
        name=name,
        op="torch.sin",
        source="s.yaml",
        sha256="0",
        devices=("cpu",),
        samples=tuple(Sample(n, args=(TensorArg((2,)),)) for n in sample_names),
        location=Location("s.yaml", 1, 1),
    )


def test_generated_test_ids_follow_the_contract():
    assert generated_test_ids(_spec("a", "b")) == [
        "test_gradcheck[cpu-float64-a]",
        "test_gradcheck[cpu-float64-b]",
        "test_gradgradcheck[cpu-float64-a]",
        "test_gradgradcheck[cpu-float64-b]",
    ]


def test_generated_test_ids_are_the_cases_names_without_the_pairs_that_never_run():
    spec = replace(
        _spec("a"), devices=("cpu", "mps"), lowprec_dtypes=("float32",), gradgradcheck=GradgradcheckFlags(enabled=False)
    )
    assert (
        generated_test_ids(spec)
        == [case.name for case in cases_of(spec)]
        == ["test_gradcheck[cpu-float64-a]", "test_lowprec[cpu-float32-a]", "test_lowprec[mps-float32-a]"]
    )


def test_cross_spec_pass_judges_only_cases_that_exist():
    # mps has no float64: a spec that only names those pairs generates no test, so no id to judge.
    assert cross_spec_problems([], [replace(_spec("a", "a"), devices=("mps",))]) == []


def test_cross_spec_pass_catches_colliding_and_unclean_test_ids():
    # Models built by hand: the loader's own rules never let these through, the last check must.
    problems = cross_spec_problems([], [_spec("a", "a"), _spec("b c", name="cos")])
    messages = [p.message for p in problems]
    assert "test id test_sin.py::test_gradcheck[cpu-float64-a] is generated twice (also by s.yaml:1:1)" in messages
    assert "test id 'test_gradcheck[cpu-float64-b c]' has characters outside [A-Za-z0-9_.-]" in messages
    assert cross_spec_problems([], [_spec("a", "b"), _spec("a", "b", name="cos")]) == []


def test_cross_spec_names_report_both_locations():
    claims = [
        NameClaim("sin", Location("a.yaml", 3, 7), "name", False),
        NameClaim("sin", Location("b.yaml", 2, 5), "op", True),
    ]
    [problem] = cross_spec_problems(claims, [])
    assert problem.location == Location("b.yaml", 2, 5)
    assert "a.yaml:3:7 and b.yaml:2:5" in problem.message


def test_values_that_yaml_could_not_read_are_reported_once():
    problems = _problems("op: !!python/name:os.system\nsamples: [{name: a, args: [!!binary aGk=]}]\n")
    assert [p.message for p in problems] == [
        "unsupported YAML tag '!!python/name:os.system'",
        "unsupported YAML tag '!!binary'",
    ]


def test_method_variant_with_a_real_tensor_method_loads():
    [spec] = load_spec_text(
        "op: torch.Tensor.addmm\nvariant: method\nsamples: [{name: a, args: "
        "[{shape: [2, 2]}, {shape: [2, 3]}, {shape: [3, 2]}]}]\n",
        source="s.yaml",
    )
    assert (spec.name, spec.variant) == ("addmm", "method")


def test_opcheck_on_torch_ops_overload_is_accepted():
    [spec] = load_spec_text(
        "op: torch.ops.aten.sin.default\nlibrary_opcheck: true\nsamples: [{name: a, args: [{shape: [3]}]}]\n",
        source="s.yaml",
    )
    assert (spec.name, spec.library_opcheck) == ("sin", True)


def test_a_problem_in_defaults_is_reported_once_not_once_per_op():
    text = (
        "defaults:\n"
        "  samples: [{name: v, args: [{shape: [3], maker: spd}]}]\n"
        "ops:\n"
        "  - op: torch.sin\n"
        "  - op: torch.cos\n"
    )
    assert [str(p) for p in _problems(text)] == [
        "op_specs/x.yaml:2:50: defaults.samples[0].args[0].maker: maker 'spd' needs at least 2 dims with square "
        "last two (e.g. [3, 3] or [2, 4, 4]), got shape [3]"
    ]


# -- the builder reads only what the schema judged clean ---------------------------------------

ENTRY = "ops: [{op: torch.sin, samples: [{name: a, args: [{shape: [2]}]}]}]\n"


@pytest.mark.parametrize(
    "defaults, problem",
    [
        (
            "{name: 5}",
            "op_specs/x.yaml:1:12: defaults.name: unknown key 'name': `name` belongs in each entry of "
            "`ops`, not in `defaults`",
        ),
        (
            "{op: [torch.sin]}",
            "op_specs/x.yaml:1:12: defaults.op: unknown key 'op': `op` belongs in each entry of "
            "`ops`, not in `defaults`",
        ),
        (
            "{gradcheck: {bogus: 1}}",
            "op_specs/x.yaml:1:24: defaults.gradcheck.bogus: unknown key 'bogus' (expected "
            "one of: fast_mode, eps, atol, rtol, nondet_tol, check_batched_grad, "
            "check_forward_ad, check_batched_forward_grad, check_undefined_grad, "
            "check_grad_dtypes, masked)",
        ),
    ],
)
def test_the_value_of_an_unknown_key_in_defaults_is_never_built(defaults, problem):
    # The schema never judged such a value (it stops at the key), so it can have any shape; the
    # builder used to merge it into each op and read it (TypeError on a name of 5).
    assert [str(p) for p in _problems(f"defaults: {defaults}\n{ENTRY}")] == [problem]
    # Also when the entry leaves the key to defaults (no `op:` of its own).
    entry_without_op = "ops: [{samples: [{name: a, args: [{shape: [2]}]}]}]\n"
    assert problem in [str(p) for p in _problems(f"defaults: {defaults}\n{entry_without_op}")]


def test_a_missing_key_makes_its_mapping_unbuildable_but_not_its_other_keys():
    # `samples` is missing: the op is still resolved (and its problem reported) ...
    messages = [p.message for p in _problems("op: torch.sinn\n")]
    assert messages[0] == "missing required key 'samples'" and "torch.sinn" in messages[1]
    # ... while a sample without `name` is not built at all (it used to raise KeyError).
    assert [p.message for p in _problems("op: torch.sin\nsamples: [{args: [{shape: [2]}]}]\n")] == [
        "missing required key 'name'"
    ]


def test_a_root_tag_hides_nothing_and_builds_nothing():
    problems = [
        str(p)
        for p in _problems("!spec\nop: torch.sin\nsamples: [{name: a, args: [{shape: [2]}]}]\ngradcheck: {bogus: 1}\n")
    ]
    assert problems[0] == "op_specs/x.yaml:1:1: unsupported YAML tag '!spec'"
    assert problems[1].startswith("op_specs/x.yaml:4:13: gradcheck.bogus: unknown key 'bogus'")
    assert len(problems) == 2


def test_a_tagged_argument_is_not_built():
    # Built as a literal list it would also say "no argument requires grad": noise about a value
    # whose problem (the tag) is already reported.
    assert [p.message for p in _problems("op: torch.sin\nsamples: [{name: a, args: [!!python/tuple [1]]}]\n")] == [
        "unsupported YAML tag '!!python/tuple'"
    ]


def test_a_key_problem_is_reported_even_when_its_value_could_not_be_read():
    # Both are said at once: the key at the key, the value's tag at the value.
    assert [str(p) for p in _problems(f"{GOOD}bogus: !custom 1\n")] == [
        "op_specs/x.yaml:3:1: bogus: unknown key 'bogus' (expected one of: op, name, variant, requires, imports, "
        "dtypes, lowprec_dtypes, devices, samples, gradcheck, gradgradcheck, supports_forward_ad, supports_gradgrad, "
        "library_opcheck, compile, reference, clone_inputs, writes_grad_outputs, reduced_precision, tolerances, "
        "lowprec_parts, skips, expected_failures)",
        "op_specs/x.yaml:3:8: bogus: unsupported YAML tag '!custom'",
    ]


def test_the_checker_reads_only_what_was_judged_clean():
    root = load_yaml("a: {b: [1, 2], c: 3}\nd: {e: 4}\n", "s.yaml").root
    ctx = Checker({("a", "b")})
    assert not ctx.clean(root) and not ctx.clean(root.at(("a",)))  # they hold a problem
    assert not ctx.clean(root.at(("a", "b"))) and not ctx.clean(root.at(("a", "b", 0)))  # it, and inside it
    assert ctx.clean(root.at(("a", "c"))) and ctx.clean(root.at(("d",)))
    # A problem with a key: its mapping is not whole, its value not read, its siblings are fine.
    ctx = Checker({("d", KeyOf("e")), ("a", KeyOf("missing"))})
    assert not ctx.clean(root.at(("d",))) and not ctx.clean(root.at(("d", "e")))
    assert not ctx.clean(root.at(("a",))) and ctx.clean(root.at(("a", "b", 1)))


def test_the_checker_reads_the_form_of_a_node_with_a_problem_inside():
    root = load_yaml("a: {b: [1, 2], c: 3}\nd: {e: 4}\nf: [5]\n", "s.yaml").root
    ctx = Checker({("a", "b", 0), ("d", KeyOf("e")), ("f",)})
    # A list or mapping holding a problem: its length and keys read, but not the part in question.
    assert ctx.readable(root) and ctx.readable(root.at(("a",))) and ctx.readable(root.at(("a", "b")))
    assert not ctx.readable(root.at(("a", "b", 0))) and ctx.readable(root.at(("a", "b", 1)))
    # The value of a refused key, and a flagged node with what is inside it, are not read at all.
    assert ctx.readable(root.at(("d",))) and not ctx.readable(root.at(("d", "e")))
    assert not ctx.readable(root.at(("f",))) and not ctx.readable(root.at(("f", 0)))
    assert not ctx.readable(None)


def test_the_checker_tells_a_refused_key_from_a_refused_value():
    root = load_yaml("a: {b: 1, c: 2}\nd: [3]\n", "s.yaml").root
    ctx = Checker({("a", KeyOf("b")), ("a", "c"), ("a", KeyOf("missing"))})
    assert not ctx.key_clean(root.at(("a", "b"))) and ctx.key_clean(root.at(("a", "c")))
    assert ctx.key_clean(root.at(("a",))) and ctx.key_clean(root.at(("d", 0))) and ctx.key_clean(root)
