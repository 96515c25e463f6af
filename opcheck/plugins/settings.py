"""The options, ini settings and `[tool.opcheck]` keys of the generated tests' run, read once
into the config's stash (the run's Settings, the device and dtype selection, the results path, the
time budget), the markers of the check kinds, and the report header that states them."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from opcheck import config as project_config
from opcheck import plugin_margins
from opcheck.config import ISOLATION_MODES, POLICIES, ConfigError, ProjectConfig
from opcheck.spec.model import Check

if TYPE_CHECKING:
    from opcheck.runtime.budget import TimeBudget
    from opcheck.runtime.context import Settings


MARKERS = {check.value: check.description for check in Check}
"""Marker name → description, one per check kind (a generated test function carries its kind's)."""

DEFAULT_THREADS = str(project_config.DEFAULT_THREADS)
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
SELECTION_KEY: pytest.StashKey[tuple[tuple[str, ...], tuple[str, ...]]] = pytest.StashKey()
RESULTS_KEY: pytest.StashKey[Path | None] = pytest.StashKey()
PROJECT_KEY: pytest.StashKey[ProjectConfig] = pytest.StashKey()
TIME_BUDGET_KEY: pytest.StashKey[TimeBudget | None] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opcheck", "opcheck generated gradient tests")
    group.addoption(
        "--opcheck-device",
        action="append",
        default=[],
        metavar="DEVICE[,DEVICE]",
        help="run generated tests only on these device types (repeatable or comma-separated: "
        "cpu, cuda, mps, xpu, ...); the others are deselected. Default: the device types "
        "this machine has; 'all' collects every device and skips the unavailable ones. Ini: opcheck_device "
        "or [tool.opcheck] device",
    )
    group.addoption(
        "--opcheck-dtype",
        action="append",
        default=[],
        metavar="DTYPE[,DTYPE]",
        help="run generated tests only for these dtypes (repeatable or comma-separated: float64, "
        "complex128, float32, bfloat16, ...); the others are deselected; `all` for every dtype. Ini: "
        "opcheck_dtype or [tool.opcheck] dtype",
    )
    group.addoption(
        "--opcheck-policy",
        choices=POLICIES,
        default=None,
        help="override every spec's gradcheck.fast_mode: auto (full Jacobian up to 128 input and "
        "output elements, entrywise projection checks beyond, the full Jacobian deciding a "
        "failure within the budget), full (always the full Jacobian), fast (torch's fast mode: "
        "one random projection per input/output pair). Ini: opcheck_policy or [tool.opcheck] policy",
    )
    group.addoption(
        "--opcheck-budget",
        default=None,
        metavar="ENTRIES",
        help="Jacobian entries (sum of numel_in * numel_out) up to which the auto policy lets the "
        "full Jacobian decide a check its entrywise projections do not pass, and beyond which "
        "the projections decide, e.g. 1048576, 2**20, 4M (default: OPCHECK_JACOBIAN_BUDGET, else "
        "ini opcheck_budget or [tool.opcheck] budget, else 2**20)",
    )
    group.addoption(
        "--opcheck-plot",
        default=None,
        metavar="DIR",
        help="write a PNG heatmap of |analytical - numerical| for every failing Jacobian block into "
        "DIR (needs matplotlib: pip install 'opcheck[plot]')",
    )
    group.addoption(
        "--opcheck-results",
        default=None,
        metavar="PATH",
        help="record the outcome of every generated test (spec, op, check, device, dtype, sample, "
        "outcome, reason, duration; a failure's worst entry, hints and message) in PATH as JSON, for "
        "`opcheck report`; the tests a run ran replace their records, the others keep theirs. Ini: opcheck_results "
        "(relative to the ini file's folder) or [tool.opcheck] results (relative to pyproject.toml's folder)",
    )
    plugin_margins.add_option(group)
    threads_help = (
        "torch intra-op threads while a generated test runs: a positive number, or 'keep' for "
        "torch's own setting (OMP_NUM_THREADS, torch.set_num_threads)"
    )
    group.addoption(
        "--opcheck-threads",
        default=None,
        metavar="N|keep",
        help=f"{threads_help} (default: ini opcheck_threads or [tool.opcheck] threads, else {DEFAULT_THREADS})",
    )
    parser.addini("opcheck_threads", f"opcheck: {threads_help} (default {DEFAULT_THREADS})", default="")
    time_budget_help = (
        "seconds a generated test may run (e.g. 600, 90s, 10m), or 'off'; a test that runs longer is "
        "stopped and fails, saying where the time went"
    )
    group.addoption(
        "--opcheck-time-budget",
        default=None,
        metavar="SECONDS",
        help=f"{time_budget_help} (default: ini opcheck_time_budget or [tool.opcheck] time_budget, else "
        f"{project_config.DEFAULT_TIME_BUDGET:g})",
    )
    parser.addini("opcheck_time_budget", f"opcheck: {time_budget_help}", default="")
    isolation_help = (
        "process: a serial run of generated tests runs in a child process, and a test that crashes it "
        "(a signal, an abort, a CUDA error, a hang) fails alone while the rest go on in a new one; off: "
        "the tests run in pytest's own process"
    )
    group.addoption(
        "--opcheck-isolation",
        choices=ISOLATION_MODES,
        default=None,
        help=f"{isolation_help} (default: ini opcheck_isolation or [tool.opcheck] isolation, else "
        f"{project_config.DEFAULT_ISOLATION})",
    )
    parser.addini("opcheck_isolation", f"opcheck: {isolation_help}", default="")
    parser.addini(
        "opcheck_device",
        "opcheck: default for --opcheck-device (a list, or names separated by spaces or commas)",
        type="args",
        default=[],
    )
    parser.addini(
        "opcheck_dtype",
        "opcheck: default for --opcheck-dtype (a list, or names separated by spaces or commas)",
        type="args",
        default=[],
    )
    parser.addini("opcheck_policy", f"opcheck: default for --opcheck-policy ({'|'.join(POLICIES)})", default="")
    parser.addini(
        "opcheck_budget", "opcheck: default for --opcheck-budget (OPCHECK_JACOBIAN_BUDGET overrides it)", default=""
    )
    parser.addini(
        "opcheck_results", "opcheck: default for --opcheck-results (relative to the ini file's folder)", default=""
    )


def marker_lines() -> list[str]:
    """The `markers` ini lines (`name: description`) the plugin registers, as pyproject.toml lists them."""
    return [f"{name}: {description}" for name, description in MARKERS.items()]


def _usage(error: ConfigError) -> pytest.UsageError:
    return pytest.UsageError(str(error))


def _ini_where(config: pytest.Config, name: str) -> str:
    """How an error names an ini setting: `ini opcheck_policy (/project/pyproject.toml)`."""
    return f"ini {name} ({config.inipath or 'no ini file'})"


def project(config: pytest.Config) -> ProjectConfig:
    """The `[tool.opcheck]` table in effect for this run: the nearest at or above pytest's rootdir."""
    found = config.stash.get(PROJECT_KEY, None)
    if found is None:
        try:
            found = project_config.load(config.rootpath)
        except ConfigError as e:
            raise _usage(e) from None
        config.stash[PROJECT_KEY] = found
    return found


def _from_project(config: pytest.Config, name: str, ini_set: bool) -> project_config.Setting | None:
    """The `[tool.opcheck]` key for ini `opcheck_NAME`; setting both is an error (which one would win?)."""
    setting = project(config).get(name)
    if setting is not None and ini_set:
        raise pytest.UsageError(
            f"{setting.where} and {_ini_where(config, f'opcheck_{name}')} both set the {name}; keep one of them"
        )
    return setting


def _option(config: pytest.Config, name: str, *, early: bool = False) -> tuple[str | None, str]:
    """The value of `--opcheck-NAME`, else of ini `opcheck_NAME`, else of `[tool.opcheck] NAME` (None when
    none is set), and where it came from. `early`: also before pytest has parsed the whole command
    line, from what it parsed before loading conftest files (config.known_args_namespace: opcheck's
    own options, where its plugin was loaded as an entry point or with -p)."""
    dest = f"opcheck_{name}"
    raw = getattr(config.known_args_namespace, dest, None) if early else None
    if raw is None:
        raw = config.getoption(dest, None)
    if raw is not None:
        return raw, f"--opcheck-{name.replace('_', '-')}"
    ini = str(config.getini(f"opcheck_{name}")).strip()
    setting = _from_project(config, name, bool(ini))
    if setting is not None:
        return setting.text, setting.where
    return (ini or None), _ini_where(config, f"opcheck_{name}")


def _listed(config: pytest.Config, name: str) -> tuple[list[str], str]:
    """The names `--opcheck-NAME` gives, else those of ini `opcheck_NAME`, else of `[tool.opcheck] NAME`,
    and where they came from."""
    given = project_config.split_names(config.getoption(f"opcheck_{name}"))
    if given:
        return given, f"--opcheck-{name}"
    ini = project_config.split_names(config.getini(f"opcheck_{name}"))
    setting = _from_project(config, name, bool(ini))
    if setting is not None:
        return setting.names, setting.where
    return ini, _ini_where(config, f"opcheck_{name}")


def _devices(config: pytest.Config) -> list[str]:
    try:
        return project_config.check_devices(*_listed(config, "device"))
    except ConfigError as e:
        raise _usage(e) from None


def _dtypes(config: pytest.Config) -> list[str]:
    try:
        return project_config.check_dtypes(*_listed(config, "dtype"))
    except ConfigError as e:
        raise _usage(e) from None


def _policy(config: pytest.Config) -> tuple[str | None, str]:
    policy, where = _option(config, "policy")
    if policy is not None:  # the command line's choices already checked its own
        try:
            project_config.check_policy(policy, where)
        except ConfigError as e:
            raise _usage(e) from None
    return policy, where


def _budget(config: pytest.Config, policy: str | None, policy_where: str) -> tuple[int, str]:
    """The auto policy's budget and its source: the command line, else the environment, else the ini
    or `[tool.opcheck]`."""
    from opcheck.runtime.context import BUDGET_ENV, Settings

    raw, where = config.getoption("opcheck_budget"), "--opcheck-budget"
    if raw is None and os.environ.get(BUDGET_ENV):
        raw, where = os.environ[BUDGET_ENV], BUDGET_ENV
    elif raw is None:
        raw, where = _option(config, "budget")
    from_project = where not in ("--opcheck-budget", BUDGET_ENV)
    if raw is not None and policy in ("full", "fast") and where != BUDGET_ENV:
        policy_on_command_line = policy_where.startswith("--")
        if from_project and policy_on_command_line:  # this run's policy replaces the project's
            raw = None
        else:
            with_policy = f"--opcheck-policy={policy}" if policy_on_command_line else f"{policy!r} ({policy_where})"
            raise pytest.UsageError(
                f"{where} sets the budget of the auto policy; it has no effect with {with_policy} (drop one of them)"
            )
    if raw is None:
        return Settings().budget, "default"
    try:
        budget = project_config.check_budget(raw, where)
    except ConfigError as e:
        raise _usage(e) from None
    if not from_project:
        return budget, where
    return budget, ("ini opcheck_budget" if where.startswith("ini ") else f"{project_config.TABLE} budget")


def _plot_dir(config: pytest.Config) -> str | None:
    plot_dir = config.getoption("opcheck_plot")
    if plot_dir is None:
        return None
    if importlib.util.find_spec("matplotlib") is None:
        raise pytest.UsageError("--opcheck-plot needs matplotlib, which is not installed (pip install 'opcheck[plot]')")
    plot_dir = str(config.invocation_params.dir / plot_dir)
    if os.path.exists(plot_dir) and not os.path.isdir(plot_dir):
        raise pytest.UsageError(f"--opcheck-plot: {plot_dir} exists and is not a directory")
    return plot_dir


def _settings(config: pytest.Config):
    from opcheck.runtime.context import Settings

    devices, dtypes = _devices(config), _dtypes(config)
    policy, policy_where = _policy(config)
    budget, source = _budget(config, policy, policy_where)
    settings = Settings(
        policy=policy, budget=budget, budget_source=source, plot_dir=_plot_dir(config), threads=_threads(config)
    )
    return settings, (tuple(devices), tuple(dtypes))


def _threads(config: pytest.Config) -> int | None:
    """The intra-op thread count for generated tests, or None to keep torch's."""
    raw, where = _option(config, "threads")
    try:
        return project_config.check_threads(DEFAULT_THREADS if raw is None else raw, where)
    except ConfigError as e:
        raise _usage(e) from None


def _time_budget(config: pytest.Config) -> TimeBudget | None:
    """The time budget of each generated test (None: none), and where it was set."""
    from opcheck.runtime.budget import TimeBudget

    if config.getoption("trace", False):  # a person steps through the test at a debugger
        return None
    raw, where = _option(config, "time_budget")
    if raw is None:
        return TimeBudget(project_config.DEFAULT_TIME_BUDGET, "default")
    try:
        seconds = project_config.check_time_budget(raw, where)
    except ConfigError as e:
        raise _usage(e) from None
    if seconds is None:
        return None
    return TimeBudget(seconds, where.split(": ")[-1] if ": " in where else where)


def isolation_mode(config: pytest.Config) -> str:
    """`--opcheck-isolation`, ini `opcheck_isolation` or `[tool.opcheck] isolation`; answered alike
    before conftest files are loaded (opcheck.plugins.isolation.supervises asks then)."""
    raw, where = _option(config, "isolation", early=True)
    if raw is None:
        return project_config.DEFAULT_ISOLATION
    try:
        return project_config.check_isolation(raw, where)
    except ConfigError as e:
        raise _usage(e) from None


def results_path(config: pytest.Config) -> Path | None:
    """Where to write the results, or None: `--opcheck-results` (relative to the invocation folder),
    else ini `opcheck_results` (relative to the ini file's folder), else `[tool.opcheck] results`
    (relative to its pyproject.toml's folder)."""
    raw = config.getoption("opcheck_results")
    if raw is not None:
        return config.invocation_params.dir / raw
    ini = str(config.getini("opcheck_results")).strip()
    if _from_project(config, "results", bool(ini)) is not None:
        return project(config).path("results")
    if not ini:
        return None
    return (config.inipath.parent if config.inipath else config.rootpath) / ini


def results_where(config: pytest.Config) -> str:
    if config.getoption("opcheck_results") is not None:
        return "--opcheck-results"
    setting = project(config).get("results")
    return setting.where if setting is not None else _ini_where(config, "opcheck_results")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The markers, and the run's settings in the config's stash, before the other plugins configure."""
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    settings, selection = _settings(config)
    config.stash[SETTINGS_KEY] = settings
    config.stash[SELECTION_KEY] = selection
    config.stash[RESULTS_KEY] = results_path(config)
    config.stash[TIME_BUDGET_KEY] = _time_budget(config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return []
    devices, dtypes = config.stash[SELECTION_KEY]
    policy = f"policy {settings.policy}" if settings.policy else "fast_mode per spec"
    parts = [policy]
    if settings.policy in (None, "auto"):
        parts.append(f"auto budget {settings.budget} Jacobian entries ({settings.budget_source})")
    parts.append(f"devices {','.join(devices)}" if devices else "available devices")
    parts.append(f"dtypes {','.join(dtypes)}" if dtypes else "all dtypes")
    parts.append(f"{settings.threads} torch thread(s)" if settings.threads else "torch's own thread setting")
    time_budget = config.stash.get(TIME_BUDGET_KEY, None)
    if time_budget is None:
        parts.append("no time budget")
    elif time_budget.source != "default":
        parts.append(f"time budget {time_budget.describe()}")
    if settings.plot_dir:
        parts.append(f"heatmaps in {settings.plot_dir}")
    from opcheck.runtime.devices import faked_unavailable

    if faked_unavailable():
        parts.append(f"treated as unavailable: {','.join(sorted(faked_unavailable()))}")
    return ["opcheck: " + "; ".join(parts)]
