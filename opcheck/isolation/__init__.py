"""Faults stay in their test: a test whose op crashes the process (a signal, an abort), leaves its
CUDA device unusable, or runs past its time budget fails with what happened, and the rest of the
run goes on and is recorded.

- A serial run of generated tests (`python -m pytest generated_tests`) is supervised: the pytest
  process the user started runs the session in a child process, with the same command line, and
  starts another when one dies in a test (opcheck.isolation.supervisor). The next child replays
  what the earlier ones did, so the terminal summary, the exit status and the results file cover
  every test, and the test the process died in fails with the signal, the Python stack and the
  command that reruns it. `--opcheck-isolation off` (or `isolation = "off"`) runs the session in
  the process itself.
- Under pytest-xdist, xdist replaces a worker that dies; the controller words the failure of the
  test it died in the same way (opcheck.isolation.xdist).
- Either way, each test process keeps a progress log and a fault file (opcheck.isolation.watched),
  ends itself after a CUDA error, and is ended from outside when a test runs past its time budget
  (opcheck.runtime.budget) by more than a grace period without returning to Python.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opcheck.isolation.supervisor import SUPERVISED_ENV, supervise, wanted
from opcheck.isolation.watched import Hooks

__all__ = ["SUPERVISED_ENV", "Hooks", "configure", "supervise", "wanted"]

PLUGIN_NAME = "opcheck-isolation"


def configure(config: pytest.Config, hooks: Hooks) -> None:
    """Register the plugin this process needs: a supervised child's, an xdist worker's, or the xdist
    controller's; none for a process that runs its tests unwatched."""
    from opcheck.isolation.watched import WatchedProcess

    plugin: object | None = None
    setting = os.environ.pop(SUPERVISED_ENV, None)  # not for the pytest runs its tests start
    workerinput = getattr(config, "workerinput", None)
    if setting is not None:
        from opcheck.isolation.rundir import RunDir

        data = json.loads(setting)
        run, index = RunDir(Path(data["dir"])), int(data["index"])
        plugin = WatchedProcess(
            config,
            run.log(index),
            run.fault(index),
            hooks,
            reports=True,
            history=run.history(index),
            stop=data.get("stop"),
        )
    elif workerinput is not None:
        from opcheck.isolation.xdist import WORKER_KEY, worker_files

        base = workerinput.get(WORKER_KEY)
        if base is not None:
            plugin = WatchedProcess(config, *worker_files(base), hooks, reports=False)
    elif getattr(config.option, "dist", "no") != "no" and not config.option.collectonly:
        from opcheck.isolation.xdist import XdistWatch

        plugin = XdistWatch(config, hooks)
    if plugin is not None:
        config.pluginmanager.register(plugin, PLUGIN_NAME)
