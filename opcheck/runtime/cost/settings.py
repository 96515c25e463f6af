"""The settings an estimate runs under: those the generated tests will run under, as pytest takes
them (a command's own option where it has one, else OPCHECK_JACOBIAN_BUDGET for the budget, else
`[tool.opcheck]`, else the default).

`opcheck list --cost`, `opcheck generate --cost` and the cost comments `opcheck capture` writes
all read them here, so that one test's estimate is the same plan whichever of them made it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from opcheck import config as project_config
from opcheck.runtime.context import BUDGET_ENV, Settings, parse_budget


def cost_settings(
    project: project_config.ProjectConfig,
    policy: str | None = None,
    budget: str | None = None,
    device: str | None = None,
) -> tuple[Settings, list[str] | None]:
    """(Settings, device types or None for every type) from a command's options (None: not given)
    and the project's table; ConfigError or ValueError names a bad value and where it was written."""
    policy = policy or _configured(project, "policy", lambda s: project_config.check_policy(s.text, s.where))
    # the budget as the plugin takes it: the option, else OPCHECK_JACOBIAN_BUDGET, else the table
    where = "--budget" if budget is not None else BUDGET_ENV if os.environ.get(BUDGET_ENV) else None
    entries = (
        parse_budget(budget if budget is not None else os.environ[BUDGET_ENV], where=where)
        if where is not None
        else _configured(project, "budget", lambda s: project_config.check_budget(s.value, s.where))
    )
    devices = (
        project_config.check_devices(project_config.split_names([device]), "--device")
        if device is not None
        else _configured(project, "device", lambda s: project_config.check_devices(s.names, s.where))
    )
    threads = _configured(project, "threads", lambda s: project_config.check_threads(s.value, s.where), 1)
    if threads is None:  # `keep`: torch's own setting
        import torch

        threads = torch.get_num_threads()
    settings = Settings(policy=policy, threads=threads)
    if entries is not None:
        source = where or "[tool.opcheck] budget"
        settings = Settings(policy=policy, budget=entries, budget_source=source, threads=threads)
    if devices == [project_config.ALL_DEVICES]:
        devices = None  # every device type; an unavailable one's tests are counted as not estimated
    return settings, devices


def _configured(
    project: project_config.ProjectConfig, key: str, check: Callable[[project_config.Setting], Any], default: Any = None
) -> Any:
    """A `[tool.opcheck]` setting, checked (check(setting)), or `default` where it is not set."""
    setting = project.get(key)
    return default if setting is None else check(setting)
