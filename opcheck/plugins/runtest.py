"""Around each test call: the runtime learns the item's node id and rerun command, a generated test
runs with the spec's project root importable, torch's intra-op threads set and the time budget
armed, the runtime's own skip (CheckSkipped) becomes pytest's, with its reason, and a failure's
facts (opcheck.failure_facts) go on the test's report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from opcheck.plugins.items import is_generated_item, rerun_command, spec_path
from opcheck.plugins.settings import SETTINGS_KEY, TIME_BUDGET_KEY
from opcheck.runtime.threads import torch_threads

if TYPE_CHECKING:
    from opcheck.runtime.outcomes import CheckSkipped


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
    with torch_threads(threads):
        try:
            return (yield)
        except CheckSkipped as e:
            raise as_pytest_skip(e) from None
        except BaseException as e:
            _keep_facts(item, e)
            raise
        finally:
            current_budget.reset(budget_token)
            current_item.reset(token)


def _keep_facts(item: pytest.Item, error: BaseException) -> None:
    """Put what a failure names as values (opcheck.failure_facts) on the test's report, for the results file."""
    from opcheck.failure_facts import facts_of

    facts = facts_of(error)
    if facts:
        item.user_properties.append(facts.to_property())


def _import_from_project_root(item: pytest.Function) -> None:
    """Put the project root (the folder its spec's path is relative to) on sys.path, as the
    `opcheck` command does: a spec names its ops from there (`myops:rms_norm`), and a bare `pytest`
    puts only the test module's folder on the path (`python -m pytest` adds the current one too).
    The runtime reads the spec's values files from there too (opcheck.runtime.project_root; the
    rootdir where the spec is not found)."""
    from opcheck.runtime.project_root import set_project_root

    spec = getattr(item.module, "SPEC", None)
    source = getattr(spec, "source", None)
    found = spec_path(source, item.path, item.config.rootpath) if isinstance(source, str) else None
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
