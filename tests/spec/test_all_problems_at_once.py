"""Every problem of a spec at once: a problem in one place never hides an independent one elsewhere.

A corpus of single-problem mutations of one valid spec: each mutation alone reports its problems,
and any mutations together report exactly the union of what each reports alone. Problems are
compared by key path and message (lines shift as mutations add text; a message that cites a line
has it blanked). Mutations that touch the same node, or whose problem hides the other's for a
reason (the other cannot be judged without the part the first one breaks), are not combined.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from opcheck import cli
from opcheck.spec import SpecError, load_spec_text

Spec = dict[str, Any]

# `scaled(x, /, scale=1.0, *, shift)` has every parameter kind a call can bind.
BASE: Spec = {
    "op": "opcheck_spec_fixture:scaled",
    "dtypes": ["float64"],
    "lowprec_dtypes": ["float32"],
    "devices": ["cpu"],
    "samples": [
        {"name": "rows", "args": [{"shape": [3, 5], "low": -1, "high": 1}], "kwargs": {"scale": 2.0, "shift": 1.0}},
        {"name": "cols", "args": [{"shape": [4]}, 0.5], "kwargs": {"shift": 0.0}},
        {"name": "diag", "args": [{"shape": [3, 3], "maker": "symmetric"}], "kwargs": {"shift": 1.0}},
        {"name": "pair", "args": [{"shape": [2]}], "kwargs": {"shift": 0.5, "scale": 1.5}},
    ],
    "gradcheck": {"fast_mode": "auto", "check_forward_ad": True},
    "gradgradcheck": {"check_batched_grad": True},
    "tolerances": [{"where": {"sample": "rows"}, "atol": 1.0e-5}],
    "skips": [{"where": {"sample": "cols", "device": "cpu"}, "reason": "a skip for the corpus"}],
    "lowprec_parts": [{"where": {"dtype": "float32"}, "parts": ["output", "vjp"], "reason": "no JVP"}],
}

Mutate = Callable[[Spec], None]
MUTATIONS: dict[str, tuple[str, Mutate]] = {}
"""name → (the key path its problem is reported at, what it changes in a spec)."""


def mutation(path: str) -> Callable[[Mutate], Mutate]:
    """Registers a single-problem mutation, whose problem is reported at `path`."""

    def register(mutate: Mutate) -> Mutate:
        MUTATIONS[mutate.__name__] = (path, mutate)
        return mutate

    return register


def _sample(spec: Spec, name: str) -> Spec:
    return next(sample for sample in spec["samples"] if sample["name"] == name)


# -- schema problems ---------------------------------------------------------------------------


@mutation("frobnicate")
def unknown_top_level_key(spec: Spec) -> None:
    spec["frobnicate"] = 1


@mutation("gradcheck.atoll")
def unknown_gradcheck_key(spec: Spec) -> None:
    spec["gradcheck"]["atoll"] = 1.0e-5


@mutation("gradgradcheck.check_batched_gard")
def unknown_gradgradcheck_key(spec: Spec) -> None:
    spec["gradgradcheck"]["check_batched_gard"] = True


@mutation("samples[0].args[0].lo")
def unknown_tensor_key(spec: Spec) -> None:
    _sample(spec, "rows")["args"][0]["lo"] = -1


@mutation("samples[1].args[0].noncontiguous")
def wrong_type_in_a_tensor(spec: Spec) -> None:
    _sample(spec, "cols")["args"][0]["noncontiguous"] = "yes"


@mutation("clone_inputs")
def wrong_type_at_the_top(spec: Spec) -> None:
    spec["clone_inputs"] = "yes"


@mutation("devices[1]")
def unknown_device(spec: Spec) -> None:
    spec["devices"].append("gpu")


@mutation("samples[2].kwargs['scale-']")
def keyword_that_is_no_identifier(spec: Spec) -> None:
    _sample(spec, "diag")["kwargs"]["scale-"] = 1.0


@mutation("tolerances[0].atoll")
def unknown_key_in_a_rule(spec: Spec) -> None:
    spec["tolerances"][0]["atoll"] = 1.0e-5


@mutation("skips[0].where.devce")
def unknown_key_in_a_where(spec: Spec) -> None:
    spec["skips"][0]["where"]["devce"] = "cpu"


@mutation("samples[0].comment")
def unknown_key_in_a_sample(spec: Spec) -> None:
    _sample(spec, "rows")["comment"] = "a note"


@mutation("lowprec_dtypes[1]")
def unknown_lowprec_dtype(spec: Spec) -> None:
    spec["lowprec_dtypes"].append("float8")


@mutation("requires[0]")
def requires_no_module_name(spec: Spec) -> None:
    spec["requires"] = ["not a module"]


# -- semantic problems -------------------------------------------------------------------------


@mutation("op")
def op_that_does_not_resolve(spec: Spec) -> None:
    spec["op"] = "opcheck_spec_fixture:scaledd"


@mutation("samples[0].kwargs.scael")
def misspelled_keyword(spec: Spec) -> None:
    kwargs = _sample(spec, "rows")["kwargs"]
    kwargs["scael"] = kwargs.pop("scale")


@mutation("samples[1].args")
def too_many_arguments(spec: Spec) -> None:
    _sample(spec, "cols")["args"].append(1.0)


@mutation("samples[3].args")
def missing_required_argument(spec: Spec) -> None:
    del _sample(spec, "pair")["kwargs"]["shift"]


@mutation("samples[2].kwargs.x")
def positional_only_by_keyword(spec: Spec) -> None:
    _sample(spec, "diag")["kwargs"]["x"] = 1.0


@mutation("samples[2].args[0].maker")
def maker_needs_a_square(spec: Spec) -> None:
    _sample(spec, "diag")["args"][0]["shape"] = [3, 4]


@mutation("samples[1].args[0].high")
def low_above_high(spec: Spec) -> None:
    _sample(spec, "cols")["args"][0].update(low=2, high=1)


@mutation("samples[3]")
def no_argument_requires_grad(spec: Spec) -> None:
    _sample(spec, "pair")["args"][0]["dtype"] = "int64"


@mutation("samples[3].kwargs.scale.high")
def integer_range_beyond_the_dtype(spec: Spec) -> None:
    _sample(spec, "pair")["kwargs"]["scale"] = {"shape": [2], "dtype": "int8", "low": 0, "high": 1000}


@mutation("samples[4].name")
def duplicate_sample_name(spec: Spec) -> None:
    spec["samples"].append({"name": "pair", "args": [{"shape": [1]}], "kwargs": {"shift": 0.0}})


@mutation("dtypes")
def empty_dtypes_without_reference(spec: Spec) -> None:
    spec["dtypes"] = []


@mutation("gradcheck.check_forward_ad")
def flag_turned_off_by_another_key(spec: Spec) -> None:
    spec["supports_forward_ad"] = False


@mutation("gradgradcheck.check_batched_grad")
def flag_turned_off_in_its_own_mapping(spec: Spec) -> None:
    spec["gradgradcheck"]["enabled"] = False


@mutation("tolerances[0].where.sample")
def rule_names_an_unknown_sample(spec: Spec) -> None:
    spec["tolerances"][0]["where"]["sample"] = "rowz"


@mutation("skips[0].where.sample")
def skip_names_an_unknown_sample(spec: Spec) -> None:
    spec["skips"][0]["where"]["sample"] = "colz"


@mutation("gradcheck.masked")
def masked_without_a_sparse_tensor(spec: Spec) -> None:
    spec["gradcheck"]["masked"] = True


@mutation("tolerances[1].factor")
def lowprec_key_in_a_rule_without_lowprec(spec: Spec) -> None:
    spec["tolerances"].append({"where": {"check": "gradcheck"}, "factor": 2.0})


@mutation("lowprec_parts[0].where.dtype")
def lowprec_parts_dtype_not_checked(spec: Spec) -> None:
    spec["lowprec_parts"][0]["where"]["dtype"] = "bfloat16"


@mutation("lowprec_parts[0].why")
def unknown_key_in_a_lowprec_parts_rule(spec: Spec) -> None:
    spec["lowprec_parts"][0]["why"] = "a typo of reason"


# -- pairs that are not combined ---------------------------------------------------------------

SIGNATURE = {"misspelled_keyword", "too_many_arguments", "missing_required_argument", "positional_only_by_keyword"}
UNREAD_SAMPLE_PARTS = {
    "unknown_tensor_key",
    "wrong_type_in_a_tensor",
    "keyword_that_is_no_identifier",
    "unknown_key_in_a_sample",
}
SAMPLE_RULES = {"maker_needs_a_square", "low_above_high", "no_argument_requires_grad", "integer_range_beyond_the_dtype"}

DEPENDENT: dict[frozenset[str], str] = {}
"""Pairs not combined, and why: one problem cannot be judged without the part the other breaks."""


def _pairs_of(table: dict[frozenset[str], str], firsts: set[str], seconds: set[str], why: str) -> None:
    table.update((frozenset({a, b}), why) for a in firsts for b in seconds)


_pairs_of(
    DEPENDENT, {"op_that_does_not_resolve"}, SIGNATURE, "samples fit the op's signature only when the op resolves"
)
_pairs_of(
    DEPENDENT,
    {"requires_no_module_name"},
    SIGNATURE | {"op_that_does_not_resolve"},
    "the op is imported (resolved, its signature read) only when `requires` says which modules it needs",
)
_pairs_of(
    DEPENDENT,
    {"unknown_key_in_a_sample"},
    {"missing_required_argument"},
    "an unknown key of the sample may be a misspelled `kwargs` that passes the missing argument",
)
_pairs_of(
    DEPENDENT, {"wrong_type_in_a_tensor"}, {"low_above_high"}, "one tensor: a builder reads it whole or not at all"
)
_pairs_of(
    DEPENDENT,
    {"unknown_lowprec_dtype"},
    {"lowprec_parts_dtype_not_checked"},
    "the refused lowprec dtype may be the one the rule names, misspelled",
)
_pairs_of(
    DEPENDENT,
    {"empty_dtypes_without_reference"},
    {"flag_turned_off_in_its_own_mapping"},
    "one flag, turned off by two keys: its one message names both",
)
_pairs_of(
    DEPENDENT,
    {"masked_without_a_sparse_tensor"},
    UNREAD_SAMPLE_PARTS,
    "a part of a sample the schema could not read may hold a sparse tensor (a misspelled `layout`)",
)


# -- the check ---------------------------------------------------------------------------------


def _text(names: tuple[str, ...]) -> str:
    spec = copy.deepcopy(BASE)
    for name in names:
        MUTATIONS[name][1](spec)
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=200)


_LINE_REFERENCE = re.compile(r"\bline \d+|\b\d+:\d+\b")


@functools.cache
def problems(names: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    """(key path, message) of each problem the spec with these mutations reports."""
    try:
        load_spec_text(_text(names), source="spec.yaml")
    except SpecError as e:
        return frozenset((p.path, _LINE_REFERENCE.sub("#", p.message)) for p in e.problems)
    return frozenset()


def _union(names: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    return frozenset().union(*(problems((name,)) for name in names))


def _pairs(names: tuple[str, ...]) -> list[frozenset[str]]:
    return [frozenset(pair) for pair in itertools.combinations(names, 2)]


def _combinable(names: tuple[str, ...]) -> bool:
    return not any(pair in DEPENDENT for pair in _pairs(names))


def _every_pair() -> list[Any]:
    params = []
    for names in itertools.combinations(sorted(MUTATIONS), 2):
        pair = frozenset(names)
        if pair in DEPENDENT:
            continue
        params.append(pytest.param(names, id="+".join(names)))
    return params


def _triples_in_the_samples() -> list[Any]:
    in_samples = sorted(name for name, (path, _) in MUTATIONS.items() if path.startswith("samples"))
    return [
        pytest.param(names, id="+".join(names)) for names in itertools.combinations(in_samples, 3) if _combinable(names)
    ]


def test_the_base_spec_is_valid():
    assert problems(()) == frozenset()


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_alone_reports_its_problem(name: str):
    found = problems((name,))
    assert MUTATIONS[name][0] in {path for path, _ in found}, found


def test_the_corpus_is_large_and_its_exceptions_name_its_mutations():
    assert len(MUTATIONS) >= 30
    assert all(len(pair) == 2 and pair <= MUTATIONS.keys() for pair in DEPENDENT)


@pytest.mark.parametrize("names", _every_pair())
def test_two_problems_together_are_the_union_of_each_alone(names: tuple[str, ...]):
    assert problems(names) == _union(names)


@pytest.mark.parametrize("names", _triples_in_the_samples())
def test_three_problems_in_the_samples_together_are_the_union_of_each_alone(names: tuple[str, ...]):
    assert problems(names) == _union(names)


def test_every_combinable_problem_together_is_the_union_of_each_alone():
    group: tuple[str, ...] = ()
    for name in sorted(MUTATIONS):
        if _combinable(group + (name,)):
            group += (name,)
    assert len(group) >= 20
    assert problems(group) == _union(group)


def test_validate_reports_a_misspelled_keyword_with_the_schema_problems(tmp_path: Path, monkeypatch, capsys):
    # As reported: the misspelled `dimm` showed only once the three schema problems were fixed.
    (tmp_path / "op_specs").mkdir()
    (tmp_path / "op_specs" / "softmax.yaml").write_text(
        "op: torch.nn.functional.softmax\n"
        "samples:\n"
        "  - name: rows\n"
        "    args: [{shape: [3, 5], lo: -1}]\n"
        "    kwargs: {dimm: -1}\n"
        "gradcheck: {fast_modee: auto, atoll: 1.0e-5}\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["validate"]) == 1
    call = "torch.nn.functional.softmax(input, dim=..., _stacklevel=..., dtype=...)"
    assert capsys.readouterr().err.splitlines() == [
        "op_specs/softmax.yaml:4:28: samples[0].args[0].lo: unknown key 'lo'; did you mean 'low'?",
        f"op_specs/softmax.yaml:5:14: samples[0].kwargs.dimm: unknown keyword argument 'dimm' for {call}; "
        "did you mean 'dim'?",
        "op_specs/softmax.yaml:6:13: gradcheck.fast_modee: unknown key 'fast_modee'; did you mean 'fast_mode'?",
        "op_specs/softmax.yaml:6:31: gradcheck.atoll: unknown key 'atoll'; did you mean 'atol'?",
        "4 problem(s) found.",
    ]
