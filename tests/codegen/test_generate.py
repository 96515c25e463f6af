"""The generator: golden modules, determinism, write/delete discipline, injection safety.

Golden files: tests/codegen/golden/specs/*.yaml are compiled into tests/codegen/golden/expected/.
After an intended change to the generated output, refresh them from the repository root with

    opcheck generate --specs tests/codegen/golden/specs --out tests/codegen/golden/expected

and review the diff.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opcheck.codegen import GENERATED_MARKER, GenerationError, apply_plan, plan_generation, render_module, stale_diff
from opcheck.spec import load_specs
from opcheck.spec import model as M
from opcheck.spec.case import cases_of
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
REFRESH = "opcheck generate --specs tests/codegen/golden/specs --out tests/codegen/golden/expected"


def _golden_specs():
    return load_specs([GOLDEN / "specs"], root=REPO)


def test_golden_modules_match():
    plan = plan_generation(_golden_specs(), GOLDEN / "expected", regenerate=REFRESH)
    assert plan.is_fresh, f"generated output changed; review, then refresh with `{REFRESH}`:\n{stale_diff(plan)}"


def test_golden_modules_run(pytester):
    for path in sorted((GOLDEN / "expected").glob("test_*.py")):
        pytester.makepyfile(**{path.stem: path.read_text()})
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "--opcheck-device", "all")
    outcomes = result.parseoutcomes()
    # cuda is not available here: with every device collected, those cases skip with a reason;
    # everything else must pass, and the declared expected failure must really fail.
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes.get("passed", 0) > 20
    assert outcomes.get("xfailed", 0) >= 1
    assert outcomes.get("skipped", 0) >= 1


def _spec(**overrides) -> M.OpSpec:
    fields = dict(
        name="demo",
        op="torch.sin",
        source="op_specs/demo.yaml",
        sha256="0" * 64,
        samples=(M.Sample("small", args=(M.TensorArg(shape=(3,)),)),),
        devices=("cpu",),
    )
    fields.update(overrides)
    return M.OpSpec(**fields)


def _parametrized(text: str) -> dict[str, list]:
    """Each test function of a rendered module → its parameter sets, in collection order."""
    namespace = {}
    exec(compile(text, "generated", "exec"), namespace)  # noqa: S102 - our own output
    out = {}
    for name, function in namespace.items():
        if name.startswith("test_"):
            (mark,) = [m for m in function.pytestmark if m.name == "parametrize"]
            assert mark.args[0] == ("device", "dtype", "sample")
            out[name] = list(mark.args[1])
    return out


def test_ids_are_device_dtype_sample_and_safe():
    text = render_module(
        _spec(
            dtypes=("float64", "complex128"),
            samples=(
                M.Sample("a.b_1", args=(M.TensorArg(shape=(2,)),)),
                M.Sample("c", args=(M.TensorArg(shape=(2,)),)),
            ),
        )
    )
    ids = [p.id for params in _parametrized(text).values() for p in params]
    assert "cpu-float64-a.b_1" in ids and "cpu-complex128-c" in ids
    assert all(set(i) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") for i in ids)


def test_each_function_covers_the_cases_of_its_check_in_order():
    spec = _spec(
        dtypes=("float64", "complex128"),
        lowprec_dtypes=("float32",),
        devices=("cpu", "mps", "cuda"),
        samples=(M.Sample("b", args=(M.TensorArg(shape=(2,)),)), M.Sample("a", args=(M.TensorArg(shape=(2,)),))),
    )
    functions = _parametrized(render_module(spec))
    assert list(functions) == [f"test_{check}" for check in spec.checks()]
    for name, params in functions.items():
        cases = [case for case in cases_of(spec) if f"test_{case.check}" == name]
        assert [(p.values, p.id) for p in params] == [((c.device, c.dtype, c.sample), c.param_id) for c in cases]
    assert [p.id for p in functions["test_lowprec"]] == [
        "cpu-float32-b",
        "cpu-float32-a",
        "mps-float32-b",
        "mps-float32-a",
        "cuda-float32-b",
        "cuda-float32-a",
    ]
    assert not [p for p in functions["test_gradcheck"] if p.values[0] == "mps"]  # mps has no float64


def test_no_axis_names_a_device_that_never_runs_there():
    text = render_module(_spec(devices=("cpu", "mps"), lowprec_dtypes=("float32",)))
    assert '@grid(SPEC, "gradcheck", devices=("cpu",), dtypes=("float64",))' in text
    assert '@grid(SPEC, "lowprec", devices=("cpu", "mps"), dtypes=("float32",))' in text


def test_a_rule_marks_exactly_its_cases_and_its_reason_is_written_once():
    spec = _spec(
        devices=("cpu", "cuda"),
        lowprec_dtypes=("float32",),
        samples=(M.Sample("a", args=(M.TensorArg(shape=(2,)),)), M.Sample("b", args=(M.TensorArg(shape=(2,)),))),
        skips=(
            M.Rule(
                where=M.Where(device=("cuda",), check=("lowprec",)),
                reason="no cuda kernel",
                location=M.Location("op_specs/demo.yaml", 9, 5),
            ),
        ),
        expected_failures=(
            M.Rule(where=M.Where(sample=("b",)), reason="known bug"),
            M.Rule(where=M.Where(device=("cuda",)), reason="cuda bug"),
            M.Rule(where=M.Where(check=("lowprec",), device=("cuda",)), reason="shadowed"),
        ),
    )
    text = render_module(spec)
    assert text.count("no cuda kernel") == 1 and text.count("known bug") == 1
    assert "XFAIL_1 = xfail(SPEC.expected_failures[1])" in text
    assert "XFAIL_2" not in text  # the skip rule, which wins, marks every case it matches
    marks = {
        f"{name}[{p.id}]": [(m.name, m.kwargs) for m in p.marks]
        for name, params in _parametrized(text).items()
        for p in params
    }
    skip = [("skip", {"reason": "no cuda kernel (op_specs/demo.yaml:9:5)"})]
    xfail = [("xfail", {"reason": "known bug", "strict": True})]
    xfail_cuda = [("xfail", {"reason": "cuda bug", "strict": True})]
    assert marks["test_lowprec[cuda-float32-a]"] == marks["test_lowprec[cuda-float32-b]"] == skip
    assert marks["test_lowprec[cpu-float32-b]"] == marks["test_gradcheck[cpu-float64-b]"] == xfail
    assert marks["test_gradcheck[cuda-float64-b]"] == xfail
    assert marks["test_gradcheck[cuda-float64-a]"] == xfail_cuda
    assert marks["test_gradcheck[cpu-float64-a]"] == marks["test_lowprec[cpu-float32-a]"] == []


def test_spec_strings_cannot_inject_code():
    evil = "x'); import os; os.system('echo pwned') #\n\"\"\"; raise SystemExit\n"
    spec = _spec(
        source="op_specs/evil\n import os.yaml",
        skips=(M.Rule(where=M.Where(sample=("small",)), reason=evil),),
        tolerances=(M.ToleranceRule(atol=1e-3, reason=evil),),
    )
    text = render_module(spec)
    tree = ast.parse(text)
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds == ["Expr", "Import"] + ["ImportFrom"] * 3 + ["Assign"] * 4 + ["FunctionDef"] * len(spec.checks())
    assert [target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets] == [
        "SOURCE",
        "SPEC",
        "SKIP_0",
        "MARKED",
    ]
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [a.name for node in imports for a in node.names][:4] == ["pytest", "grid", "skip", "run_check"]
    assert evil in [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    for line in text.splitlines()[:3]:
        assert line.startswith("#")


def test_model_round_trips_through_the_generated_source():
    spec = _golden_specs()[0]
    namespace = {}
    exec(compile(render_module(spec), "generated", "exec"), namespace)  # noqa: S102 - our own output
    assert namespace["SPEC"] == spec


def test_writes_only_changes_and_deletes_only_generated_files(tmp_path):
    out = tmp_path / "generated_tests"
    specs = _golden_specs()
    apply_plan(plan_generation(specs, out))
    written = {p.name: p.stat().st_mtime_ns for p in out.glob("test_*.py")}
    assert len(written) == len(specs)
    again = plan_generation(specs, out)
    assert again.is_fresh and not again.write

    user_file = out / "test_handwritten.py"
    user_file.write_text("def test_mine():\n    pass\n")
    stale = out / "test_removed_op.py"
    stale.write_text(f"{GENERATED_MARKER} from op_specs/removed_op.yaml.\n")
    plan = plan_generation(specs[:1], out, root=REPO)
    deleted = {p.name for p in plan.delete}
    assert deleted == {"test_removed_op.py"}  # its spec is gone; specs left out of this run keep their modules
    apply_plan(plan)
    assert user_file.exists() and not stale.exists()
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("test_*.py") if p.name in written} == {
        n: t for n, t in written.items() if (out / n).exists()
    }


def test_refuses_to_overwrite_a_file_it_did_not_generate(tmp_path):
    spec = _golden_specs()[0]
    (tmp_path / f"test_{spec.name}.py").write_text("# my own tests\n")
    with pytest.raises(GenerationError, match="was not generated by opcheck"):
        plan_generation([spec], tmp_path)
    assert (tmp_path / f"test_{spec.name}.py").read_text() == "# my own tests\n"


def _generate_in_subprocess(out: Path, hashseed: str) -> dict[str, bytes]:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    subprocess.run(
        [sys.executable, "-m", "opcheck", "generate", "--specs", "tests/codegen/golden/specs", "--out", str(out)],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_byte_identical_across_hash_seeds(tmp_path):
    out = tmp_path / "generated_tests"
    first = _generate_in_subprocess(out, "1")
    shutil.rmtree(out)
    second = _generate_in_subprocess(out, "12345")
    assert first and first == second


def test_committed_generated_tests_are_fresh():
    result = forked_python.run("opcheck", "generate", "--check", cwd=REPO)  # torch imported (forked_python.py)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_mode_prints_a_diff_and_fails_when_stale(tmp_path):
    shutil.copytree(GOLDEN / "specs", tmp_path / "op_specs")
    (tmp_path / "generated_tests").mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run(*args):  # `python -m opcheck ARGS`, forked with torch imported (tests/forked_python.py)
        return forked_python.run("opcheck", *args, cwd=tmp_path, env=env)

    stale = run("generate", "--check")
    assert stale.returncode == 1 and "+++ b/generated_tests/test_everything.py" in stale.stdout
    assert not list((tmp_path / "generated_tests").iterdir()), "--check must not write"
    # an absolute --out (as [tool.opcheck] out resolves to) still gives paths git applies from here
    absolute = run("generate", "--check", "--out", str(tmp_path / "generated_tests"))
    headers = [line for line in absolute.stdout.splitlines() if line.startswith(("--- ", "+++ "))]
    prefixes = ("a/generated_tests/", "b/generated_tests/")
    assert headers and all(line[4:].startswith(prefixes) for line in headers), headers
    assert run("generate").returncode == 0
    assert run("generate", "--check").returncode == 0
