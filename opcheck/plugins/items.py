"""What the plugins know of a collected test: whether it is generated, its case, the command that
reruns it, and the spec file its module names (helpers, not a plugin)."""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import TypeGuard

import pytest

from opcheck.spec.case import CaseId, spec_of_module
from opcheck.spec.model import CHECKS, OpSpec


def is_generated_item(item: pytest.Item) -> TypeGuard[pytest.Function]:
    """A test of a generated module: parametrized over device/dtype/sample, with a SPEC or a check marker."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or not {"device", "dtype", "sample"} <= set(callspec.params):
        return False
    module = getattr(item, "module", None)
    if isinstance(getattr(module, "SPEC", None), OpSpec):
        return True
    return any(item.get_closest_marker(name) is not None for name in CHECKS)


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


def spec_path(source: str, module: Path, root: Path) -> Path | None:
    """The header's source, relative to the rootdir or, failing that, to a folder above the module."""
    for folder in (root, *module.parents):
        if (folder / source).is_file():
            return folder / source
    return None
