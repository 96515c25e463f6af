"""opcheck's pytest plugin (entry point `pytest11: opcheck`).

- registers one marker per check kind (`pytest -m gradgradcheck`, `-m "not lowprec"`), described by
  the check kinds' own table (opcheck.spec.model.Check); pyproject's `markers` list repeats it for
  runs without the plugin, and a test keeps the two equal;
- generated tests for device types this machine does not have are deselected at collection, with
  one summary line; `--opcheck-device all` collects them and skips each with torch's reason, and
  `--opcheck-results` records them as skipped with that reason either way;
- `--opcheck-device cpu,cuda` / `--opcheck-dtype float64` deselect the other devices / dtypes
  of generated tests (reported as deselected); a device named there that is unavailable is skipped;
- `--opcheck-threads N` (ini `opcheck_threads`, default 1) sets torch's intra-op threads around
  each generated test and restores them after: the checks' tensors are small, where one thread
  is fastest and workers of pytest-xdist do not compete for cores;
- `--opcheck-policy auto|full|fast` overrides every spec's `gradcheck.fast_mode`, and
  `--opcheck-budget N` (or OPCHECK_JACOBIAN_BUDGET) sets the auto policy's Jacobian budget;
- `--opcheck-plot DIR` writes a heatmap of every failing Jacobian block (needs matplotlib);
- `--opcheck-time-budget SECONDS` (default 600, `off` for none) stops a generated test that runs
  longer, failing it with where the time went and what to change (opcheck.runtime.budget);
- `--opcheck-isolation process|off`: a serial run that collects generated tests runs its session in
  a child process and goes on in a new one when a test crashes it (a signal, an abort, a CUDA
  error, a hang past the budget), each such test failing with what happened; under pytest-xdist the
  workers are watched the same way (opcheck.isolation);
- under pytest-xdist on a machine with several GPUs, each worker takes one of them
  (opcheck.runtime.gpu_workers: `-n <number of GPUs>` runs one worker per GPU);
- `--opcheck-results PATH` keeps one JSON record per generated test (its spec, op, check, device,
  dtype, sample, outcome, reason and duration; for a failure also its worst entry, hints and whole
  message), for `opcheck report`: at the end of the session the tests that ran replace their
  records and the others are kept (opcheck.report.store); under pytest-xdist the workers attach
  each test's case to its reports, say which tests they collected, and the controller writes;
- `--opcheck-margin FRACTION` lists, at the end, the passing tests whose worst comparison came to
  FRACTION of its bound or closer (opcheck.plugin_margins);
- every option but `--opcheck-plot` and `--opcheck-margin` also has an ini setting
  (`opcheck_device`, `opcheck_dtype`, `opcheck_policy`, `opcheck_budget`, `opcheck_threads`,
  `opcheck_results`, `opcheck_time_budget`, `opcheck_isolation`) for pyproject.toml's
  `[tool.pytest.ini_options]` or pytest.ini, and a key of pyproject.toml's `[tool.opcheck]` table
  (`device`, ..., `results`; opcheck.config), which the `opcheck` command reads too; the command
  line overrides either, setting both is a usage error, and so is a bad value, naming where it
  was written;
- at collection, one warning (StaleModulesWarning) names every collected generated module whose
  spec file now hashes differently from its header's `# spec sha256:` (or is gone), with the
  command that regenerates them; each spec file is read once per session;
- around each test call, tells the runtime the item's node id, so that failures print the exact
  command that reruns them, and reports the runtime's own skip (opcheck.runtime.outcomes.CheckSkipped)
  as pytest's skip, with its reason and at the line that raised it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import sys
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import pytest

from opcheck import config as project_config
from opcheck import plugin_margins
from opcheck.config import ALL_DEVICES, ISOLATION_MODES, POLICIES, ConfigError, ProjectConfig
from opcheck.spec.case import CaseId, spec_of_module
from opcheck.spec.model import CHECKS, Check, OpSpec

# Triton's interpreter is turned on (where there is no GPU) before conftest files define kernels.
from opcheck.triton.pytest_hooks import pytest_load_initial_conftests  # noqa: F401

if TYPE_CHECKING:
    from opcheck.runtime.budget import TimeBudget
    from opcheck.runtime.context import Settings
    from opcheck.runtime.outcomes import CheckSkipped

MARKERS = {check.value: check.description for check in Check}
"""Marker name → description, one per check kind (a generated test function carries its kind's)."""

DEFAULT_THREADS = str(project_config.DEFAULT_THREADS)
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
SELECTION_KEY: pytest.StashKey[tuple[tuple[str, ...], tuple[str, ...]]] = pytest.StashKey()
UNAVAILABLE_KEY: pytest.StashKey[list[dict]] = pytest.StashKey()
RESULTS_KEY: pytest.StashKey[Path | None] = pytest.StashKey()
PROJECT_KEY: pytest.StashKey[ProjectConfig] = pytest.StashKey()
SPEC_HASHES_KEY: pytest.StashKey[dict[Path, str | None]] = pytest.StashKey()
"""Spec file → its sha256 (None: unreadable), so each spec is hashed once per session."""
TIME_BUDGET_KEY: pytest.StashKey[TimeBudget | None] = pytest.StashKey()
UNAVAILABLE_OUTPUT = "opcheck_unavailable"
"""The key under which an xdist worker hands its unavailable tests to the controller."""
RESULTS_PLUGIN = "opcheck-results"


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


def _option(config: pytest.Config, name: str) -> tuple[str | None, str]:
    """The value of `--opcheck-NAME`, else of ini `opcheck_NAME`, else of `[tool.opcheck] NAME` (None when
    none is set), and where it came from."""
    raw = config.getoption(f"opcheck_{name}")
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


def _isolation(config: pytest.Config) -> str:
    raw, where = _option(config, "isolation")
    if raw is None:
        return project_config.DEFAULT_ISOLATION
    try:
        return project_config.check_isolation(raw, where)
    except ConfigError as e:
        raise _usage(e) from None


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """A serial run of generated tests runs its session in a supervised child (opcheck.isolation)."""
    from opcheck import isolation

    if not isolation.wanted(config) or _isolation(config) == "off":
        return None
    return isolation.supervise(config)


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


def _results_where(config: pytest.Config) -> str:
    if config.getoption("opcheck_results") is not None:
        return "--opcheck-results"
    setting = project(config).get("results")
    return setting.where if setting is not None else _ini_where(config, "opcheck_results")


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")
def pytest_configure_gpu_worker(config: pytest.Config) -> None:
    """Under pytest-xdist on several GPUs, this worker takes its own before any test runs
    (opcheck.runtime.gpu_workers; OPCHECK_PIN_GPUS=0 opts out)."""
    from opcheck.runtime.gpu_workers import pin_xdist_worker

    pin_xdist_worker()


def pytest_configure(config: pytest.Config) -> None:
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    settings, selection = _settings(config)
    config.stash[SETTINGS_KEY] = settings
    config.stash[SELECTION_KEY] = selection
    config.stash[RESULTS_KEY] = results_path(config)
    config.stash[TIME_BUDGET_KEY] = _time_budget(config)
    _configure_results(config)
    plugin_margins.configure(config)
    _configure_isolation(config)


def _configure_isolation(config: pytest.Config) -> None:
    from opcheck import isolation

    def budget_of(item: pytest.Item) -> float | None:
        budget = config.stash.get(TIME_BUDGET_KEY, None)
        return budget.seconds if budget is not None and is_generated_item(item) else None

    isolation.configure(config, isolation.Hooks(budget_of=budget_of, case_of=case_fields, rerun_of=rerun_for))


def _configure_results(config: pytest.Config) -> None:
    path = config.stash[RESULTS_KEY]
    if path is None:
        return
    from opcheck.report.collect import KnownTests, ResultsRecorder

    if hasattr(config, "workerinput"):  # an xdist worker says which tests exist; the controller writes
        config.pluginmanager.register(KnownTests(is_generated_item), RESULTS_PLUGIN)
        return
    if path.is_dir():
        raise pytest.UsageError(
            f"{_results_where(config)}: {path} is a directory; expected a file path such as "
            f"{path / 'opcheck-results.json'}"
        )
    recorder = ResultsRecorder(
        path, lambda: unavailable_tests(config), root=config.rootpath, is_generated=is_generated_item
    )
    config.pluginmanager.register(recorder, RESULTS_PLUGIN)


def pytest_unconfigure(config: pytest.Config) -> None:
    recorder = config.pluginmanager.get_plugin(RESULTS_PLUGIN)
    if recorder is not None:
        config.pluginmanager.unregister(recorder)


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


def is_generated_item(item: pytest.Item) -> TypeGuard[pytest.Function]:
    """A test of a generated module: parametrized over device/dtype/sample, with a SPEC or a check marker."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or not {"device", "dtype", "sample"} <= set(callspec.params):
        return False
    module = getattr(item, "module", None)
    if isinstance(getattr(module, "SPEC", None), OpSpec):
        return True
    return any(item.get_closest_marker(name) is not None for name in CHECKS)


@pytest.hookimpl(trylast=True)  # after -m / -k: only what they kept counts as not collected here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _warn_stale(config, items)
    devices, dtypes = config.stash.get(SELECTION_KEY, ((), ()))
    listed = devices and ALL_DEVICES not in devices
    kept, deselected, unavailable = [], [], []
    reasons: dict[str, str | None] = {}
    named = _named_tests(config)
    for item in items:
        if is_generated_item(item):
            params = item.callspec.params
            device = str(params["device"])
            if (listed and device not in devices) or (dtypes and params["dtype"] not in dtypes):
                deselected.append(item)
                continue
            if not devices and item.nodeid not in named:  # the devices this machine lacks are left out
                if device not in reasons:
                    from opcheck.runtime.devices import unavailable_reason

                    reasons[device] = unavailable_reason(device)
                if reasons[device] is not None:
                    unavailable.append(dict(case_fields(item), nodeid=item.nodeid, reason=reasons[device]))
                    deselected.append(item)
                    continue
        kept.append(item)
    config.stash[UNAVAILABLE_KEY] = unavailable
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


class StaleModulesWarning(UserWarning):
    """Generated modules whose spec changed (or is gone) since they were generated."""


@dataclass(frozen=True)
class StaleModule:
    module: str  # as pytest names it: relative to the rootdir
    source: str  # the spec file the header names
    missing: bool  # the spec file is gone, rather than changed
    regenerate: str


def _spec_path(source: str, module: Path, root: Path) -> Path | None:
    """The header's source, relative to the rootdir or, failing that, to a folder above the module."""
    for folder in (root, *module.parents):
        if (folder / source).is_file():
            return folder / source
    return None


def stale_modules(config: pytest.Config, modules: Iterable[Path]) -> list[StaleModule]:
    """The generated modules among `modules` whose header's spec sha256 no longer matches its spec file.

    A module without the generated header, or whose header records no hash, is not judged; none
    is without the suite's packages (the engine alone), where a generated module cannot run at all.
    """
    modules = sorted(set(modules))
    if not modules:  # a run of other tests pays for none of the imports below
        return []
    from opcheck import _suite

    if _suite.missing():
        return []
    from opcheck import module_header
    from opcheck.spec.loader import spec_sha256

    hashes = config.stash.setdefault(SPEC_HASHES_KEY, {})
    stale = []
    for module in modules:
        header = module_header.read(module)
        if header is None or header.source is None or header.sha256 is None:
            continue
        source = header.source
        spec = _spec_path(source, module, config.rootpath)
        if spec is not None and spec not in hashes:
            try:
                hashes[spec] = spec_sha256(spec.read_bytes())
            except OSError:
                hashes[spec] = None
        current = hashes.get(spec) if spec is not None else None
        if current == header.sha256:
            continue
        stale.append(
            StaleModule(
                module=_relative(module, config.rootpath),
                source=source,
                missing=current is None,
                regenerate=header.regenerate,
            )
        )
    return stale


def stale_message(stale: list[StaleModule]) -> str:
    """One message naming every stale module, what changed, and the command(s) that regenerate them."""
    commands = " or ".join(f"`{c}`" for c in dict.fromkeys(m.regenerate for m in stale))
    count = f"{len(stale)} generated module{'s' if len(stale) != 1 else ''}"
    lines = [f"opcheck: {count} out of date with {'their specs' if len(stale) != 1 else 'its spec'}; run {commands}:"]
    for m in stale:
        why = "does not exist" if m.missing else "changed since the module was generated"
        lines.append(f"  {m.module}: {m.source} {why}")
    return "\n".join(lines)


def _warn_stale(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get("workerid") != "gw0":  # xdist: every worker collects the same
        return
    stale = stale_modules(config, (item.path for item in items if is_generated_item(item)))
    if not stale:
        return
    message = stale_message(stale)
    try:
        warnings.warn_explicit(
            StaleModulesWarning(message), StaleModulesWarning, filename=str(config.rootpath / stale[0].module), lineno=1
        )
    except StaleModulesWarning:  # `-W error` or `filterwarnings = error`: end the run with the message alone
        raise pytest.UsageError(message) from None


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(os.path.relpath(path, root)).as_posix()
    except ValueError:  # another drive on Windows
        return str(path)


def _named_tests(config: pytest.Config) -> set[str]:
    """Node ids given whole on the command line (a failure's rerun command): those run or skip."""
    named = set()
    for arg in config.args:
        if "[" not in arg or "::" not in arg:
            continue
        path, rest = arg.split("::", 1)
        try:
            path = os.path.relpath(config.invocation_params.dir / path, config.rootpath)
        except ValueError:  # another drive on Windows
            continue
        named.add(f"{Path(path).as_posix()}::{rest}")
    return named


def unavailable_tests(config: pytest.Config) -> list[dict]:
    """The generated tests left out because their device is unavailable: case fields, nodeid, reason."""
    return config.stash.get(UNAVAILABLE_KEY, [])


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: every worker collects the same items
        workeroutput[UNAVAILABLE_OUTPUT] = unavailable_tests(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, in the controller: take the unavailable tests from the first worker that has any."""
    config = node.config
    if not config.stash.get(UNAVAILABLE_KEY, None):
        config.stash[UNAVAILABLE_KEY] = list(getattr(node, "workeroutput", {}).get(UNAVAILABLE_OUTPUT, []))


def unavailable_summary(tests: list[dict]) -> str | None:
    """`opcheck: cuda, mps unavailable: 6,564 tests not collected (...)`, or None when there are none."""
    if not tests:
        return None
    devices = ", ".join(sorted({t["device"] for t in tests}))
    return (
        f"opcheck: {devices} unavailable: {len(tests):,} test{'s' if len(tests) != 1 else ''} not collected "
        f"(--opcheck-device {ALL_DEVICES} to list them as skipped)"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    line = unavailable_summary(unavailable_tests(config))
    if line:
        terminalreporter.write_line(line)


def case_fields(item: pytest.Item) -> dict:
    """What `--opcheck-results` records about a generated test's case; {} for any other test."""
    return _generated_case_fields(item) if is_generated_item(item) else {}


def _generated_case_fields(item: pytest.Function) -> dict:
    params = item.callspec.params
    spec = getattr(item.module, "SPEC", None)
    check = getattr(item, "originalname", item.name).removeprefix("test_")
    if check not in CHECKS:
        check = next((name for name in CHECKS if item.get_closest_marker(name) is not None), check)
    if isinstance(spec, OpSpec):
        name, op, source = spec.name, spec.op, spec.source
    else:
        name, op, source = spec_of_module(str(item.path)), "", ""
    case = CaseId(name, check, str(params["device"]), str(params["dtype"]), str(params["sample"]))
    return dict(asdict(case), op=op, source=source)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if item.config.stash.get(RESULTS_KEY, None) is not None:
        # An attribute of the report travels from an xdist worker to the controller with it.
        from opcheck.report.collect import CASE_ATTR

        setattr(report, CASE_ATTR, case_fields(item))
    return report


def rerun_command(item: pytest.Item) -> str:
    """`pytest '<path from the invocation dir>::<test name>[<id>]'`: reruns exactly this item."""
    try:
        path = os.path.relpath(item.path, item.config.invocation_params.dir)
    except ValueError:  # another drive on Windows
        path = str(item.path)
    name = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
    return _pytest_command(f"{path}::{name}")


def rerun_for(config: pytest.Config, nodeid: str) -> str:
    """rerun_command for a test known by its node id (in the xdist controller, which has no items)."""
    module, sep, name = nodeid.partition("::")
    try:
        path = os.path.relpath(config.rootpath / module, config.invocation_params.dir)
    except ValueError:  # another drive on Windows
        path = str(config.rootpath / module)
    return _pytest_command(f"{path}{sep}{name}")


def _pytest_command(target: str) -> str:
    return f"pytest '{target}'" if "'" not in target else f"pytest {shlex.quote(target)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    from opcheck.runtime.budget import current_budget
    from opcheck.runtime.context import ItemContext, Settings, current_item
    from opcheck.runtime.outcomes import CheckSkipped

    settings = item.config.stash.get(SETTINGS_KEY, None) or Settings.from_env()
    ctx = ItemContext(
        nodeid=item.nodeid,
        rerun=rerun_command(item),
        settings=settings,
        user_properties=item.user_properties,
        add_report_section=item.add_report_section,
    )
    token = current_item.set(ctx)
    generated = False
    if is_generated_item(item):
        generated = True
        _import_from_project_root(item)
    threads = settings.threads if generated else None
    budget_token = current_budget.set(item.config.stash.get(TIME_BUDGET_KEY, None) if generated else None)
    with _torch_threads(threads):
        try:
            return (yield)
        except CheckSkipped as e:
            raise as_pytest_skip(e) from None
        finally:
            current_budget.reset(budget_token)
            current_item.reset(token)


def _import_from_project_root(item: pytest.Function) -> None:
    """Put the project root (the folder its spec's path is relative to) on sys.path, as the
    `opcheck` command does: a spec names its ops from there (`myops:rms_norm`), and a bare `pytest`
    puts only the test module's folder on the path (`python -m pytest` adds the current one too).
    The runtime reads the spec's values files from there too (opcheck.runtime.project_root; the
    rootdir where the spec is not found)."""
    from opcheck.runtime.project_root import set_project_root

    spec = getattr(item.module, "SPEC", None)
    source = getattr(spec, "source", None)
    found = _spec_path(source, item.path, item.config.rootpath) if isinstance(source, str) else None
    if not isinstance(source, str) or found is None:
        set_project_root(item.config.rootpath)
        return
    root = found
    for _ in Path(source).parts:
        root = root.parent
    set_project_root(root)
    if str(root) not in sys.path:
        sys.path.append(str(root))


def as_pytest_skip(skipped: CheckSkipped) -> BaseException:
    """pytest's skip for the runtime's CheckSkipped: the same reason, and the same traceback.

    pytest reports a skip at the innermost frame of its traceback that does not hide itself
    (`__tracebackhide__`); the runtime hides its own frames, so `-rs` names the generated test's
    run_check line, or the line of the runtime that decided (opinfo.py, which does not hide its frame).
    """
    return pytest.skip.Exception(skipped.reason).with_traceback(skipped.__traceback__)


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """torch's intra-op thread count set to `threads` for the block (None: left alone), then restored."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    if before != threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
