"""One function resolves tolerances; each layer observably changes what the engine receives."""

import re
from pathlib import Path

import pytest

import opcheck.engine as engine
from opcheck.runtime import run_check
from opcheck.runtime import tolerances as tol_mod
from opcheck.runtime.tolerances import (
    DTYPE_TOLERANCES,
    ENGINE_DEFAULTS,
    GRADIENT,
    GRADIENT_TOLERANCES,
    LOW_PRECISION,
    LOWPREC_TOLERANCES,
    resolve_tolerances,
)
from opcheck.spec import model
from opcheck.spec.model import GradcheckFlags, Location, OpSpec, Sample, TensorArg, ToleranceRule, Where

FORMAT_MD = Path(model.__file__).with_name("FORMAT.md")

SAMPLES = (Sample("a", args=(TensorArg(shape=(3,)),)), Sample("b", args=(TensorArg(shape=(2,)),)))


def spec(gradcheck=None, tolerances=()):
    return OpSpec(
        name="t",
        op="torch.sin",
        source="op_specs/t.yaml",
        sha256="0",
        samples=SAMPLES,
        gradcheck=gradcheck or GradcheckFlags(),
        tolerances=tuple(tolerances),
    )


def rule(line, **kw):
    where = Where(**{k: kw.pop(k) for k in ("device", "dtype", "check", "sample", "torch") if k in kw})
    return ToleranceRule(where=where, location=Location("op_specs/t.yaml", line, 5), **kw)


@pytest.fixture
def engine_kwargs(monkeypatch):
    """Replace the engine by a recorder that passes and keeps the keyword arguments it got."""
    calls = []
    real = engine.gradcheck_report

    def record(fn, inputs, **kwargs):
        calls.append(kwargs)
        return real(fn, inputs, **kwargs)

    monkeypatch.setattr(engine, "gradcheck_report", record)
    return calls


def engine_sees(engine_kwargs, s, sample="a"):
    engine_kwargs.clear()
    run_check(s, "gradcheck", "cpu", "float64", sample)
    return {k: engine_kwargs[0][k] for k in ("eps", "atol", "rtol", "nondet_tol")}


def test_engine_defaults_are_torchs():
    assert ENGINE_DEFAULTS == {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3, "nondet_tol": 0.0}


def test_layer_1_engine_defaults(engine_kwargs, monkeypatch):
    monkeypatch.setitem(tol_mod.GRADIENT_TOLERANCES, "float64", {})
    assert engine_sees(engine_kwargs, spec()) == ENGINE_DEFAULTS


def test_layer_2_per_dtype_table(engine_kwargs, monkeypatch):
    monkeypatch.setitem(tol_mod.GRADIENT_TOLERANCES, "float64", {"atol": 3e-5, "eps": 2e-6})
    seen = engine_sees(engine_kwargs, spec())
    assert seen == dict(ENGINE_DEFAULTS, atol=3e-5, eps=2e-6)


def test_layer_3_gradcheck_block_beats_the_table(engine_kwargs, monkeypatch):
    monkeypatch.setitem(tol_mod.GRADIENT_TOLERANCES, "float64", {"atol": 3e-5, "eps": 2e-6})
    seen = engine_sees(engine_kwargs, spec(GradcheckFlags(atol=4e-5, rtol=2e-3, nondet_tol=1e-12)))
    assert seen == {"eps": 2e-6, "atol": 4e-5, "rtol": 2e-3, "nondet_tol": 1e-12}


def test_layer_4_rules_beat_the_block_and_only_where_they_match(engine_kwargs):
    s = spec(GradcheckFlags(atol=4e-5), [rule(10, sample="a", atol=7e-5, eps=1e-7), rule(12, device="cuda", atol=1.0)])
    assert engine_sees(engine_kwargs, s, "a") == dict(ENGINE_DEFAULTS, atol=7e-5, eps=1e-7)
    assert engine_sees(engine_kwargs, s, "b") == dict(ENGINE_DEFAULTS, atol=4e-5)


def test_more_specific_rules_win_then_later_rules():
    s = spec(
        tolerances=[
            rule(10, check="gradcheck", device="cpu", atol=1e-1),  # specificity 2, first in file
            rule(12, check="gradcheck", atol=1e-2, rtol=1e-2),  # specificity 1, later: loses on atol
            rule(14, device="cpu", rtol=5e-3),  # specificity 1, later still: wins rtol
        ]
    )
    t = resolve_tolerances(s, "gradcheck", "cpu", "float64", "a")
    assert (t.atol, t.rtol) == (1e-1, 5e-3)
    assert t.sources["atol"].startswith("rule at op_specs/t.yaml:10:5")
    assert t.sources["rtol"].startswith("rule at op_specs/t.yaml:14:5")
    assert t.sources["eps"] == "gradient table for float64"


def test_a_rule_applies_only_where_the_installed_torch_meets_its_condition():
    s = spec(tolerances=[rule(10, torch=">=999.0", atol=1.0), rule(12, torch="<999.0", rtol=0.5)])
    t = resolve_tolerances(s, "gradcheck", "cpu", "float64", "a")
    assert t.atol == GRADIENT_TOLERANCES["float64"].get("atol", ENGINE_DEFAULTS["atol"])
    assert t.sources["atol"] != "rule at op_specs/t.yaml:10:5"
    assert t.rtol == 0.5 and t.sources["rtol"].startswith("rule at op_specs/t.yaml:12:5")


def test_lowprec_uses_its_own_table_not_the_gradcheck_block():
    s = spec(GradcheckFlags(atol=1e-9, rtol=1e-9), [rule(20, dtype="bfloat16", check="lowprec", rtol=0.05)])
    f32 = resolve_tolerances(s, "lowprec", "cpu", "float32", "a")
    assert (f32.atol, f32.rtol) == (LOWPREC_TOLERANCES["float32"]["atol"], LOWPREC_TOLERANCES["float32"]["rtol"])
    bf16 = resolve_tolerances(s, "lowprec", "cpu", "bfloat16", "a")
    assert (bf16.atol, bf16.rtol) == (1.6e-2, 0.05)


def test_describe_groups_fields_by_source():
    s = spec(tolerances=[rule(10, atol=2e-5, reason="slow kernel")])
    text = resolve_tolerances(s, "gradcheck", "cpu", "float64", "a").describe()
    assert text == (
        "eps=1e-06 (gradient table for float64), atol=2e-05 (rule at op_specs/t.yaml:10:5: slow kernel), "
        "rtol=0.001, nondet_tol=0 (gradient table for float64)"
    )


def test_the_tolerance_used_is_in_the_failure_message():
    s = OpSpec(
        name="t",
        op="runtime_ops:square_wrong",
        source="op_specs/t.yaml",
        sha256="0",
        samples=SAMPLES,
        tolerances=(rule(10, atol=3e-5),),
    )
    with pytest.raises(engine.GradcheckError) as info:
        run_check(s, "gradcheck", "cpu", "float64", "a")
    assert "atol=3e-05 (rule at op_specs/t.yaml:10:5)" in str(info.value)
    assert "atol=3e-05 + rtol=0.001" in str(info.value)  # and the engine really used it


def test_the_table_by_kind_of_check():
    assert GRADIENT_TOLERANCES == {
        "float64": {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3, "nondet_tol": 0.0},
        "complex128": {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3, "nondet_tol": 0.0},
    }
    assert LOWPREC_TOLERANCES == {
        "float32": {"atol": 1e-5, "rtol": 1e-4},
        "complex64": {"atol": 1e-5, "rtol": 1e-4},
        "float16": {"atol": 2e-3, "rtol": 2e-3},
        "bfloat16": {"atol": 1.6e-2, "rtol": 1.6e-2},
    }
    # every dtype a spec may list for a check has its row, and only those
    assert set(GRADIENT_TOLERANCES) == set(model.GRAD_DTYPES)
    assert set(LOWPREC_TOLERANCES) == set(model.LOWPREC_DTYPES)
    assert len({(row.dtype, row.used_by) for row in DTYPE_TOLERANCES}) == len(DTYPE_TOLERANCES)


def _format_md_table() -> set[tuple]:
    """FORMAT.md's per-dtype table as (dtype, used_by, eps, atol, rtol, nondet_tol) rows, one per dtype."""
    text = FORMAT_MD.read_text(encoding="utf-8")
    header = "| dtype | eps | atol | rtol | used by |\n|---|---|---|---|---|\n"
    assert text.count(header) == 1
    body = text.split(header, 1)[1].split("\n\n", 1)[0]
    rows = set()
    for line in body.splitlines():
        dtypes, eps, atol, rtol, used_by = (cell.strip() for cell in line.strip("|").split("|"))
        kind = {"gradient checks": GRADIENT, "low-precision check": LOW_PRECISION}[re.split(r" \(|;", used_by)[0]]
        nondet = re.search(r"`nondet_tol` (\S+)", used_by)
        for dtype in dtypes.split(", "):
            rows.add(
                (
                    dtype,
                    kind,
                    float(eps) if eps else None,
                    float(atol),
                    float(rtol),
                    float(nondet[1]) if nondet else None,
                )
            )
    return rows


def test_format_md_shows_the_table():
    rows = _format_md_table()
    assert len(rows) == len(DTYPE_TOLERANCES)
    assert rows == {(r.dtype, r.used_by, r.eps, r.atol, r.rtol, r.nondet_tol) for r in DTYPE_TOLERANCES}
