"""The plugin's ini settings, through pytester: alone, overridden by the command line, and bad values."""

import pytest
from plugin_helpers import generated_module, param, spec_source

SIN_MODULE = generated_module(
    spec_source("sin", "torch.sin"),
    {
        "gradcheck": [param(d, "float64", "vec") for d in ("cpu", "cuda", "mps")],
        "lowprec": [param("cpu", "float32", "vec"), param("cpu", "bfloat16", "vec")],
    },
)


def selected(pytester, *args) -> set[str]:
    """The node ids a run would run (after deselection)."""
    result = pytester.runpytest("--collect-only", "-q", *args)
    return {line for line in result.outlines if "::" in line}


def header(pytester, *args) -> str:
    """The plugin's line of the report header."""
    result = pytester.runpytest("--collect-only", *args)
    lines = [line for line in result.outlines if line.startswith("opcheck: ") and ";" in line]
    assert len(lines) == 1, result.outlines
    return lines[0]


def test_ini_settings_alone_select_and_configure(pytester):
    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        opcheck_device = ["cpu"]
        opcheck_dtype = "float64 float32"
        opcheck_policy = "auto"
        opcheck_budget = "2**10"
        opcheck_threads = "2"
        """
    )
    pytester.makepyfile(test_sin=SIN_MODULE)
    assert selected(pytester) == {
        "test_sin.py::test_gradcheck[cpu-float64-vec]",
        "test_sin.py::test_lowprec[cpu-float32-vec]",
    }
    assert header(pytester) == (
        "opcheck: policy auto; auto budget 1024 Jacobian entries (ini opcheck_budget); devices cpu; "
        "dtypes float64,float32; 2 torch thread(s)"
    )


def test_pytest_ini_takes_comma_separated_names(pytester):
    pytester.makeini("[pytest]\nopcheck_device = cpu,mps\nopcheck_dtype = bfloat16\nopcheck_policy = fast\n")
    pytester.makepyfile(test_sin=SIN_MODULE)
    assert selected(pytester, "--opcheck-device", "all") == {"test_sin.py::test_lowprec[cpu-bfloat16-vec]"}
    assert header(pytester).startswith("opcheck: policy fast; devices cpu,mps; dtypes bfloat16;")


def test_the_command_line_overrides_the_ini(pytester):
    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        opcheck_device = ["cpu"]
        opcheck_dtype = ["float32"]
        opcheck_policy = "auto"
        opcheck_budget = "1000"
        """
    )
    pytester.makepyfile(test_sin=SIN_MODULE)
    assert selected(pytester, "--opcheck-device", "all", "--opcheck-dtype", "float64") == {
        f"test_sin.py::test_gradcheck[{d}-float64-vec]" for d in ("cpu", "cuda", "mps")
    }
    assert header(pytester, "--opcheck-budget", "2000").startswith(
        "opcheck: policy auto; auto budget 2000 Jacobian entries (--opcheck-budget);"
    )
    # The run's policy replaces the project's, and the project's budget then has nothing to say.
    assert header(pytester, "--opcheck-policy", "full").startswith("opcheck: policy full; devices cpu;")


def test_the_environment_budget_overrides_the_ini(pytester, monkeypatch):
    pytester.makeini("[pytest]\nopcheck_budget = 1000\n")
    pytester.makepyfile(test_sin=SIN_MODULE)
    monkeypatch.setenv("OPCHECK_JACOBIAN_BUDGET", "3000")
    assert "auto budget 3000 Jacobian entries (OPCHECK_JACOBIAN_BUDGET)" in header(pytester)


def test_results_path_from_the_ini_is_relative_to_the_ini_file(pytester, monkeypatch):
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nopcheck_results = "build/opcheck.json"\n')
    pytester.makepyfile(test_sin=SIN_MODULE.replace("run_check(SPEC,", "(SPEC,"))
    elsewhere = pytester.mkdir("elsewhere")
    monkeypatch.chdir(elsewhere)
    pytester.runpytest("--rootdir", str(pytester.path), str(pytester.path)).assert_outcomes(passed=3)
    assert (pytester.path / "build" / "opcheck.json").is_file()
    assert not (elsewhere / "build").exists()
    pytester.runpytest(str(pytester.path), "--opcheck-results", "mine.json").assert_outcomes(passed=3)
    assert (elsewhere / "mine.json").is_file()


@pytest.mark.parametrize(
    "ini, message",
    [
        ("opcheck_device = cdua", "ini opcheck_device (*tox.ini): unknown device 'cdua' (did you mean 'cuda'?)*"),
        ("opcheck_device = all cpu", "ini opcheck_device (*tox.ini): 'all' already means every device type*"),
        ("opcheck_dtype = float46", "ini opcheck_dtype (*tox.ini): unknown dtype 'float46' (did you mean 'float64'?)*"),
        ("opcheck_policy = fulll", "ini opcheck_policy (*tox.ini): unknown policy 'fulll' (did you mean 'full'?)*"),
        ("opcheck_budget = lots", "ini opcheck_budget (*tox.ini): expected a positive number of Jacobian entries*"),
        ("opcheck_threads = none", "ini opcheck_threads (*tox.ini): expected a positive number of threads or 'keep'*"),
        (
            "opcheck_policy = fast\nopcheck_budget = 1000",
            "ini opcheck_budget (*tox.ini) sets the budget of the auto policy; it has no effect with 'fast' "
            "(ini opcheck_policy (*tox.ini)) (drop one of them)",
        ),
        ("opcheck_results = adir", "ini opcheck_results (*tox.ini): */adir is a directory; expected a file path*"),
    ],
)
def test_bad_ini_values_are_usage_errors_naming_the_key(pytester, ini, message):
    pytester.mkdir("adir")
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str()


def test_a_command_line_budget_with_an_ini_policy_that_ignores_it_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\nopcheck_policy = full\n")
    result = pytester.runpytest("--opcheck-budget", "1000")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --opcheck-budget sets the budget of the auto policy; "
            "it has no effect with 'full' (ini opcheck_policy*"
        ]
    )


def test_the_opcheck_table_alone_selects_and_configures(pytester):
    pytester.makepyprojecttoml(
        """
        [tool.opcheck]
        device = "cpu"
        dtype = ["float64", "float32"]
        policy = "auto"
        budget = 1024
        threads = 2
        """
    )
    pytester.makepyfile(test_sin=SIN_MODULE)
    assert selected(pytester) == {
        "test_sin.py::test_gradcheck[cpu-float64-vec]",
        "test_sin.py::test_lowprec[cpu-float32-vec]",
    }
    assert header(pytester) == (
        "opcheck: policy auto; auto budget 1024 Jacobian entries ([tool.opcheck] budget); devices cpu; "
        "dtypes float64,float32; 2 torch thread(s)"
    )
    assert header(pytester, "--opcheck-device", "all", "--opcheck-threads", "keep").startswith(
        "opcheck: policy auto; auto budget 1024 Jacobian entries ([tool.opcheck] budget); devices all;"
    )


def test_a_setting_in_both_the_ini_and_the_opcheck_table_is_a_usage_error(pytester):
    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        opcheck_policy = "fast"

        [tool.opcheck]
        policy = "full"
        """
    )
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "ERROR: pyproject.toml:5: [tool.opcheck] policy and ini opcheck_policy "
        f"({pytester.path / 'pyproject.toml'}) both set the policy; keep one of them"
    ) in result.stderr.lines


@pytest.mark.parametrize(
    "line, message",
    [
        ("device = 'cdua'", "unknown device 'cdua' (did you mean 'cuda'?); expected one of cpu"),
        ("threads = 'many'", "expected a positive number of threads or 'keep', got 'many'"),
        ("polcy = 'fast'", "unknown key 'polcy' (did you mean 'policy'?); expected one of specs, out, results"),
        ("results = 'adir'", "{root}/adir is a directory; expected a file path such as {root}/adir/"),
    ],
)
def test_bad_opcheck_table_values_are_usage_errors_naming_the_line(pytester, line, message):
    pytester.mkdir("adir")
    pytester.makepyprojecttoml(f"[tool.opcheck]\n{line}\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    key = line.split()[0]
    where = "pyproject.toml:2: [tool.opcheck]" + (f" {key}" if key != "polcy" else "")
    assert result.stderr.str().startswith(f"ERROR: {where}: {message.format(root=pytester.path)}")
    assert "Traceback" not in result.stderr.str()


def test_results_from_the_opcheck_table_land_beside_it_and_opcheck_report_reads_them(pytester, monkeypatch, capsys):
    from opcheck import cli

    pytester.makepyprojecttoml('[tool.opcheck]\nresults = "build/opcheck/results.json"\n')
    pytester.makepyfile(test_sin=SIN_MODULE.replace("run_check(SPEC,", "(SPEC,"))
    elsewhere = pytester.mkdir("elsewhere")
    monkeypatch.chdir(elsewhere)
    result = pytester.runpytest("--rootdir", str(pytester.path), str(pytester.path))
    result.assert_outcomes(passed=3)
    written = pytester.path / "build" / "opcheck" / "results.json"
    assert written.is_file() and not (elsewhere / "build").exists()
    result.stdout.fnmatch_lines([f"*opcheck results of 5 generated tests: {written}*"])
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    assert cli.main(["report"]) == 0  # from elsewhere/: the table is found above it
    report = capsys.readouterr().out
    assert "results.json: 5 tests of 1 op" in report
