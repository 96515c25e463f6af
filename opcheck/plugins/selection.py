"""Which generated tests a run collects: the devices and dtypes selected (`--opcheck-device`,
`--opcheck-dtype`), and the tests of devices this machine lacks, deselected with one summary line
(`--opcheck-device all` collects them and skips each with torch's reason); under pytest-xdist the
workers hand those to the controller."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opcheck.config import ALL_DEVICES
from opcheck.plugins.items import case_fields, is_generated_item
from opcheck.plugins.settings import SELECTION_KEY
from opcheck.plugins.stale import warn_stale

UNAVAILABLE_KEY: pytest.StashKey[list[dict]] = pytest.StashKey()
UNAVAILABLE_OUTPUT = "opcheck_unavailable"
"""The key under which an xdist worker hands its unavailable tests to the controller."""


@pytest.hookimpl(trylast=True)  # after -m / -k: only what they kept counts as not collected here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    warn_stale(config, items)
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
