"""`requires:` modules the op needs that may not be installed: read into the model, checked where
they are written, merged in families, rendered only when given; where one is missing, the op and
its reference are not imported while validating, and the note and the skip reason say so."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from opcheck.codegen import render_module
from opcheck.spec import SpecError
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import OpSpec
from opcheck.spec.requires import (
    MODULE_NAME_RE,
    missing_modules,
    not_installed_reason,
    validation_notes,
)

MISSING = "a_module_that_does_not_exist_xyz"
SAMPLES = "samples: [{name: a, args: [{shape: [3]}]}]\n"


def _load(text: str) -> list[OpSpec]:
    return load_spec_text(text, source="op_specs/k.yaml")


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        _load(text)
    return [str(p) for p in info.value.problems]


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module `kernels_needing_xyz` that imports the missing module, as a Triton kernel file
    imports triton: importing it fails."""
    name = "kernels_needing_xyz"
    (tmp_path / f"{name}.py").write_text(
        f"import {MISSING}\n\n\ndef kernel(x):\n    return x\n\n\ndef reference(x):\n    return x\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_the_key_defaults_to_nothing_and_is_read_into_the_model():
    (plain,) = _load(f"op: torch.sin\n{SAMPLES}")
    assert plain.requires == () == OpSpec.__dataclass_fields__["requires"].default
    (spec,) = _load(f"op: torch.sin\nrequires: [json, json.decoder]\n{SAMPLES}")
    assert spec.requires == ("json", "json.decoder")
    assert not_installed_reason(spec) is None and validation_notes([spec]) == []


def test_names_that_are_not_dotted_module_names_are_problems_where_they_are_written():
    text = f"op: torch.sin\nrequires: [triton, tri-ton, triton., 3pkg, '', triton]\n{SAMPLES}"
    expected = "expected a dotted module name ('triton', 'triton.language'), got"
    assert _problems(text) == [
        f"op_specs/k.yaml:2:20: requires[1]: {expected} 'tri-ton'",
        f"op_specs/k.yaml:2:29: requires[2]: {expected} 'triton.'",
        f"op_specs/k.yaml:2:38: requires[3]: {expected} '3pkg'",
        f"op_specs/k.yaml:2:44: requires[4]: {expected} ''",
        "op_specs/k.yaml:2:48: requires[5]: 'triton' is listed twice (first at 2:12)",
    ]
    assert _problems(f"op: torch.sin\nrequires: triton\n{SAMPLES}") == [
        "op_specs/k.yaml:2:11: requires: expected a list of dotted module names ('triton', 'triton.language'), "
        "got 'triton'"
    ]


def test_the_schema_pattern_and_the_python_one_agree():
    from opcheck.spec.validate import schema

    pattern = schema()["$defs"]["moduleName"]["pattern"]
    assert pattern == "^" + MODULE_NAME_RE.pattern.removesuffix(r"\Z") + "$"
    for good in ("triton", "triton.language", "_x.y_2"):
        assert MODULE_NAME_RE.match(good)
    for bad in ("tri-ton", "triton.", ".triton", "3d", "a..b", "a b", "triton\n"):
        assert not MODULE_NAME_RE.match(bad), bad


def test_a_missing_required_module_leaves_the_op_and_the_reference_unimported(kernels):
    text = (
        f"op: {kernels}:kernel\nrequires: [{MISSING}]\ndtypes: []\nlowprec_dtypes: [float32]\n"
        f"reference: {kernels}:reference\n"
        # One argument too many for kernel(x): not judged, the signature needs the import.
        "samples: [{name: a, args: [{shape: [3]}, 2]}]\n"
    )
    (spec,) = _load(text)
    assert spec.op == f"{kernels}:kernel" and spec.reference == f"{kernels}:reference"
    assert spec.requires == (MISSING,) and kernels not in sys.modules
    # Without the key, the same spec is what it always was: the op does not import.
    problems = _problems(text.replace(f"requires: [{MISSING}]\n", ""))
    assert problems[0].startswith(f"op_specs/k.yaml:1:5: op: cannot import module '{kernels}'")
    assert problems[1].startswith(f"op_specs/k.yaml:4:12: reference: cannot import module '{kernels}'")
    assert len(problems) == 2


def test_with_every_required_module_installed_nothing_changes(kernels):
    # The op is imported, and what is wrong with it reported, as without the key.
    problems = _problems(f"op: torch.nosuchop\nrequires: [json]\n{SAMPLES}")
    assert problems == [
        "op_specs/k.yaml:1:5: op: 'torch' has no attribute 'nosuchop' (while resolving 'torch.nosuchop')"
    ]
    bound = (
        "op: torch.nn.functional.softmax\nrequires: [json]\n"
        "samples: [{name: a, args: [{shape: [3]}], kwargs: {dimm: 0}}]\n"
    )
    assert "unknown keyword argument 'dimm'" in _problems(bound)[0]
    # ... and the signature is not judged when a module is missing.
    (spec,) = _load(bound.replace("[json]", f"[json, {MISSING}]"))
    assert missing_modules(spec.requires) == (MISSING,)


def test_a_family_shares_requires_through_defaults(kernels):
    text = (
        f"defaults:\n  requires: [{MISSING}]\n  {SAMPLES}"
        f"ops:\n  - op: {kernels}:kernel\n  - op: {kernels}:reference\n  - op: torch.sin\n    requires: []\n"
    )
    kernel, reference, sin = _load(text)
    assert kernel.requires == reference.requires == (MISSING,) and sin.requires == ()
    assert validation_notes([kernel, reference, sin]) == [
        f"op_specs/k.yaml: spec 'kernel' requires {MISSING}, which is not installed: its op is not imported, "
        "and its tests skip",
        f"op_specs/k.yaml: spec 'reference' requires {MISSING}, which is not installed: its op is not imported, "
        "and its tests skip",
    ]
    assert _problems("defaults: {requires: [tri-ton]}\nops: [{op: torch.sin, " + SAMPLES.replace("\n", "}]\n"))[
        0
    ].startswith("op_specs/k.yaml:1:23: defaults.requires[0]: expected a dotted module name")


def test_the_note_and_the_skip_reason_name_the_module_and_the_key(kernels):
    (spec,) = _load(f"op: {kernels}:kernel\nrequires: [json, {MISSING}, no_such.sub]\n{SAMPLES}")
    assert missing_modules(spec.requires) == (MISSING, "no_such.sub")
    assert validation_notes([spec]) == [
        f"op_specs/k.yaml: requires {MISSING} and no_such.sub, which are not installed: its op is not imported, "
        "and its tests skip"
    ]
    assert not_installed_reason(spec) == (
        f"requires {MISSING} and no_such.sub, which are not installed "
        f"(op_specs/k.yaml: requires: [json, {MISSING}, no_such.sub])"
    )
    one = replace(spec, requires=(MISSING,))
    assert (
        not_installed_reason(one)
        == f"requires {MISSING}, which is not installed (op_specs/k.yaml: requires: [{MISSING}])"
    )


def test_a_finder_that_refuses_the_name_counts_as_missing(monkeypatch):
    # How tests hide an installed module (tests/test_triton_missing.py): find_spec raises.
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name == "json_hidden_xyz" or name == "json":
                raise ModuleNotFoundError(name)
            return None

    monkeypatch.setattr(sys, "meta_path", [Refuse(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "json_hidden_xyz", raising=False)
    assert missing_modules(["json_hidden_xyz", "sys"]) == ("json_hidden_xyz",)


def test_the_generated_module_writes_requires_only_when_given():
    plain = f"op: torch.sin\n{SAMPLES}"
    (a,), (b,), (c,) = _load(plain), _load(plain + "requires: []\n"), _load(plain + "requires: [json]\n")
    assert replace(a, sha256="") == replace(b, sha256="")
    assert render_module(a).replace(a.sha256, b.sha256) == render_module(b)
    assert "requires" not in render_module(a)
    module = render_module(c)
    assert '    requires=("json",),\n' in module
    namespace: dict[str, object] = {}
    exec(compile(module, "test_sin.py", "exec"), namespace)  # noqa: S102 - our own output
    assert namespace["SPEC"] == c
