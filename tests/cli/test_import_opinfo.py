"""`opcheck import-opinfo`: specs written from torch's OpInfo entries validate, generate and pass."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
import unittest
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

from opcheck.spec import opinfo_db, opinfo_skipops, torch_condition
from opcheck.spec import opinfo_import as oi
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]

# Small sample sets: unary, binary, reductions, variants, linalg, nn.functional, and entries whose
# gradient tests torch skips (div.trunc_rounding, fmod) or expects to fail (cov, linalg.norm, and
# logcumsumexp's complex forward AD; op_db says so up to torch 2.13, the gradient test files from
# 2.14 on). complex128 runs only for COMPLEX_RUN, to keep the run short.
# NO_PATH_OPS: entries whose op no importable path names (lambdas inside op_db, one with a
# variant) and Tensor methods, with the op path each spec gets.
NO_PATH_OPS = {
    "expand_as": "opinfo:expand_as",
    "einsum": "opinfo:einsum",
    "polygamma.polygamma_n_0": "opinfo:polygamma:polygamma_n_0",
    "__rmul__": "torch.Tensor.__rmul__",
}
ROUND_TRIP = (
    "sin",
    "exp",
    "tanh",
    "sigmoid",
    "mul",
    "atan2",
    "sub",
    "sum",
    "mean",
    "amax",
    "logsumexp",
    "div.trunc_rounding",
    "fmod",
    "softmax.with_dtype",
    "var.unbiased",
    "linalg.det",
    "linalg.norm",
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.softplus",
    "logcumsumexp",
    "cov",
    "trace",
    *NO_PATH_OPS,
)
COMPLEX_RUN = ("test_trace", "test_linalg_det", "test_logcumsumexp")
EXPECTED_RULES = {
    "cov": {
        ("skips", (("check", "fwgrad_bwgrad"),)),
        ("expected_failures", (("check", "gradcheck"),)),
        ("expected_failures", (("check", "gradgradcheck"),)),
        ("expected_failures", (("check", "forward_ad"),)),
    },
    "linalg_norm": {("expected_failures", (("check", "gradgradcheck"),))},
    "logcumsumexp": {
        ("expected_failures", (("check", "forward_ad"), ("dtype", "complex128"))),
        ("expected_failures", (("check", "fwgrad_bwgrad"), ("dtype", "complex128"))),
    },
}
"""The rules these specs get, from whichever of op_db and torch's test files holds them: cov's
samples pass float32 aweights (requires_grad) with float64 and complex128 inputs; linalg.norm's
second derivative fails at its empty samples; logcumsumexp's complex forward AD gives NaN."""


def _opinfo_expects_failure(name: str, test_name: str, dtype: torch.dtype) -> bool:
    """Whether the installed torch's OpInfo entry `name` marks `test_name` at `dtype` as an
    expected failure (unittest.expectedFailure in a DecorateInfo), read from op_db directly."""
    import unittest

    from torch.testing._internal.common_methods_invocations import op_db

    info = next(i for i in op_db if i.name == name and not i.variant_test_name)
    return any(
        getattr(d, "test_name", None) == test_name
        and (d.dtypes is None or dtype in d.dtypes)
        and any(dec is unittest.expectedFailure for dec in d.decorators)
        for d in info.decorators
    )


def run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_script(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -c SCRIPT ARGS` in `cwd`, forked from a process that imported torch and op_db
    (tests/forked_python.py)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return forked_python.run_code(script, *args, cwd=cwd, env=env, timeout=600, preload=forked_python.OP_DB)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("")
    return tmp_path


def written_rules(spec: dict[str, Any]) -> set[tuple[str, tuple[tuple[str, Any], ...]]]:
    return {
        (key, tuple(sorted(r["where"].items()))) for key in ("skips", "expected_failures") for r in spec.get(key, [])
    }


@pytest.mark.long
def test_round_trip_import_validate_generate_run(project):
    started = time.perf_counter()
    # `opcheck import-opinfo` of each name, then `opcheck validate` and `opcheck generate`, in one
    # Python, which imports torch's op_db once for the three commands
    script = (
        "import json, sys\nfrom opcheck.cli import main\n"
        "imported = max(main(['import-opinfo', name]) for name in sys.argv[1:])\n"
        "print(json.dumps([imported, main(['validate']), main(['generate'])]))\n"
    )
    commands = run_script(script, *ROUND_TRIP, cwd=project)
    assert commands.returncode == 0, commands.stderr
    imported, validated, generated = json.loads(commands.stdout.splitlines()[-1])
    assert imported == 0, commands.stderr
    specs = sorted((project / "op_specs").glob("*.yaml"))
    assert len(specs) == len(ROUND_TRIP) >= 20
    written = {name: yaml.safe_load((project / "op_specs" / f"{name}.yaml").read_text()) for name in EXPECTED_RULES}
    assert {name: written_rules(spec) for name, spec in written.items()} == EXPECTED_RULES
    # torch 2.13's op_db expects logcumsumexp's complex forward AD to fail; 2.14's test file does
    in_op_db = _opinfo_expects_failure("logcumsumexp", "test_forward_mode_AD", torch.complex128)
    stated_by = "torch's OpInfo logcumsumexp" if in_op_db else "torch's test_ops_fwd_gradients.py"
    forward_ad = [r for r in written["logcumsumexp"]["expected_failures"] if r["where"]["check"] == "forward_ad"]
    assert forward_ad[0]["reason"].startswith(stated_by), forward_ad
    assert in_op_db != torch_condition.installed_satisfies(opinfo_skipops.SKIP_OPS_SINCE)
    fmod = yaml.safe_load((project / "op_specs" / "fmod.yaml").read_text())
    assert fmod["skips"][0]["where"] == {"check": "gradcheck", "device": "cpu", "dtype": "float64"}
    ops = {yaml.safe_load(spec.read_text())["op"] for spec in specs}
    assert set(NO_PATH_OPS.values()) <= ops, sorted(ops)
    # The schema reference travels with the project: a copy beside the specs, not opcheck's installation.
    assert all(spec.read_text().startswith("# yaml-language-server: $schema=op_spec.schema.json\n") for spec in specs)
    assert json.loads((project / "op_specs" / "op_spec.schema.json").read_text())["$comment"].startswith("@generated")

    assert validated == 0, commands.stderr
    assert generated == 0, commands.stderr
    tests = forked_python.run(  # forked with torch imported; the tests run in a fresh process
        "pytest",
        *[
            "generated_tests",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",  # which the generated suite does not use: a second of the run
            "--opcheck-device",
            "cpu",
            "-k",
            " or ".join(("float64", *COMPLEX_RUN)),
        ],
        cwd=project,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=600,
    )
    summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else tests.stderr
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    assert "failed" not in counts and counts["passed"] >= 4 * len(ROUND_TRIP), summary
    assert counts["xfailed"] >= 1 and counts["skipped"] >= 1, summary
    print(f"round trip of {len(ROUND_TRIP)} OpInfo entries: {time.perf_counter() - started:.1f} s; {summary}")


def test_cli_errors_are_one_line_without_traceback(project):
    cases = {
        "sinx": "no OpInfo named 'sinx' in torch's op_db; did you mean 'sin'",
        "arange": "does not support autograd",
        "nn.functional.one_hot": "no float64 or complex128 backward on cpu",
    }
    script = (
        "import sys\nfrom opcheck.cli import main\n"
        "for name in sys.argv[1:]:\n    print(main(['import-opinfo', name]), file=sys.stderr)\n"
    )
    result = run_script(script, *cases, cwd=project)
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert len(lines) == 2 * len(cases), result.stderr
    for (name, expected), (message, status) in zip(cases.items(), zip(lines[::2], lines[1::2])):
        assert message.startswith("opcheck import-opinfo: ") and expected in message, (name, message)
        assert status == "1"
    assert not (project / "op_specs").exists()


def test_existing_file_needs_force_and_out_names_the_file(project):
    target = project / "specs" / "my_sin.yaml"
    target.parent.mkdir()
    (target.parent / "trig.yaml").write_text("op: torch.sin\nname: sin\nsamples: [{name: v, args: [{shape: [4]}]}]\n")
    script = (
        "import sys\nfrom pathlib import Path\nfrom opcheck.cli import main\n"
        "out = ['import-opinfo', 'sin', '--out', 'specs/my_sin.yaml']\n"
        "print(main(out))\n"
        "Path('specs/my_sin.yaml').write_text('# mine\\n')\n"
        "print(main(out))\n"
        "print(Path('specs/my_sin.yaml').read_text(), end='')\n"
        "print(main([*out, '--force']))\n"
    )
    result = run_script(script, cwd=project)
    assert "Traceback" not in result.stderr
    assert result.stdout.splitlines() == [
        "wrote specs/my_sin.yaml; next: opcheck validate && opcheck generate && pytest generated_tests/test_sin.py",
        "wrote specs/op_spec.schema.json (the spec format's schema, for editors)",  # the spec refers to it
        "0",
        "1",
        "# mine",
        "wrote specs/my_sin.yaml; next: opcheck validate && opcheck generate && pytest generated_tests/test_sin.py",
        "0",
    ]
    errors = result.stderr.strip().splitlines()
    assert errors[1] == "opcheck import-opinfo: specs/my_sin.yaml already exists; pass --force to overwrite it"
    assert errors[0] == errors[2] and errors[0].startswith(
        "warning: spec name 'sin' is already taken by specs/trig.yaml:2:7 (torch.sin)"
    )
    assert yaml.safe_load(target.read_text())["samples"] == [{"name": "opinfo", "opinfo": "sin"}]
    written = sorted(p.name for p in target.parent.iterdir())
    assert written == ["my_sin.yaml", "op_spec.schema.json", "trig.yaml"]  # no temporary file


# -- the mapping, on stand-ins for OpInfo entries ----------------------------------------------


def skip(reason: str):
    return unittest.skip(reason)


def decorate(decorator, cls_name=None, test_name=None, device_type=None, dtypes=None, active_if=True):
    return SimpleNamespace(
        decorators=[decorator],
        cls_name=cls_name,
        test_name=test_name,
        device_type=device_type,
        dtypes=dtypes,
        active_if=active_if,
    )


def entry(**overrides: Any) -> SimpleNamespace:
    cpu = overrides.pop("cpu_dtypes", (torch.float64, torch.complex128, torch.float32))
    cuda = overrides.pop("cuda_dtypes", cpu)
    fields: dict[str, Any] = dict(
        name="sin",
        variant_test_name="",
        op=torch.sin,
        aten_name="sin",
        supports_autograd=True,
        supports_forward_ad=True,
        supports_gradgrad=True,
        supports_fwgrad_bwgrad=True,
        check_batched_grad=True,
        check_batched_gradgrad=True,
        check_batched_forward_grad=True,
        gradcheck_nondet_tol=0.0,
        skips=(),
        decorators=(),
        supported_backward_dtypes=lambda device: set(cpu if device == "cpu" else cuda),
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_flags_are_copied():
    spec = oi.build_spec(
        entry(
            check_batched_grad=False,
            check_batched_gradgrad=False,
            gradcheck_nondet_tol=1e-12,
            supports_fwgrad_bwgrad=False,
        )
    )
    assert spec["op"] == "torch.sin" and spec["name"] == "sin"
    assert spec["dtypes"] == ["float64", "complex128"]
    assert spec["samples"] == [{"name": "opinfo", "opinfo": "sin"}]
    assert spec["gradcheck"] == {
        "check_batched_grad": False,
        "check_forward_ad": True,
        "check_batched_forward_grad": True,
        "nondet_tol": 1e-12,
    }
    assert spec["gradgradcheck"] == {"check_batched_grad": False, "check_fwd_over_rev": False}
    assert "supports_forward_ad" not in spec and "skips" not in spec and "expected_failures" not in spec


def test_no_forward_ad_and_no_gradgrad():
    spec = oi.build_spec(entry(supports_forward_ad=False, supports_gradgrad=False, check_batched_forward_grad=True))
    assert spec["supports_forward_ad"] is False
    assert spec["gradcheck"] == {"check_batched_grad": True, "check_forward_ad": False}
    assert spec["gradgradcheck"] == {"enabled": False}
    assert oi.checks_of(spec) == ["gradcheck", "forward_ad_unsupported"]


def test_dtypes_follow_the_cpu_backward_and_cuda_gaps_are_skipped():
    spec = oi.build_spec(entry(cpu_dtypes=(torch.float64, torch.complex128), cuda_dtypes=(torch.float64,)))
    assert spec["dtypes"] == ["float64", "complex128"]
    assert spec["skips"] == [
        {
            "where": {"device": "cuda", "dtype": "complex128"},
            "reason": "torch's OpInfo sin has no complex128 backward on cuda",
        }
    ]
    assert oi.build_spec(entry(cpu_dtypes=(torch.float64, torch.float32)))["dtypes"] == ["float64"]


def test_gradient_test_skips_and_xfails_become_rules():
    spec = oi.build_spec(
        entry(
            skips=(
                decorate(skip("Skipped!"), "TestBwdGradients", "test_fn_grad", "cpu", (torch.float64,)),
                decorate(
                    unittest.expectedFailure, "TestFwdGradients", "test_forward_mode_AD", None, (torch.complex128,)
                ),
                decorate(unittest.expectedFailure, "TestFwdGradients", "test_fn_fwgrad_bwgrad"),
                # not gradient tests of the function variant, or never active
                decorate(skip("x"), "TestCommon", "test_out"),
                decorate(skip("x"), "TestBwdGradients", "test_inplace_grad"),
                decorate(skip("x"), "TestBwdGradients", "test_fn_grad", active_if=False),
                decorate(skip("x"), "TestBwdGradients", "test_fn_grad", dtypes=(torch.float32,)),
                decorate(skip("x"), "TestBwdGradients", "test_fn_grad", device_type="meta"),
                decorate(unittest.skipIf(False, "never"), "TestBwdGradients", "test_fn_grad"),
            ),
            decorators=(
                decorate(skip("flaky"), None, "test_fn_gradgrad", "cuda"),
                decorate(skip("Skipped!"), "TestBwdGradients", "test_fn_grad", "cpu", (torch.float64,)),  # again
            ),
        )
    )
    assert spec["skips"] == [
        {
            "where": {"check": "gradcheck", "device": "cpu", "dtype": "float64"},
            "reason": "torch's OpInfo sin skips TestBwdGradients.test_fn_grad: Skipped!",
        },
        {
            "where": {"check": "gradgradcheck", "device": "cuda"},
            "reason": "torch's OpInfo sin skips every test class.test_fn_gradgrad: flaky",
        },
    ]
    assert spec["expected_failures"] == [
        {
            "where": {"check": "forward_ad", "dtype": "complex128"},
            "reason": "torch's OpInfo sin expects to fail TestFwdGradients.test_forward_mode_AD",
        },
        {
            "where": {"check": "fwgrad_bwgrad"},
            "reason": "torch's OpInfo sin expects to fail TestFwdGradients.test_fn_fwgrad_bwgrad",
        },
    ]


def test_rules_only_reach_generated_checks():
    decos = (
        decorate(unittest.expectedFailure, "TestFwdGradients", "test_forward_mode_AD"),
        decorate(unittest.expectedFailure, "TestFwdGradients", "test_fn_fwgrad_bwgrad"),
        decorate(skip("all"), None, None),
    )
    spec = oi.build_spec(entry(supports_forward_ad=False, supports_gradgrad=False, skips=decos))
    # torch asserts that forward AD raises where it is unsupported, and its xfail says it does not;
    # forward_ad_unsupported passes on no tangent or a wrong one too, so that expectation is dropped
    assert "expected_failures" not in spec or spec["expected_failures"] == []
    assert [r["where"] for r in spec["skips"]] == [{"check": ["gradcheck", "forward_ad_unsupported"]}]


def test_a_whole_test_class_reaches_only_its_own_checks():
    decos = (
        decorate(unittest.expectedFailure, "TestFwdGradients", None),
        decorate(skip("slow"), "TestBwdGradients", None, "cuda"),
    )
    spec = oi.build_spec(entry(skips=decos, supports_fwgrad_bwgrad=True))
    assert [r["where"] for r in spec["expected_failures"]] == [{"check": ["forward_ad", "fwgrad_bwgrad"]}]
    assert [r["where"] for r in spec["skips"]] == [{"check": ["gradcheck", "gradgradcheck"], "device": "cuda"}]
    unsupported = oi.build_spec(entry(skips=decos[:1], supports_forward_ad=False))
    assert not unsupported.get("expected_failures")  # torch's conversion ops (float, cfloat): nothing left


def test_a_decorate_info_may_name_several_devices():
    decos = (
        decorate(skip("Only run on MPS"), device_type=("cpu", "xpu", "cuda", "meta")),  # torch 2.14's form
        decorate(unittest.expectedFailure, "TestBwdGradients", "test_fn_grad", device_type=["cuda"]),
        decorate(unittest.expectedFailure, "TestBwdGradients", "test_fn_gradgrad", device_type=("meta", "lazy")),
    )
    spec = oi.build_spec(entry(skips=decos))
    assert [r["where"] for r in spec["skips"]] == [
        {"check": ["gradcheck", "forward_ad", "gradgradcheck", "fwgrad_bwgrad"], "device": ["cpu", "xpu", "cuda"]}
    ]
    assert [r["where"] for r in spec["expected_failures"]] == [{"check": "gradcheck", "device": "cuda"}]


def test_the_gradient_test_files_rules_count_from_torch_2_14():
    cov = entry(name="cov", op=torch.cov, aten_name="cov")
    assert "skips" not in oi.build_spec(cov, torch_version="2.13.0")
    spec = oi.build_spec(cov, torch_version="2.14.1")
    assert spec["skips"] == [
        {
            "where": {"check": "fwgrad_bwgrad"},
            "reason": "torch's test_ops_fwd_gradients.py skips TestFwdGradients.test_fn_fwgrad_bwgrad "
            "for OpInfo cov: Skipped!",
        }
    ]
    assert spec["expected_failures"] == [
        {
            "where": {"check": "gradcheck"},
            "reason": "torch's test_ops_gradients.py expects to fail TestBwdGradients.test_fn_grad for OpInfo cov",
        },
        {
            "where": {"check": "gradgradcheck"},
            "reason": "torch's test_ops_gradients.py expects to fail TestBwdGradients.test_fn_gradgrad for OpInfo cov",
        },
        {
            "where": {"check": "forward_ad"},
            "reason": "torch's test_ops_fwd_gradients.py expects to fail TestFwdGradients.test_forward_mode_AD "
            "for OpInfo cov",
        },
    ]
    # a rule names one entry: the name and variant both match
    norm = entry(name="linalg.norm", op=torch.linalg.norm, aten_name="linalg_norm")
    at_zero = entry(name="linalg.norm", variant_test_name="subgradients_at_zero", op=torch.linalg.norm)
    assert [r["where"] for r in oi.build_spec(norm, torch_version="2.14.0")["expected_failures"]] == [
        {"check": "gradgradcheck"}
    ]
    assert {"check": "gradcheck"} in [
        r["where"] for r in oi.build_spec(at_zero, torch_version="2.14.0")["expected_failures"]
    ]
    # and its dtypes limit it, like a DecorateInfo's
    lcse = dict(name="logcumsumexp", op=torch.logcumsumexp, aten_name="logcumsumexp")
    assert [r["where"] for r in oi.build_spec(entry(**lcse), torch_version="2.14.0")["expected_failures"]] == [
        {"check": "fwgrad_bwgrad", "dtype": "complex128"},
        {"check": "forward_ad", "dtype": "complex128"},
    ]
    real_only = entry(**lcse, cpu_dtypes=(torch.float64,))
    assert "expected_failures" not in oi.build_spec(real_only, torch_version="2.14.0")
    # op_db's own rule comes first, and the test file's same rule is not written twice
    stated = decorate(unittest.expectedFailure, "TestBwdGradients", "test_fn_gradgrad")
    twice = oi.build_spec(entry(name="cat", op=torch.cat, aten_name="cat", skips=(stated,)), torch_version="2.14.0")
    assert [r["reason"] for r in twice["expected_failures"]] == [
        "torch's OpInfo cat expects to fail TestBwdGradients.test_fn_gradgrad"
    ]


def test_names_and_paths():
    relu = entry(name="nn.functional.relu", op=torch.nn.functional.relu, aten_name="relu")
    assert oi.spec_name(relu) == "nn_functional_relu"
    assert oi.op_path(relu) == "torch.nn.functional.relu"
    variant = entry(name="div", variant_test_name="trunc_rounding", op=torch.div, aten_name="div")
    assert oi.spec_name(variant) == "div_trunc_rounding"
    assert oi.opinfo_ref(variant) == "div:trunc_rounding" and oi.op_key(variant) == "div.trunc_rounding"
    assert oi.spec_name(entry(name="__rsub__")) == "rsub"
    # beside an entry that comes to the same name, the one whose key the name changed more says how
    rsub, dunder, t, upper = entry(name="rsub"), entry(name="__rsub__"), entry(name="t"), entry(name="T")
    db = (rsub, dunder, t, upper, relu)
    assert [oi.spec_name(e, db) for e in db] == ["rsub", "rsub_dunder", "t", "t_upper", "nn_functional_relu"]
    assert oi.spec_name(entry(name="_softmax_backward_data")) == "softmax_backward_data"
    assert oi.spec_name(entry(name="2d")) == "op_2d"
    assert oi.op_path(entry(name="linalg.det", op=torch.linalg.det, aten_name="linalg_det")) == "torch.linalg.det"
    assert oi.op_path(entry(name="cdouble", op=torch.Tensor.cdouble, aten_name=None)) == "torch.Tensor.cdouble"
    assert oi.op_path(entry(name="__rmul__", op=torch.Tensor.__rmul__, aten_name="mul")) == "torch.Tensor.__rmul__"


def stand_in_db(monkeypatch, *entries: SimpleNamespace) -> None:
    """`opinfo:` op paths resolve against these entries instead of torch's op_db."""
    monkeypatch.setattr(opinfo_db, "_op_db", lambda: entries)


def test_every_op_db_entry_gets_a_spec_name_of_its_own():
    db = oi.load_op_db()
    names = [oi.spec_name(e, db) for e in db]
    keys = [oi.op_key(e) for e in db]
    assert len(set(names)) == len(set(keys)) > 500  # one name per key (variants share op_db's key)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in names)


def covered(spec: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """(rule kind, check, device, dtype) for each test the spec's rules mark."""
    out = set()
    for key in ("skips", "expected_failures"):
        for rule in spec.get(key, []):
            where = rule["where"]
            picked = [[v] if isinstance(v, str) else v for v in (where.get(k) for k in ("check", "device", "dtype"))]
            for case in itertools.product(
                picked[0] or oi.checks_of(spec), picked[1] or spec["devices"], picked[2] or spec["dtypes"]
            ):
                out.add((key, *case))
    return out


def skip_ops_entries() -> list[Any]:
    db = oi.load_op_db()
    named = {(r.name, r.variant) for rules in opinfo_skipops.SKIP_OPS_RULES.values() for r in rules}
    entries = [e for e in db if (e.name, e.variant_test_name or "") in named]
    assert {(e.name, e.variant_test_name or "") for e in entries} == named  # no rule names a missing entry
    return entries


@pytest.mark.skipif(
    torch_condition.installed_satisfies(opinfo_skipops.SKIP_OPS_SINCE),
    reason="op_db holds these rules before torch 2.14",
)
def test_the_test_files_rules_are_what_op_db_held_before_torch_2_14():
    for info in skip_ops_entries():
        try:
            before = oi.build_spec(info, torch_version="2.13.0")
        except oi.OpInfoImportError:  # nothing to check: no autograd, no double precision
            continue
        after = oi.build_spec(info, torch_version="2.14.0")
        assert covered(after) == covered(before), oi.op_key(info)


def test_the_test_files_rules_name_entries_of_op_db():
    entries = skip_ops_entries()
    assert len(entries) == len({oi.op_key(e) for e in entries}) > 40


def test_ops_only_op_db_holds_get_an_opinfo_path(monkeypatch):
    expand = entry(name="expand", op=lambda x, shape: x.expand(shape), aten_name="expand")
    polygamma = entry(name="polygamma", variant_test_name="polygamma_n_0", op=lambda x: x, aten_name="polygamma")
    stand_in_db(monkeypatch, entry(), expand, polygamma)
    assert oi.op_path(expand) == "opinfo:expand"
    assert oi.op_path(polygamma) == "opinfo:polygamma:polygamma_n_0"
    assert oi.build_spec(expand)["op"] == "opinfo:expand"
    # a lambda the database does not hold under that name: no path names it
    with pytest.raises(oi.OpInfoImportError, match=r"<lambda>', which no op path names \(tried .*opinfo:view\)"):
        oi.op_path(entry(name="view", op=lambda x: x, aten_name="view"))
    # another entry's lambda under the same name is not this entry's op either
    with pytest.raises(oi.OpInfoImportError, match="which no op path names"):
        oi.op_path(entry(name="expand", op=lambda x, shape: x.expand(shape), aten_name="expand"))


def test_find_entry_takes_dot_or_colon_variants_and_suggests():
    db = [entry(), entry(name="div", variant_test_name="trunc_rounding"), entry(name="sinh")]
    assert oi.find_entry("div.trunc_rounding", db) is db[1]
    assert oi.find_entry("div:trunc_rounding", db) is db[1]
    with pytest.raises(oi.OpInfoImportError, match=r"named 'div\.trunc' .*did you mean 'div\.trunc_rounding'"):
        oi.find_entry("div.trunc", db)


def test_entries_without_autograd_or_double_backward_are_refused():
    with pytest.raises(oi.OpInfoImportError, match="does not support autograd"):
        oi.build_spec(entry(supports_autograd=False))
    with pytest.raises(oi.OpInfoImportError, match="no float64 or complex128 backward on cpu"):
        oi.build_spec(entry(cpu_dtypes=(torch.float32,)))


def test_yaml_is_escaped_by_the_dumper():
    hostile = 'x\'\n"y": [z] # {a: b}\n- !!python/object:os.system'
    spec = oi.build_spec(entry(skips=(decorate(skip(hostile), "TestBwdGradients", "test_fn_grad"),)))
    text = oi.spec_text(spec, "sin\nop: evil", schema="../opcheck/spec/op_spec.schema.json")
    assert yaml.safe_load(text) == spec
    assert text.startswith("# yaml-language-server: $schema=../opcheck/spec/op_spec.schema.json\n")
    assert "evil" not in text  # a key that is not a plain name stays out of the comment


def test_write_spec_is_atomic_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "deep" / "a.yaml"
    oi.write_spec(path, "op: torch.sin\n")
    assert path.read_text() == "op: torch.sin\n"
    with pytest.raises(oi.OpInfoImportError, match="already exists; pass --force"):
        oi.write_spec(path, "other\n")
    assert path.read_text() == "op: torch.sin\n"
    os.chmod(path, 0o640)
    oi.write_spec(path, "new\n", force=True)
    assert path.read_text() == "new\n" and (os.stat(path).st_mode & 0o777) == 0o640
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(oi.OpInfoImportError, match="is a folder"):
        oi.write_spec(tmp_path / "dir.yaml", "x\n", force=True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.yaml"]
