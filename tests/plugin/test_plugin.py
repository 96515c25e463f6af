"""The pytest plugin, through pytester: markers, device/dtype selection, options, failure reports."""

import importlib.util
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

from plugin_helpers import generated_module, param, spec_source

from opcheck.plugins.settings import MARKERS, marker_lines
from opcheck.spec.model import CHECKS, Check

PROJECT = Path(__file__).resolve().parents[2]

SIN = spec_source("sin", "torch.sin", gradcheck="GradcheckFlags(check_forward_ad=True)")
SIN_MODULE = generated_module(
    SIN,
    {
        "gradcheck": [param(d, "float64", "vec") for d in ("cpu", "cuda", "mps")],
        "forward_ad": [param("cpu", "float64", "vec"), param("cpu", "complex128", "vec")],
        "gradgradcheck": [param("cpu", "float64", "vec"), param("cuda", "float64", "vec")],
        "lowprec": [param("cpu", "float32", "vec"), param("cpu", "bfloat16", "vec")],
    },
)

WRONG_OPS = """
import torch

class _SquareWrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * g * x

def square_wrong(x):
    return _SquareWrong.apply(x)

def square_wrong_if_2d(x):
    return _SquareWrong.apply(x) if x.dim() == 2 else x * x

class _OneWrongEntry(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gx = g * x.cos()
        wrong = torch.zeros(x.shape[-2:], dtype=torch.bool, device=x.device)
        wrong[0, 3] = True
        return torch.where(wrong, 2 * gx, gx)

def one_wrong_entry(x):
    return _OneWrongEntry.apply(x)

KINK = 0.0

def kinked(x):
    return (x - KINK).abs()
"""


def outcomes_by_id(result) -> dict[str, str]:
    """{nodeid: PASSED/FAILED/SKIPPED/XFAIL/XPASS} from a `-rA` short summary."""
    found = {}
    for line in result.outlines:
        m = re.match(r"^(PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR) (\S+::\S+)", line)
        if m:
            found[m.group(2)] = m.group(1)
    return found


def junit_outcomes(pytester, *args, subprocess=False) -> dict[str, str]:
    """{test name: PASSED/FAILED/SKIPPED/XFAIL} of a run, from its JUnit XML (skips included)."""
    xml = pytester.path / f"junit-{len(list(pytester.path.glob('junit-*.xml')))}.xml"
    run = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    result = run(f"--junitxml={xml}", *args)
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = [child.tag for child in case] + [child.get("type", "") for child in case]
        outcome = (
            "FAILED"
            if "failure" in kinds
            else "ERROR"
            if "error" in kinds
            else "XFAIL"
            if "pytest.xfail" in kinds
            else "SKIPPED"
            if "skipped" in kinds
            else "PASSED"
        )
        found[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return found, result


# ------------------------------------------------------------------------------------ markers
def test_markers_are_registered_for_every_check_kind(pytester):
    assert list(MARKERS) == list(CHECKS)
    assert MARKERS == {check.value: check.description for check in Check}
    result = pytester.runpytest("--markers")
    for line in marker_lines():
        result.stdout.fnmatch_lines([f"@pytest.mark.{line}"])
    for name in CHECKS:
        result.stdout.fnmatch_lines([f"@pytest.mark.{name}: opcheck: *"])


def test_pyproject_lists_the_same_markers():
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["pytest"]["ini_options"]["markers"] == marker_lines()
    assert config["project"]["entry-points"]["pytest11"] == {"opcheck": "opcheck.plugin"}


def test_generated_module_runs_without_unknown_marker_warnings_and_m_selects(pytester):
    pytester.makepyfile(test_sin=SIN_MODULE)
    result = pytester.runpytest(
        "-W", "error::pytest.PytestUnknownMarkWarning", "-m", "gradgradcheck", "-rA", "--opcheck-device", "all"
    )
    result.assert_outcomes(passed=1, skipped=1, deselected=7)
    assert outcomes_by_id(result)["test_sin.py::test_gradgradcheck[cpu-float64-vec]"] == "PASSED"
    assert len(selected(pytester, "-m", "not lowprec and not gradgradcheck", "--opcheck-device", "all")) == 5


# ------------------------------------------------------------------------------------ devices
def test_unavailable_devices_are_not_collected_and_said_once(pytester, monkeypatch):
    pytester.makepyfile(
        test_sin=SIN_MODULE,
        test_other="import pytest\n\n@pytest.mark.parametrize('device', ['mps'])\n"
        "def test_unrelated(device):\n    pass\n",
    )
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cuda,mps")
    result = pytester.runpytest("-rA")
    result.assert_outcomes(passed=7, deselected=3)  # a test that is not generated is never left out
    assert set(outcomes_by_id(result)) == {n for n in selected(pytester, "--opcheck-device", "cpu")}
    result.stdout.fnmatch_lines(
        [
            "collected 10 items / 3 deselected / 7 selected",
            "opcheck: cuda, mps unavailable: 3 tests not collected (--opcheck-device all to list them as skipped)",
        ]
    )
    assert "SKIPPED" not in result.stdout.str()
    # -m deselects first: what it leaves out is not counted as unavailable
    result = pytester.runpytest("-m", "gradgradcheck")
    result.assert_outcomes(passed=1, deselected=9)
    result.stdout.fnmatch_lines(["opcheck: cuda unavailable: 1 test not collected *"])
    # a test named whole, as a failure's rerun command names it, runs or skips with the reason
    result = pytester.runpytest(
        "-rs", "test_sin.py::test_gradcheck[cuda-float64-vec]", "test_sin.py::test_gradcheck[cpu-float64-vec]"
    )
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *: cuda is not available on this machine *"])
    assert "not collected" not in result.stdout.str()
    # nothing unavailable: no line
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "")
    result = pytester.runpytest("-m", "not gradcheck and not gradgradcheck")
    assert "not collected" not in result.stdout.str()


def test_unavailable_devices_skip_with_a_reason_when_asked_for(pytester, monkeypatch):
    pytester.makepyfile(test_sin=SIN_MODULE)
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cpu")
    # a device named on the command line runs or skips, never silently disappears
    pytester.runpytest("--opcheck-device", "cpu").assert_outcomes(skipped=6, deselected=3)
    result = pytester.runpytest("-rs", "--opcheck-device", "all")
    result.assert_outcomes(skipped=9)
    assert "not collected" not in result.stdout.str()
    lines = [line for line in result.outlines if line.startswith("SKIPPED")]
    reasons = {line.split(": ", 1)[1] for line in lines}
    counts = {
        r: sum(int(re.match(r"SKIPPED \[(\d+)\]", line).group(1)) for line in lines if line.endswith(r))
        for r in reasons
    }
    assert (
        counts
        == {
            "cpu is not available on this machine (OPCHECK_UNAVAILABLE_DEVICES lists it)": 6,
            "mps is not available on this machine (torch.backends.mps.is_available() is False)": 1,
            "cuda is not available on this machine (torch.cuda.is_available() is False)": 2,
        }
        if not torch.cuda.is_available()
        else counts
    )
    result.stdout.fnmatch_lines(["opcheck: * treated as unavailable: cpu"])


def test_the_runtimes_skip_is_reported_at_the_generated_tests_line(pytester, monkeypatch):
    pytester.makepyfile(test_sin=SIN_MODULE)
    line = SIN_MODULE.splitlines().index("    run_check(SPEC, 'gradgradcheck', device, dtype, sample)") + 1
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cpu")
    result = pytester.runpytest("-rs", "-m", "gradgradcheck", "--opcheck-device", "cpu")
    result.assert_outcomes(skipped=1, deselected=8)
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED [[]1[]] test_sin.py:{line}: cpu is not available on this machine "
            "(OPCHECK_UNAVAILABLE_DEVICES lists it)"
        ]
    )
    # xfail(strict) of a case that cannot run here: a skip, as pytest.skip inside it would be
    pytester.makepyfile(
        test_sq=generated_module(
            spec_source("sq", "torch.sin"),
            {"gradcheck": [param("cpu", "float64", "vec", marks="pytest.mark.xfail(reason='known bug', strict=True)")]},
        )
    )
    pytester.runpytest("test_sq.py", "--opcheck-device", "cpu").assert_outcomes(skipped=1)


def test_the_runtimes_skip_is_a_skip_without_the_plugin_too(pytester, monkeypatch):
    pytester.makepyfile(test_sin=SIN_MODULE)
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cuda")
    result = pytester.runpytest("-p", "no:opcheck", "-rs", "-k", "gradgradcheck")
    result.assert_outcomes(passed=1, skipped=1, deselected=7)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] *: cuda is not available on this machine (OPCHECK_UNAVAILABLE_DEVICES lists it)"]
    )


def selected(pytester, *args) -> set[str]:
    """The node ids a run would execute (collect-only)."""
    result = pytester.runpytest("--collect-only", "-q", *args)
    return {line for line in result.outlines if "::" in line}


def test_device_and_dtype_options_deselect(pytester):
    pytester.makepyfile(
        test_sin=SIN_MODULE,
        test_other="import pytest\n\n@pytest.mark.parametrize('device', ['mps'])\n"
        "def test_unrelated(device):\n    pass\n",
    )
    every = selected(pytester, "--opcheck-device", "all")
    assert len(every) == 10
    unrelated = "test_other.py::test_unrelated[mps]"  # not a generated test: never deselected
    cpu = selected(pytester, "--opcheck-device", "cpu")
    assert cpu == {n for n in every if "[cpu-" in n} | {unrelated} and len(cpu) == 7
    accel = selected(pytester, "--opcheck-device", "mps,cuda")
    assert accel == selected(
        pytester, "--opcheck-device", "mps", "--opcheck-device", "cuda", "--opcheck-dtype", "float64"
    )
    assert accel == {
        "test_sin.py::test_gradcheck[cuda-float64-vec]",
        "test_sin.py::test_gradcheck[mps-float64-vec]",
        "test_sin.py::test_gradgradcheck[cuda-float64-vec]",
        unrelated,
    }
    assert selected(pytester, "--opcheck-dtype", "float32,complex128") == {
        "test_sin.py::test_forward_ad[cpu-complex128-vec]",
        "test_sin.py::test_lowprec[cpu-float32-vec]",
        unrelated,
    }
    # `all` takes every dtype, as for devices
    assert selected(pytester, "--opcheck-device", "all", "--opcheck-dtype", "all") == every
    assert selected(pytester, "--opcheck-device", "cpu", "-m", "lowprec") == {
        "test_sin.py::test_lowprec[cpu-float32-vec]",
        "test_sin.py::test_lowprec[cpu-bfloat16-vec]",
    }
    # and the run reports them as deselected
    pytester.runpytest("--opcheck-device", "cuda", "--opcheck-dtype", "float64").assert_outcomes(
        skipped=2, passed=1, deselected=7
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--opcheck-device", "cdua"], "--opcheck-device: unknown device 'cdua' (did you mean 'cuda'?)*"),
        (["--opcheck-device", "all,cpu"], "--opcheck-device: 'all' already means every device type; drop cpu or 'all'"),
        (["--opcheck-threads", "0"], "--opcheck-threads: expected a positive number of threads or 'keep', got '0'"),
        (
            ["--opcheck-threads", "many"],
            "--opcheck-threads: expected a positive number of threads or 'keep', got 'many'",
        ),
        (["--opcheck-dtype", "float46"], "--opcheck-dtype: unknown dtype 'float46' (did you mean 'float64'?)*"),
        (["--opcheck-dtype", "all,float64"], "--opcheck-dtype: 'all' already means every dtype; drop float64 or 'all'"),
        (
            ["--opcheck-policy", "full", "--opcheck-budget", "1000"],
            "--opcheck-budget sets the budget of the auto policy; it has no effect with --opcheck-policy=full*",
        ),
        (["--opcheck-budget", "lots"], "--opcheck-budget: expected a positive number of Jacobian entries*"),
        (["--opcheck-plot", "afile"], "--opcheck-plot: */afile exists and is not a directory"),
    ],
)
def test_bad_options_are_usage_errors(pytester, args, message):
    pytester.makefile(".txt", afile="x")
    pytester.path.joinpath("afile.txt").rename(pytester.path / "afile")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_plot_without_matplotlib_is_a_usage_error(pytester, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    result = pytester.runpytest("--opcheck-plot", "plots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --opcheck-plot needs matplotlib, which is not installed (pip install 'opcheck[plot]')"]
    )


def test_bad_budget_in_the_environment_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("OPCHECK_JACOBIAN_BUDGET", "0")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: OPCHECK_JACOBIAN_BUDGET: expected a positive number*"])


# ------------------------------------------------------------------------------------ spec marks
def test_expected_failures_are_strict(pytester):
    pytester.syspathinsert()
    pytester.makepyfile(wrong_ops=WRONG_OPS)
    xfail = "pytest.mark.xfail(reason='known bug', strict=True)"
    spec = spec_source("sq", "wrong_ops:square_wrong")
    pytester.makepyfile(
        test_sq=generated_module(
            spec,
            {
                "gradcheck": [param("cpu", "float64", "vec", marks=xfail)],
                "gradgradcheck": [param("cpu", "float64", "vec", marks=xfail)],  # backward wrong, its derivative right
            },
        )
    )
    result = pytester.runpytest("-rA")
    result.assert_outcomes(xfailed=1, failed=1)
    assert outcomes_by_id(result) == {
        "test_sq.py::test_gradcheck[cpu-float64-vec]": "XFAIL",
        "test_sq.py::test_gradgradcheck[cpu-float64-vec]": "FAILED",
    }
    result.stdout.fnmatch_lines(["*[[]XPASS(strict)[]] known bug*"])


# ------------------------------------------------------------------------------------ failures
def test_failure_quotes_the_real_node_id_and_writes_a_heatmap(pytester):
    pytest.importorskip("matplotlib")
    pytester.syspathinsert()
    pytester.makepyfile(wrong_ops=WRONG_OPS)
    folder = pytester.mkdir("generated_tests")
    folder.joinpath("test_sq.py").write_text(
        generated_module(spec_source("sq", "wrong_ops:square_wrong"), {"gradcheck": [param("cpu", "float64", "vec")]})
    )
    result = pytester.runpytest("--opcheck-plot", "plots")
    result.assert_outcomes(failed=1)
    png = pytester.path / "plots" / "test_sq.py_test_gradcheck_cpu-float64-vec.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    result.stdout.fnmatch_lines(
        [
            "E       opcheck.runtime.checks.CheckFailed: opcheck gradcheck failed for wrong_ops:square_wrong on "
            "cpu/float64, sample 'vec'",
            "E         sample:      'vec' at op_specs/x.yaml:6:5",
            "E         check path:  VJP (backward)",
            f"E         heatmap:     {png}",
            "E         rerun:       pytest 'generated_tests/test_sq.py::test_gradcheck[[]cpu-float64-vec[]]'",
            "E       Jacobian mismatch for output 0 with respect to input 0,",
        ]
    )
    # the rerun command, run as printed, runs exactly that case
    rerun = pytester.runpytest("generated_tests/test_sq.py::test_gradcheck[cpu-float64-vec]")
    rerun.assert_outcomes(failed=1)


def test_policy_and_budget_options_reach_the_checks(pytester):
    pytester.syspathinsert()
    pytester.makepyfile(wrong_ops=WRONG_OPS)
    big = "(Sample('m', args=(TensorArg(shape=(32, 32)),)),)"
    flags = "GradcheckFlags(check_batched_grad=False{})"
    pytester.makepyfile(
        test_auto=generated_module(
            spec_source("auto", "wrong_ops:one_wrong_entry", big, gradcheck=flags.format("")),
            {"gradcheck": [param("cpu", "float64", "m")]},
        ),
        test_fast=generated_module(
            spec_source("fast", "wrong_ops:one_wrong_entry", big, gradcheck=flags.format(", fast_mode='true'")),
            {"gradcheck": [param("cpu", "float64", "m")]},
        ),
    )
    assert outcomes_by_id(pytester.runpytest("-rA")) == {
        "test_auto.py::test_gradcheck[cpu-float64-m]": "FAILED",
        "test_fast.py::test_gradcheck[cpu-float64-m]": "PASSED",
    }
    pytester.runpytest("--opcheck-policy", "full").assert_outcomes(failed=2)
    pytester.runpytest("--opcheck-policy", "fast").assert_outcomes(passed=2)
    result = pytester.runpytest("--opcheck-budget", "2**19")  # auto now takes projections, which see the entry
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "opcheck: fast_mode per spec; auto budget 524288 Jacobian entries (--opcheck-budget)*",
            "*policy:      auto: projections (J·U from *), 1048576 entries > budget 524288 from --opcheck-budget",
        ]
    )


def test_a_redraw_is_announced_in_the_report(pytester):
    from opcheck.runtime.samples import build_calls
    from opcheck.spec.case import CaseId
    from opcheck.spec.model import OpSpec, Sample, TensorArg

    sample = Sample("vec", args=(TensorArg(shape=(4,)),))
    spec = OpSpec(name="k", op="torch.abs", source="op_specs/k.yaml", sha256="0", samples=(sample,))
    (call,) = build_calls(spec, sample, "cpu", "float64", CaseId("k", "gradcheck", "cpu", "float64", "vec").seed())
    kink = float(call.args[0].detach()[1]) + 3e-7  # the first draw straddles the kink at this point
    pytester.syspathinsert()
    pytester.makepyfile(wrong_ops=WRONG_OPS.replace("KINK = 0.0", f"KINK = {kink!r}"))
    pytester.makepyfile(
        test_k=generated_module(
            spec_source("k", "wrong_ops:kinked", gradcheck="GradcheckFlags(check_batched_grad=False)"),
            {"gradcheck": [param("cpu", "float64", "vec")]},
        )
    )
    result = pytester.runpytest("-rA")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*/test_k.py:*: OpcheckRedrawWarning: opcheck: k test_gradcheck[[]cpu-float64-vec[]]: passed after 1 "
            "re-draw*",
            "*Captured stdout call*",
            "opcheck: k test_gradcheck[[]cpu-float64-vec[]]: passed after 1 re-draw(s) of sample 'vec'; earlier draws "
            "landed next to a non-differentiable point:",
            "  seed *: the numerical derivative at the mismatched entries changes by up to * between eps=1e-06 and "
            "eps=5e-07",
            "  passing draw: seed * (re-draw 1)",
        ]
    )


# ------------------------------------------------------------------------------------ parallel
PARALLEL_SUITE = generated_module(
    spec_source(
        "par",
        "wrong_ops:square_wrong_if_2d",
        "(Sample('a', args=(TensorArg(shape=(3,)),)), "
        "Sample('b', args=(TensorArg(shape=(2, 2), noncontiguous=True),)))",
    ),
    {
        "gradcheck": [
            param(d, t, s, marks="pytest.mark.xfail(reason='x', strict=True)" if (t, s) == ("float64", "b") else None)
            for d in ("cpu", "mps")
            for t in ("float64", "complex128")
            for s in ("a", "b")
        ],
        "gradgradcheck": [param("cpu", "float64", "a"), param("cpu", "float64", "b")],
        "lowprec": [param("cpu", "float32", "a"), param("cpu", "bfloat16", "b")],
    },
)


@pytest.mark.long
def test_xdist_gives_the_serial_outcomes(pytester):
    pytest.importorskip("xdist")
    pytester.syspathinsert()
    pytester.makepyfile(test_par=PARALLEL_SUITE, wrong_ops=WRONG_OPS)
    serial, _ = junit_outcomes(pytester, "--opcheck-device", "all")
    assert len(serial) == 12 and sorted(set(serial.values())) == ["FAILED", "PASSED", "SKIPPED", "XFAIL"]
    parallel, result = junit_outcomes(pytester, "-n", "2", "--opcheck-device", "all", subprocess=True)
    assert parallel == serial
    result.stdout.fnmatch_lines(["*2 workers [[]12 items[]]*"])
    # by default the workers leave mps out, and the controller says so once
    parallel, result = junit_outcomes(pytester, "-n", "2", subprocess=True)
    assert parallel == {k: v for k, v in serial.items() if "[mps-" not in k} and len(parallel) == 8
    result.stdout.fnmatch_lines(["*2 workers [[]8 items[]]*", "opcheck: mps unavailable: 4 tests not collected *"])
    assert result.stdout.str().count("not collected") == 1


def test_pytest_split_shards_are_disjoint_and_cover_the_suite(pytester):
    pytest.importorskip("pytest_split")
    pytester.syspathinsert()
    pytester.makepyfile(test_par=PARALLEL_SUITE, wrong_ops=WRONG_OPS)
    every = selected(pytester, "--opcheck-device", "all")
    shards = [selected(pytester, "--splits", "3", "--group", str(g), "--opcheck-device", "all") for g in (1, 2, 3)]
    assert all(shards) and sum(map(len, shards)) == len(every) == 12
    assert set().union(*shards) == every
    # a shard runs its tests as the whole suite does
    outcomes, _ = junit_outcomes(pytester, "--opcheck-device", "all")
    shard_outcomes, _ = junit_outcomes(pytester, "--splits", "3", "--group", "2", "--opcheck-device", "all")
    assert shard_outcomes == {
        k: v for k, v in outcomes.items() if k.replace("test_par::", "test_par.py::") in shards[1]
    }


# ------------------------------------------------------------------------------------ threads
THREADS_SPY = """
import pytest
import torch

SEEN = {}

@pytest.mark.gradcheck
@pytest.mark.parametrize(('device', 'dtype', 'sample'), [pytest.param('cpu', 'float64', 'v', id='cpu-float64-v')])
def test_gradcheck(device, dtype, sample):
    SEEN['generated'] = torch.get_num_threads()

def test_plain():
    SEEN['plain'] = torch.get_num_threads()

def test_report():
    print('threads seen:', SEEN, 'now:', torch.get_num_threads())
"""


@pytest.mark.parametrize(
    "args, ini, generated",
    [
        ((), None, 1),  # the default
        (("--opcheck-threads", "3"), None, 3),
        ((), "2", 2),
        (("--opcheck-threads", "3"), "2", 3),  # the command line wins
        (("--opcheck-threads", "keep"), None, "before"),
        ((), "keep", "before"),
    ],
)
def test_threads_are_set_around_generated_tests_only(pytester, args, ini, generated):
    before = torch.get_num_threads()
    if before in (1, 2, 3):  # make "kept" distinguishable from every value set above
        torch.set_num_threads(4)
    try:
        outer = torch.get_num_threads()
        if ini is not None:
            pytester.makeini(f"[pytest]\nopcheck_threads = {ini}\n")
        pytester.makepyfile(test_threads=THREADS_SPY)
        result = pytester.runpytest("-s", "-p", "no:randomly", *args)
        result.assert_outcomes(passed=3)
        want = outer if generated == "before" else generated
        result.stdout.fnmatch_lines([f"*threads seen: {{'generated': {want}, 'plain': {outer}}} now: {outer}"])
        assert torch.get_num_threads() == outer
    finally:
        torch.set_num_threads(before)


def test_a_bad_ini_thread_count_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\nopcheck_threads = -1\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini opcheck_threads (*tox.ini): expected a positive number of threads or 'keep', got '-1'"]
    )


def test_each_of_the_plugins_is_registered_under_its_module(pytester):
    import opcheck.plugin

    config = pytester.parseconfigure()
    for name in opcheck.plugin.pytest_plugins:
        module = config.pluginmanager.get_plugin(name)
        assert module is not None and module.__name__ == name
        assert any(attr.startswith("pytest_") for attr in vars(module)), f"{name} holds no hook"
