"""The mutation suite: generated tests catch real gradient bugs, and only bugs.

specs/ holds one family per bug: a mutant (an op from mutants.py with one deliberate mistake, or
a spec with a false declaration) and its correct twin, tested with the same samples and checks.
They are compiled into a temporary folder and the generated suite runs once, in a subprocess
(module-scoped fixture). Then, per mutant: exactly the checks named in MUTANTS fail, and each
failure names the op, the spec, the check path, and what the bug looks like; per twin: nothing
fails and something passes, including every check that catches its mutant.

To see one failure as a user would, from the repository root:

    opcheck generate --specs tests/mutation/specs --out /tmp/mutation_tests
    PYTHONPATH=tests/mutation python -m pytest /tmp/mutation_tests/test_mutant_missing_factor.py
"""

from __future__ import annotations

import os
import re
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from opcheck.codegen import apply_plan, plan_generation
from opcheck.spec import load_specs
from opcheck.spec.loader import generated_test_ids
from tests import forked_python

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SPECS = HERE / "specs"


@dataclass(frozen=True)
class Catch:
    """One check kind that must fail on a mutant: the failure's check path and what it must say."""

    path: str  # the "check path:" row up to any " (detail)", e.g. "VJP", "VJP of VJP"
    says: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mutant:
    op: str
    twin: str  # the spec of the correct twin
    caught_by: dict  # check kind -> Catch; exactly these check kinds fail


MUTANTS = {
    "mutant_missing_factor": Mutant(
        "mutants:SinHalfGrad.apply",
        "twin_missing_factor",
        {"gradcheck": Catch("VJP", ("analytical ≈ 0.5 × numerical everywhere",))},
    ),
    "mutant_sign_flip": Mutant(
        "mutants:CosSignFlip.apply",
        "twin_sign_flip",
        {"gradcheck": Catch("VJP", ("analytical ≈ -1 × numerical everywhere", "sign is flipped"))},
    ),
    "mutant_one_wrong_entry": Mutant(
        "mutants:TanhOneWrongEntry.apply",
        "twin_one_wrong_entry",
        {
            "gradcheck": Catch(
                "VJP",
                (
                    "auto: full Jacobian (1048576 entries <= budget",
                    "1 of 1048576 Jacobian entries",
                    "d out[0, 3] / d in[0, 3]",
                    "only one entry differs",
                ),
            )
        },
    ),
    "mutant_missing_conj": Mutant(
        "mutants:ComplexExpNoConj.apply",
        "twin_missing_conj",
        {
            "gradcheck": Catch("VJP", ("cpu/complex128", "a .conj() is missing in backward")),
            # The double backward runs the same backward again, so the conj is missing there too.
            "gradgradcheck": Catch("VJP of VJP", ("cpu/complex128", "imaginary part")),
        },
    ),
    "mutant_wrong_jvp": Mutant(
        "mutants:ExpWrongJvp.apply",
        "twin_wrong_jvp",
        {"forward_ad": Catch("JVP", ("Jacobian computed with forward mode mismatch", "check: forward AD (JVP)"))},
    ),
    "mutant_nograd_double_backward": Mutant(
        "mutants:SinNoGradBackward.apply",
        "twin_double_backward",
        {
            "gradgradcheck": Catch(
                "VJP of VJP", ("Numerical gradient for function expected to be zero", "outputs do not require grad")
            )
        },
    ),
    "mutant_detached_double_backward": Mutant(
        "mutants:SinDetachedBackward.apply",
        "twin_double_backward",
        {"gradgradcheck": Catch("VJP of VJP", ("analytical gradient is all zero", ".detach()"))},
    ),
    "mutant_broadcast_wrong_dim": Mutant(
        "mutants:BroadcastMulWrongDim.apply",
        "twin_broadcast_wrong_dim",
        {
            "gradcheck": Catch(
                "VJP",
                (
                    "d output 0 / d input 0",
                    "input shape (4, 1)",
                    "is broadcast along output dim(s) 1",
                    "reduced over the wrong one",
                ),
            )
        },
    ),
    "mutant_wrong_in_float32": Mutant(
        "mutants:SinWrongInFloat32.apply",
        "twin_wrong_in_float32",
        {
            "lowprec": Catch(
                "VJP at float32 against the float64 reference",
                ("cpu/float32", "gradient of input 0 differs from the float64 run"),
            )
        },
    ),
    "mutant_nondeterministic_backward": Mutant(
        "mutants:SinNondetBackward.apply",
        "twin_nondeterministic_backward",
        {"gradcheck": Catch("VJP", ("VJP (reentrancy)", "Backward is not reentrant", "nondet_tol"))},
    ),
    "mutant_ignores_grad_output": Mutant(
        "mutants:ExpIgnoresGradOutput.apply",
        "twin_ignores_grad_output",
        {
            "gradcheck": Catch("VJP", ("d out[", "numerical 0,")),
            # The double backward differentiates the saved output through the same backward.
            "gradgradcheck": Catch("VJP of VJP", ("d grad of input 0 / d input 0",)),
        },
    ),
    "mutant_forward_ad_declared_unsupported": Mutant(
        "mutants:TanhWithJvp.apply",
        "twin_forward_ad_declared_unsupported",
        {"forward_ad_unsupported": Catch("JVP", ("declares `supports_forward_ad: false`", "works"))},
    ),
    "mutant_gradgrad_declared_unsupported": Mutant(
        "mutants:ExpOldStyle.apply",
        "twin_gradgrad_declared_unsupported",
        {"gradgrad_unsupported": Catch("VJP of VJP", ("declares `supports_gradgrad: false`", "works"))},
    ),
    "mutant_wrong_jvp_in_backward": Mutant(
        "mutants:SinViaCosWrongJvp.apply",
        "twin_wrong_jvp_in_backward",
        {"fwgrad_bwgrad": Catch("JVP of VJP", ("check: forward AD (JVP of VJP)", "d grad of input 0 / d input 0"))},
    ),
    "mutant_inplace_backward": Mutant(
        "mutants:SinInplaceBackward.apply",
        "twin_inplace_backward",
        {"gradcheck": Catch("batched VJP", ("(batched backward)", "aten::copy_", "in-place"))},
    ),
    "mutant_undefined_grad_output": Mutant(
        "mutants:SinCosAssumesGrads.apply",
        "twin_undefined_grad_output",
        {
            # Computing one output's VJP leaves the other's grad_output undefined (None): backward crashes.
            "gradcheck": Catch("VJP", ("raised TypeError", "'NoneType'", "set_materialize_grads(False)"))
        },
    ),
    # 16,777,216 Jacobian entries, beyond the budget: auto checks the VJP against the (right) JVP.
    "mutant_wrong_tail_beyond_budget": Mutant(
        "mutants:SinWrongTail.apply",
        "twin_wrong_tail_beyond_budget",
        {
            "gradcheck": Catch(
                "VJP",
                (
                    "policy:      auto: projections (J·U from forward AD), 16777216 entries > budget",
                    "auto: VJP against JVP projections (J·U from forward AD)",
                    "differ between the VJP and the JVP beyond the rounding bound",
                    "backward is wrong somewhere in this block",
                ),
            )
        },
    ),
    # A sparse input checked with masked semantics: the one wrong element is a specified one.
    "mutant_sparse_one_wrong_value": Mutant(
        "mutants:SparseMmWrongValue.apply",
        "twin_sparse_one_wrong_value",
        {
            "gradcheck": Catch(
                "VJP",
                (
                    "Tensor[16, 16] float64 (requires_grad, sparse_coo, nnz=51)",
                    "4 of 16384 Jacobian entries",
                    "analytical 0, numerical",
                    "all wrong entries belong to input element [",
                    "4 of the 4 above are specified elements",
                ),
            )
        },
    ),
}

TWINS = {
    "twin_missing_factor": "mutants:Sin.apply",
    "twin_sign_flip": "mutants:Cos.apply",
    "twin_one_wrong_entry": "mutants:Tanh.apply",
    "twin_missing_conj": "mutants:ComplexExp.apply",
    "twin_wrong_jvp": "mutants:Exp.apply",
    "twin_double_backward": "mutants:SinOldStyle.apply",
    "twin_broadcast_wrong_dim": "mutants:BroadcastMul.apply",
    "twin_wrong_in_float32": "mutants:SinOldStyle.apply",
    "twin_nondeterministic_backward": "mutants:SinOldStyle.apply",
    "twin_ignores_grad_output": "mutants:ExpOldStyle.apply",
    "twin_forward_ad_declared_unsupported": "mutants:TanhNoJvp.apply",
    "twin_gradgrad_declared_unsupported": "mutants:ExpOnceDifferentiable.apply",
    "twin_wrong_jvp_in_backward": "mutants:SinViaCos.apply",
    "twin_inplace_backward": "mutants:SinVmappable.apply",
    "twin_undefined_grad_output": "mutants:SinCos.apply",
    "twin_wrong_tail_beyond_budget": "mutants:SinBatched.apply",
    "twin_sparse_one_wrong_value": "mutants:SparseMm.apply",
}

# Bugs that a deliberately weaker configuration misses: each documents why a default exists.
ESCAPES = {
    # One random projection vᵀJu of a 32x32 Jacobian hides one wrong entry: the reason the auto
    # policy computes the full Jacobian within its budget.
    "escape_one_wrong_entry_fast_mode": "mutants:TanhOneWrongEntry.apply",
    # Beyond the budget too: vᵀJu of a 64x64 elementwise op hides a 10% error on 7 elements, the
    # reason auto runs entrywise projections there instead of torch's fast mode.
    "escape_wrong_tail_fast_mode": "mutants:SinWrongTail.apply",
}

REGENERATE = "opcheck generate --specs tests/mutation/specs --out <tmp>"


@dataclass(frozen=True)
class Outcome:
    spec: str
    check: str  # the check kind, from the test function's name
    test_id: str  # test_<check>[<device>-<dtype>-<sample>]
    status: str  # passed, failed, error, skipped
    message: str  # the exception's text for failed/error, else ""


@dataclass(frozen=True, repr=False)
class SuiteRun:
    specs: dict  # name -> OpSpec
    outcomes: list
    output: str  # pytest's stdout and stderr, for assertion messages

    def __repr__(self) -> str:  # shown in tracebacks: the counts, not every spec
        counts = {s: sum(o.status == s for o in self.outcomes) for s in ("passed", "failed", "error", "skipped")}
        return f"SuiteRun({len(self.specs)} specs, {counts})"

    def of(self, spec: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.spec == spec]


def _exception_text(longrepr: str) -> str:
    """The exception's own text out of a JUnit element's text (pytest's long report).

    The element text is the whole report, whatever the pytest release; the `message` attribute is
    not (pytest 9.2 cuts it to 500 characters). pytest writes the exception's lines with an `E`
    in the first column, so the test's source listed above them never counts as the message.
    """
    lines = [line[1:] for line in longrepr.splitlines() if line[:1] == "E" and line[1:2] in ("", " ")]
    return textwrap.dedent("\n".join(lines)).strip()


def _parse_junit(path: Path) -> list[Outcome]:
    outcomes = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "")
        status, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = _exception_text(node.text or "") or node.get("message") or ""
                break
        check = re.sub(r"^test_", "", name.split("[", 1)[0])
        outcomes.append(Outcome(module.removeprefix("test_"), check, name, status, message))
    return outcomes


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> SuiteRun:
    """Generate specs/ into a temporary folder and run the generated suite once."""
    out = tmp_path_factory.mktemp("mutation_tests")
    specs = load_specs([SPECS], root=REPO)
    apply_plan(plan_generation(specs, out, regenerate=REGENERATE))
    junit = out / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # forked with torch imported (tests/forked_python.py); the tests run in the fresh process
    # pytest's supervisor starts
    run = forked_python.run(
        "pytest",
        *[
            "-q",
            "-rf",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "-p",
            "no:benchmark",
            "-p",
            "no:randomly",
            f"--junitxml={junit}",
            str(out),
        ],
        cwd=out,
        env=env,
        timeout=300,
    )
    output = run.stdout + run.stderr
    assert junit.exists(), f"the generated suite did not run (exit status {run.returncode}):\n{output}"
    return SuiteRun({s.name: s for s in specs}, _parse_junit(junit), output)


def test_every_spec_is_classified_and_every_generated_test_ran(suite):
    assert set(suite.specs) == set(MUTANTS) | set(TWINS) | set(ESCAPES), (
        "every spec in tests/mutation/specs is a mutant, a twin or an escape of this file's tables"
    )
    for name, spec in suite.specs.items():
        expected = set(generated_test_ids(spec))
        ran = {o.test_id for o in suite.of(name)}
        assert ran == expected, (
            f"{name}: generated tests without an outcome: {sorted(expected - ran)}\n{suite.output[-3000:]}"
        )
    ops = {**{n: m.op for n, m in MUTANTS.items()}, **TWINS, **ESCAPES}
    assert {n: s.op for n, s in suite.specs.items()} == ops
    assert {m.twin for m in MUTANTS.values()} == set(TWINS)


def _check_path(message: str) -> str:
    row = re.search(r"^\s*check path:\s+(.*)$", message, re.M)
    assert row, f"the failure has no 'check path:' row:\n{message}"
    return row.group(1).split(" (", 1)[0]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught_and_the_failure_points_at_the_bug(suite, name):
    mutant = MUTANTS[name]
    outcomes = suite.of(name)
    failing = {o.check for o in outcomes if o.status == "failed"}
    errors = [o for o in outcomes if o.status == "error"]
    assert not errors, f"{name}: errors outside the test call:\n" + "\n".join(o.message for o in errors)
    assert failing == set(mutant.caught_by), (
        f"{name} ({mutant.op}): expected exactly {sorted(mutant.caught_by)} to fail, got {sorted(failing)}:\n"
        + "\n".join(f"  {o.test_id}: {o.status}" for o in outcomes)
    )
    for o in outcomes:
        if o.status != "failed":
            continue
        catch = mutant.caught_by[o.check]
        says = (mutant.op, f"spec {name!r}", suite.specs[name].source, *catch.says)
        missing = [s for s in says if s not in o.message]
        assert not missing, f"{name} {o.test_id}: the failure does not say {missing}:\n{o.message}"
        assert _check_path(o.message) == catch.path, f"{name} {o.test_id}: wrong check path:\n{o.message}"


@pytest.mark.parametrize("name", sorted(TWINS))
def test_correct_twin_passes_every_check(suite, name):
    outcomes = suite.of(name)
    bad = [o for o in outcomes if o.status in ("failed", "error")]
    assert not bad, f"{name} ({TWINS[name]}) is correct, yet:\n" + "\n\n".join(
        f"{o.test_id}:\n{o.message}" for o in bad
    )
    passed = {o.check for o in outcomes if o.status == "passed"}
    # The twin is a control only if the very checks that catch its mutants ran on it and passed.
    catching = {check for m in MUTANTS.values() if m.twin == name for check in m.caught_by}
    assert catching <= passed, f"{name}: {sorted(catching - passed)} did not pass on the twin"


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_weaker_configuration_misses_the_bug(suite, name):
    outcomes = suite.of(name)
    assert outcomes and all(o.status == "passed" for o in outcomes), (
        f"{name} was expected to pass (its configuration is too weak to see the bug); if opcheck now catches "
        "it, the matching mutant no longer shows why the default matters: make its bug subtler.\n"
        + "\n".join(f"{o.test_id}: {o.status}\n{o.message}" for o in outcomes)
    )
