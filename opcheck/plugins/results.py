"""`--opcheck-results PATH`: one JSON record per generated test, for `opcheck report`
(opcheck.report.collect): the recorder is registered in the controller, and an xdist worker says
which tests it collected and attaches each test's case to its reports."""

from __future__ import annotations

import pytest

from opcheck.plugins.items import case_fields, is_generated_item
from opcheck.plugins.selection import unavailable_tests
from opcheck.plugins.settings import RESULTS_KEY, results_where

RESULTS_PLUGIN = "opcheck-results"


def pytest_configure(config: pytest.Config) -> None:
    _configure_results(config)


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
            f"{results_where(config)}: {path} is a directory; expected a file path such as "
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if item.config.stash.get(RESULTS_KEY, None) is not None:
        # An attribute of the report travels from an xdist worker to the controller with it.
        from opcheck.report.collect import CASE_ATTR

        setattr(report, CASE_ATTR, case_fields(item))
    return report
