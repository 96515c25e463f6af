"""`op: opinfo:NAME[:variant]`: the op of an entry of torch's OpInfo database, found by the shared lookup.

The entries here are stand-ins put in place of op_db, so that these tests neither import
torch.testing._internal (seconds) nor depend on what torch's database holds; the round trip in
tests/cli/test_import_opinfo.py runs the form against the real op_db.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from opcheck.spec import SpecError, load_spec_text, opinfo_db, schema_path
from opcheck.spec.oppath import OP_PATH_RE, OpPathError, resolve_op


def _entry(name: str, variant: str = "") -> SimpleNamespace:
    def op(x):
        return x

    return SimpleNamespace(name=name, variant_test_name=variant, op=op)


SIN, EXPAND, TRUNC = _entry("sin"), _entry("expand"), _entry("div", "trunc_rounding")
NEAREST = _entry("nn.functional.interpolate", "nearest-exact")


@pytest.fixture
def db(monkeypatch):
    entries = (SIN, EXPAND, TRUNC, NEAREST)
    monkeypatch.setattr(opinfo_db, "_op_db", lambda: entries)
    return entries


def test_resolves_to_the_entry_op(db):
    assert resolve_op("opinfo:expand") is EXPAND.op
    assert resolve_op("opinfo:div:trunc_rounding") is TRUNC.op
    assert resolve_op("opinfo:nn.functional.interpolate:nearest-exact") is NEAREST.op
    with pytest.raises(OpPathError, match=r"no OpInfo named 'div' in torch's op_db.*while resolving 'opinfo:div'"):
        resolve_op("opinfo:div")  # the entry has a variant: the name alone is another entry


def test_unknown_entry_suggests_in_the_spelling_a_spec_uses(db):
    with pytest.raises(OpPathError) as info:
        resolve_op("opinfo:div:trunc")
    assert str(info.value) == (
        "no OpInfo named 'div:trunc' in torch's op_db; did you mean 'div:trunc_rounding'? "
        "(while resolving 'opinfo:div:trunc')"
    )
    for bad in ("opinfo:", "opinfo:div:", "opinfo:a:b:c", "opinfo:1x"):
        with pytest.raises(OpPathError, match="is not a dotted path"):
            resolve_op(bad)


def test_shared_lookup_takes_the_command_line_spelling_only_when_asked(db):
    assert opinfo_db.find_entry("div:trunc_rounding") is TRUNC
    assert opinfo_db.find_entry("div.trunc_rounding", dotted=True) is TRUNC
    with pytest.raises(opinfo_db.UnknownOpInfo, match=r"did you mean 'div:trunc_rounding'"):
        opinfo_db.find_entry("div.trunc_rounding")
    with pytest.raises(opinfo_db.UnknownOpInfo, match=r"named 'sinx' .*did you mean 'sin'"):
        opinfo_db.find_entry("sinx", dotted=True)


def test_a_spec_names_an_unknown_entry_where_op_is_written(db):
    text = "op: opinfo:expnd\nsamples: [{name: oi, opinfo: expand}]\n"
    with pytest.raises(SpecError) as info:
        load_spec_text(text, source="op_specs/x.yaml")
    assert str(info.value) == (
        "op_specs/x.yaml:1:5: op: no OpInfo named 'expnd' in torch's op_db; did you mean 'expand'? "
        "(while resolving 'opinfo:expnd')"
    )


def test_a_spec_with_a_variant_loads_and_derives_its_name(db):
    [spec] = load_spec_text(
        "op: opinfo:div:trunc_rounding\nsamples: [{name: oi, opinfo: 'div:trunc_rounding'}]\n", source="x.yaml"
    )
    assert (spec.op, spec.name) == ("opinfo:div:trunc_rounding", "div_trunc_rounding")
    [spec] = load_spec_text(
        "op: opinfo:nn.functional.interpolate:nearest-exact\n"
        "samples: [{name: oi, opinfo: 'nn.functional.interpolate:nearest-exact'}]\n",
        source="x.yaml",
    )
    assert spec.name == "nn_functional_interpolate_nearest_exact"


def test_without_expecttest_the_form_is_a_problem_that_says_so(db, monkeypatch):
    monkeypatch.setitem(sys.modules, "expecttest", None)  # import expecttest -> ImportError
    with pytest.raises(OpPathError, match=r"needs the expecttest package \(pip install expecttest\)") as info:
        resolve_op("opinfo:sin")
    # the cause says so to code that runs tests, which may skip rather than fail
    assert isinstance(info.value.__cause__, opinfo_db.OpInfoUnavailable) and info.value.__cause__.needs_expecttest


def test_a_module_named_opinfo_is_still_reached_by_its_dotted_path(db, tmp_path, monkeypatch):
    (tmp_path / "opinfo.py").write_text("def f(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "opinfo", raising=False)
    assert resolve_op("opinfo.f").__module__ == "opinfo"
    with pytest.raises(OpPathError, match="no OpInfo named 'f'"):
        resolve_op("opinfo:f")
    monkeypatch.delitem(sys.modules, "opinfo")


def test_schema_and_resolver_accept_the_same_op_paths():
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    assert schema["$defs"]["opPath"]["pattern"] == OP_PATH_RE.pattern


def test_other_op_paths_do_not_import_the_opinfo_database():
    code = (
        "import sys\nfrom opcheck.spec.oppath import resolve_op\nresolve_op('torch.sin')\n"
        "heavy = ('expecttest', 'torch.testing._internal.common_methods_invocations')\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
