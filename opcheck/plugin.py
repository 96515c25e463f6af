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
- `--opcheck-results PATH` writes one JSON record per generated test (its spec, op, check, device,
  dtype, sample, outcome, reason and duration) at the end of the session, for `opcheck report`;
  under pytest-xdist the workers attach each test's case to its reports and the controller writes;
- around each test call, tells the runtime the item's node id, so that failures print the exact
  command that reruns them, and reports the runtime's own skip (opcheck.runtime.outcomes.CheckSkipped)
  as pytest's skip, with its reason and at the line that raised it.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import pytest

from opcheck.spec.case import CaseId, spec_of_module
from opcheck.spec.model import CHECKS, TENSOR_DTYPES, Check, OpSpec

if TYPE_CHECKING:
    from opcheck.runtime.context import Settings
    from opcheck.runtime.outcomes import CheckSkipped

MARKERS = {check.value: check.description for check in Check}
"""Marker name → description, one per check kind (a generated test function carries its kind's)."""

POLICIES = ("auto", "full", "fast")
ALL_DEVICES = "all"
DEFAULT_THREADS = "1"
THREADS_KEEP = "keep"
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
SELECTION_KEY: pytest.StashKey[tuple[tuple[str, ...], tuple[str, ...]]] = pytest.StashKey()
UNAVAILABLE_KEY: pytest.StashKey[list[dict]] = pytest.StashKey()
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
        "this machine has; 'all' collects every device and skips the unavailable ones",
    )
    group.addoption(
        "--opcheck-dtype",
        action="append",
        default=[],
        metavar="DTYPE[,DTYPE]",
        help="run generated tests only for these dtypes (repeatable or comma-separated: float64, "
        "complex128, float32, bfloat16, ...); the others are deselected",
    )
    group.addoption(
        "--opcheck-policy",
        choices=POLICIES,
        default=None,
        help="override every spec's gradcheck.fast_mode: auto (full Jacobian up to 128 input and "
        "output elements, entrywise projection checks beyond, the full Jacobian deciding a "
        "failure within the budget), full (always the full Jacobian), fast (torch's fast mode: "
        "one random projection per input/output pair)",
    )
    group.addoption(
        "--opcheck-budget",
        default=None,
        metavar="ENTRIES",
        help="Jacobian entries (sum of numel_in * numel_out) up to which the auto policy lets the "
        "full Jacobian decide a check its entrywise projections do not pass, and beyond which "
        "the projections decide, e.g. 1048576, 2**20, 4M (default: OPCHECK_JACOBIAN_BUDGET or "
        "2**20)",
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
        help="write the outcome of every generated test (spec, op, check, device, dtype, sample, "
        "outcome, reason, duration) to PATH as JSON, for `opcheck report PATH`",
    )
    threads_help = (
        "torch intra-op threads while a generated test runs: a positive number, or 'keep' for "
        "torch's own setting (OMP_NUM_THREADS, torch.set_num_threads)"
    )
    group.addoption(
        "--opcheck-threads",
        default=None,
        metavar="N|keep",
        help=f"{threads_help} (default: ini opcheck_threads, else {DEFAULT_THREADS})",
    )
    parser.addini("opcheck_threads", f"opcheck: {threads_help}", default=DEFAULT_THREADS)


def marker_lines() -> list[str]:
    """The `markers` ini lines (`name: description`) the plugin registers, as pyproject.toml lists them."""
    return [f"{name}: {description}" for name, description in MARKERS.items()]


def _split(values: list[str]) -> list[str]:
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def _unknown(kind: str, value: str, known) -> pytest.UsageError:
    close = difflib.get_close_matches(value, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return pytest.UsageError(f"--opcheck-{kind}: unknown {kind} {value!r}{hint}; expected one of {', '.join(known)}")


def _settings(config: pytest.Config):
    from opcheck.runtime.context import BUDGET_ENV, Settings, parse_budget
    from opcheck.runtime.devices import known_device_types

    devices = _split(config.getoption("opcheck_device"))
    known = known_device_types()
    for d in devices:
        if d not in known and d != ALL_DEVICES:
            raise _unknown("device", d, (*known, ALL_DEVICES))
    if ALL_DEVICES in devices:
        if len(devices) > 1:
            raise pytest.UsageError(
                f"--opcheck-device: {ALL_DEVICES!r} already means every device type; "
                f"drop {', '.join(d for d in devices if d != ALL_DEVICES)} or {ALL_DEVICES!r}"
            )
        devices = [ALL_DEVICES]
    dtypes = _split(config.getoption("opcheck_dtype"))
    for d in dtypes:
        if d not in TENSOR_DTYPES:
            raise _unknown("dtype", d, TENSOR_DTYPES)
    policy = config.getoption("opcheck_policy")
    raw_budget = config.getoption("opcheck_budget")
    if raw_budget is not None and policy in ("full", "fast"):
        raise pytest.UsageError(
            f"--opcheck-budget sets the budget of the auto policy; it has no effect with "
            f"--opcheck-policy={policy} (drop one of them)"
        )
    try:
        if raw_budget is not None:
            budget, source = parse_budget(raw_budget, where="--opcheck-budget"), "--opcheck-budget"
        elif os.environ.get(BUDGET_ENV):
            budget, source = parse_budget(os.environ[BUDGET_ENV], where=BUDGET_ENV), BUDGET_ENV
        else:
            budget, source = Settings().budget, "default"
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    plot_dir = config.getoption("opcheck_plot")
    if plot_dir is not None:
        if importlib.util.find_spec("matplotlib") is None:
            raise pytest.UsageError(
                "--opcheck-plot needs matplotlib, which is not installed (pip install 'opcheck[plot]')"
            )
        plot_dir = str(config.invocation_params.dir / plot_dir)
        if os.path.exists(plot_dir) and not os.path.isdir(plot_dir):
            raise pytest.UsageError(f"--opcheck-plot: {plot_dir} exists and is not a directory")
    settings = Settings(policy=policy, budget=budget, budget_source=source, plot_dir=plot_dir, threads=_threads(config))
    return settings, (tuple(devices), tuple(dtypes))


def _threads(config: pytest.Config) -> int | None:
    """The intra-op thread count for generated tests, or None to keep torch's."""
    raw, where = config.getoption("opcheck_threads"), "--opcheck-threads"
    if raw is None:
        raw, where = config.getini("opcheck_threads"), f"ini opcheck_threads ({config.inipath or 'no ini file'})"
    text = str(raw).strip().lower()
    if text == THREADS_KEEP:
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise pytest.UsageError(f"{where}: expected a positive number of threads or {THREADS_KEEP!r}, got {raw!r}")


def pytest_configure(config: pytest.Config) -> None:
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    settings, selection = _settings(config)
    config.stash[SETTINGS_KEY] = settings
    config.stash[SELECTION_KEY] = selection
    _configure_results(config)


def _configure_results(config: pytest.Config) -> None:
    path = config.getoption("opcheck_results")
    if path is None or hasattr(config, "workerinput"):  # an xdist worker: the controller writes
        return
    path = config.invocation_params.dir / path
    if path.is_dir():
        raise pytest.UsageError(
            f"--opcheck-results: {path} is a directory; expected a file path such as {path / 'opcheck-results.json'}"
        )
    from opcheck.report.collect import ResultsRecorder

    config.pluginmanager.register(ResultsRecorder(path, lambda: unavailable_tests(config)), RESULTS_PLUGIN)


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
    if item.config.getoption("opcheck_results", None) is not None:
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
    target = f"{path}::{name}"
    return f"pytest '{target}'" if "'" not in target else f"pytest {shlex.quote(target)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
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
    threads = settings.threads if is_generated_item(item) else None
    with _torch_threads(threads):
        try:
            return (yield)
        except CheckSkipped as e:
            raise as_pytest_skip(e) from None
        finally:
            current_item.reset(token)


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
