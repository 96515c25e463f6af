"""The limits that keep a spec that validates runnable, and a hostile one cheap to reject.

The YAML-level limits (nesting, values after aliases, integer digits, float range) are tested in
test_yamlload.py; these are the ones on what the document means: a family's size once its
defaults are merged into every op, and the size of each sample tensor.
"""

import json
from pathlib import Path

import pytest

from opcheck.spec import SpecError, build, load_spec_text, model, schema_path
from opcheck.spec.yamlload import MAX_DEPTH, MAX_INT_DIGITS, MAX_NODES

SHAPE = json.loads(schema_path().read_text(encoding="utf-8"))["$defs"]["tensor"]["properties"]["shape"]
FORMAT_MD = Path(model.__file__).with_name("FORMAT.md")


def _errors(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, source="s.yaml")
    return [str(p) for p in info.value.problems]


def _family(samples: int, ops: int) -> str:
    lines = ["defaults:", "  samples:"] + [f"    - {{name: s{i}, args: [{{shape: [2]}}]}}" for i in range(samples)]
    return "\n".join(lines + ["ops:"] + [f"  - {{op: torch.sin, name: op{i}}}" for i in range(ops)]) + "\n"


# -- a family's size, defaults merged ----------------------------------------------------------


def test_a_family_too_large_once_merged_is_rejected_before_anything_is_built(monkeypatch):
    # 3,000 default samples × 1,000 ops: a 150 KB file standing for 18 million values, which
    # took minutes and gigabytes to build. It is refused from counts, before one op is merged.
    def not_reached(*args, **kwargs):
        raise AssertionError("an op was built")

    monkeypatch.setattr(build, "_build_op", not_reached)
    monkeypatch.setattr(build, "_merge", not_reached)
    assert _errors(_family(3000, 1000)) == [
        f"s.yaml:3003:1: ops: expected at most {MAX_NODES} values with `defaults` merged into each op, got "
        "18022004 (1000 ops, `defaults` has 18002); share less through `defaults` or split the family into "
        "several files"
    ]


def test_the_merged_count_is_exact_so_a_family_just_within_the_limit_builds():
    # The text: a root, `defaults` (a mapping, its list, 6 values per sample), `ops` (a list, 3
    # values per op). Merging adds to each op the defaults' list of samples.
    def merged_total(samples: int, ops: int) -> int:
        return (1 + 2 + 6 * samples + 1 + 3 * ops) + ops * (1 + 6 * samples)

    samples = 50
    ops = next(n for n in range(1, 1000) if merged_total(samples, n + 1) > MAX_NODES)
    assert len(load_spec_text(_family(samples, ops), source="s.yaml")) == ops
    [problem] = _errors(_family(samples, ops + 1))
    assert f"got {merged_total(samples, ops + 1)} ({ops + 1} ops" in problem


def test_an_op_overriding_a_default_does_not_count_it():
    # An entry's own `samples` replaces the defaults' list, so those never multiply (counted,
    # they would make 1.8 million values).
    text = _family(3000, 100).replace(
        "{op: torch.sin, name: op", "{samples: [{name: a, args: [{shape: [2]}]}], op: torch.sin, name: op"
    )
    assert len(load_spec_text(text, source="s.yaml")) == 100


# -- sample tensors ----------------------------------------------------------------------------


def _tensor(fields: str) -> str:
    # A float tensor follows: with an integer tensor alone, the sample would also have no
    # argument that requires grad (reported too, as a problem of its own).
    return f"op: torch.sin\nsamples: [{{name: a, args: [{{{fields}}}, {{shape: [1]}}]}}]\n"


def test_the_schema_states_the_models_tensor_limits():
    # Editors underline the same shapes that validate rejects.
    assert SHAPE["maxItems"] == model.MAX_TENSOR_RANK
    assert SHAPE["items"]["maximum"] == model.MAX_TENSOR_ELEMENTS


@pytest.mark.parametrize(
    "fields, problem",
    [
        (
            "shape: [100000000000000000000000]",
            "s.yaml:2:37: samples[0].args[0].shape[0]: expected a non-negative integer of at most 16777216, "
            "got 100000000000000000000000",
        ),
        (
            "shape: [0, 16777217]",  # empty, but torch would still be asked for the size
            "s.yaml:2:40: samples[0].args[0].shape[1]: expected a non-negative integer of at most 16777216, "
            "got 16777217",
        ),
        (
            f"shape: [{', '.join(['1'] * 70)}]",
            "s.yaml:2:36: samples[0].args[0].shape: expected at most 63 items, got 70 items",
        ),
        (
            "shape: [1000, 1000, 1000]",
            "s.yaml:2:36: samples[0].args[0].shape: expected at most 16777216 elements "
            "(2**24) in one tensor, got 1000000000 (shape [1000, 1000, 1000])",
        ),
        (
            "shape: [2], values: [.nan, 1]",
            "s.yaml:2:50: samples[0].args[0].values[0]: expected a finite number for a floating-point tensor, got .nan",
        ),
        (
            "shape: [2], values: [1, -.inf]",
            "s.yaml:2:53: samples[0].args[0].values[1]: expected a finite number for a "
            "floating-point tensor, got -.inf",
        ),
        (
            f"shape: [1], values: [{'9' * 309}]",
            "s.yaml:2:50: samples[0].args[0].values[0]: expected a finite number "
            f"for a floating-point tensor, got {'9' * 56}...",
        ),
        (
            "shape: [2], dtype: int8, values: [1, 128]",
            "s.yaml:2:66: samples[0].args[0].values[1]: expected an integer in [-128, 127] for a tensor of dtype int8, "
            "got 128",
        ),
    ],
)
def test_tensors_that_could_not_run_are_rejected(fields, problem):
    assert _errors(_tensor(fields)) == [problem]


def test_tensors_at_the_limits_load():
    rank = ", ".join(["1"] * model.MAX_TENSOR_RANK)
    [spec] = load_spec_text(
        "op: torch.sin\nsamples:\n"
        f"  - {{name: rank, args: [{{shape: [{rank}]}}]}}\n"
        "  - {name: numel, args: [{shape: [4096, 4096]}]}\n"
        "  - {name: dim, args: [{shape: [16777216]}]}\n"
        "  - {name: ints, args: [{shape: [2], dtype: uint8, values: [0, 255]}, {shape: [2], values: [1.7e308, 0]}]}\n",
        source="s.yaml",
    )
    assert [s.args[0].shape for s in spec.samples] == [(1,) * 63, (4096, 4096), (16777216,), (2,)]


@pytest.mark.parametrize(
    "fields, problem",
    [
        (
            "dtype: int8, high: 200",
            "s.yaml:2:60: samples[0].args[0].high: expected low and high within [-128, 128] for "
            "a tensor of dtype int8, got low 0 by default and high 200",
        ),
        (
            "dtype: uint8, low: -1",
            "s.yaml:2:60: samples[0].args[0].low: expected low and high within [0, 256] for a "
            "tensor of dtype uint8, got low -1 and high 10 by default",
        ),
        (
            "dtype: int64, high: 1.0e+19",
            "s.yaml:2:61: samples[0].args[0].high: expected low and high within "
            "[-9223372036854775808, 9223372036854775807] for a tensor of dtype int64, got "
            "low 0 by default and high 10000000000000000000",
        ),
    ],
)
def test_integer_ranges_must_fit_the_dtype(fields, problem):
    # Drawn with torch.randint (int64 bounds) and cast: out of range they would wrap or fail.
    assert _errors(_tensor(f"shape: [2], {fields}")) == [problem]
    [spec] = load_spec_text(_tensor("shape: [2]}, {shape: [2], dtype: int8, low: -128, high: 128"), source="s.yaml")
    assert (spec.samples[0].args[1].low, spec.samples[0].args[1].high) == (-128.0, 128.0)


def test_format_md_states_every_limit():
    limits = FORMAT_MD.read_text(encoding="utf-8").split("## Limits", 1)[1].split("\n## ", 1)[0]
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")[1]
        for line in limits.splitlines()
        if line.startswith("| ") and not line.startswith("| what")
    }
    assert rows["nesting (lists and mappings inside each other, aliases expanded)"] == f"{MAX_DEPTH} levels"
    assert rows["values in one file, aliases and `<<` merges expanded"] == f"{MAX_NODES:,}"
    assert rows["values of a family, `defaults` merged into each op"] == f"{MAX_NODES:,}"
    assert rows["digits of an integer"] == str(MAX_INT_DIGITS)
    assert rows["tensor rank (`shape` length)"] == str(model.MAX_TENSOR_RANK)
    assert rows["one dim, and elements of one tensor"] == f"2**24 = {model.MAX_TENSOR_ELEMENTS:,}"
    spanned = rows["the memory a `strides` layout spans, gaps included"]
    assert spanned == f"2**26 = {model.MAX_STORAGE_ELEMENTS:,} elements"
