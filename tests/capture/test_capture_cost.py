"""The cost comment `opcheck capture` writes on a new sample says what `opcheck list --cost` says of
the same test: both estimate with the same settings (the project's `[tool.opcheck]` policy, budget
and threads), the same sample and the same plan.

Estimates come from timed probes; here the probes' clock is one that moves only when it is read and
when the op does work (by its input's size), so both commands' numbers are deterministic and any
difference between them is a difference in what they estimated, not in the machine's load. Both
commands run in this process (capture's command itself runs in its child, as ever).

Then what capture imports, and when: the waits of its own that benchmarks/bench_capture.py
measured and cut, pinned by which modules are loaded (never by a clock)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from opcheck import cli
from opcheck.runtime.context import BUDGET_ENV
from opcheck.runtime.cost import estimate as cost_estimate
from opcheck.runtime.cost import probe
from opcheck.runtime.project_root import set_project_root
from tests.capture.scratch import project, python

READ = 1e-4
"""Seconds the probes' clock moves at each reading."""
WORK = 1e-5
"""Seconds the op's call moves it per element of its input (a larger sample costs more)."""

OPS = '''
import torch

WORK = None
"""Set by the test that probes this op in its own process: called with the input at each call."""


def wave(x):
    if WORK is not None:
        WORK(x)
    return torch.sin(x) * x
'''

RUN = """
import torch
from costpkg.ops import wave

for shape in [(3, 4), (16, 16)]:
    x = torch.randn(*shape, requires_grad=True)
    wave(x).sum().backward()
"""


class Clock:
    """time.perf_counter and time.thread_time for the probes: READ seconds per reading, and WORK
    seconds per element of each input the op is called with."""

    def __init__(self) -> None:
        self.now = 0.0

    def read(self) -> float:
        self.now += READ
        return self.now

    def work(self, x: object) -> None:
        self.now += WORK * getattr(x, "numel", lambda: 1)()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch):
    clock = Clock()
    monkeypatch.setattr(probe, "time", SimpleNamespace(perf_counter=clock.read, thread_time=clock.read))
    cost_estimate.machine_factor.cache_clear()  # measured once per process: here, on this clock
    yield clock
    cost_estimate.machine_factor.cache_clear()


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock):
    """A project with the op's package and a run of it, as the working directory; the op's module
    imported here with the clock's work on."""
    root = project(tmp_path, {"costpkg/__init__.py": "", "costpkg/ops.py": OPS, "run.py": RUN})
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "path", [str(root), *sys.path])  # what `opcheck` adds, undone after
    for name in [m for m in sys.modules if m == "costpkg" or m.startswith("costpkg.")]:
        monkeypatch.delitem(sys.modules, name)
    ops = importlib.import_module("costpkg.ops")
    ops.WORK = clock.work
    yield root
    for name in [m for m in sys.modules if m == "costpkg" or m.startswith("costpkg.")]:
        del sys.modules[name]
    set_project_root(None)


def captured_costs(text: str) -> dict[tuple[str, str, str], str]:
    """(sample, check, dtype) -> seconds, from each sample's `# estimated cost on this cpu:` comment."""
    out = {}
    comment = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# estimated cost on this cpu:"):
            comment = stripped.split(":", 1)[1]
        found = re.match(r"- name: (\S+)$", stripped)
        if found and comment is not None:
            for check, dtype, seconds in re.findall(r"(\w+) (\w+) ([\d.]+ m?s)", comment):
                out[(found[1], check, dtype)] = seconds
            comment = None
    return out


def listed_costs(report: str) -> dict[tuple[str, str, str], str]:
    """(sample, check, dtype) -> seconds of each cpu test in `opcheck list --cost --top 0`'s table."""
    test = re.compile(r"^ +!? +([\d.]+ m?s) +\d+/\d+/\d+/\d+ +\w+::test_(\w+)\[cpu-(\w+)-(\S+)\] ")
    return {(m[4], m[2], m[3]): m[1] for m in map(test.match, report.splitlines()) if m}


@pytest.mark.parametrize(
    ("table", "env", "budget"),
    [
        pytest.param("", None, 2**20, id="defaults"),
        # 3x4's Jacobian (144 entries) is past this budget: projections, not the full Jacobian
        pytest.param("[tool.opcheck]\nbudget = 64\n", None, 64, id="project_budget"),
        pytest.param('[tool.opcheck]\npolicy = "fast"\n', None, 2**20, id="project_policy"),
        pytest.param("[tool.opcheck]\nbudget = 4096\n", "64", 64, id="environment_budget"),  # as pytest takes it
    ],
)
def test_each_new_samples_cost_comment_is_what_list_cost_says(
    scratch: Path, table: str, env: str | None, budget: int, monkeypatch: pytest.MonkeyPatch, capsys
):
    (scratch / "pyproject.toml").write_text(table, encoding="utf-8")
    if env is None:
        monkeypatch.delenv(BUDGET_ENV, raising=False)
    else:
        monkeypatch.setenv(BUDGET_ENV, env)
    status = cli.main(["capture", "--op", "costpkg.ops:wave", "--", "python", "run.py"])
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    text = (scratch / "op_specs" / "wave.yaml").read_text(encoding="utf-8")
    captured = captured_costs(text)

    assert cli.main(["list", "--cost", "--top", "0", "op_specs/wave.yaml"]) == 0
    report = capsys.readouterr().out
    listed = listed_costs(report)

    assert f"Jacobian budget {budget} " in report.splitlines()[0], report
    assert {sample for sample, _, _ in captured} == {"3x4", "16x16"}, text
    assert {check for _, check, _ in captured} >= {"gradcheck", "gradgradcheck"}, text
    assert captured == listed, f"capture's comments:\n{text}\nlist --cost:\n{report}"


# ------------------------------------------------------------------------------ what capture imports
# capture's own wait: the parent starts the command before it imports torch, and prepares what comes
# after it (prepared_meanwhile) while the command runs; the probe of a new spec's flags never pays
# for torch._dynamo (over a second to import), which only gradgradcheck's estimate needs.
def imported(tmp: Path, code: str) -> str:
    result = python(tmp, "-c", "import sys\n" + code)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_capture_imports_no_torch_before_it_starts_the_command(tmp_path: Path):
    modules = (
        "opcheck.cli, opcheck.capture.run, opcheck.capture.summary, opcheck.capture.targets, opcheck.spec.yamlload"
    )
    assert imported(tmp_path, f"import {modules}\nprint('torch' in sys.modules)") == "False"


def test_preparing_meanwhile_imports_torch_and_the_estimates_transforms_in_a_thread_it_joins(tmp_path: Path):
    code = """
import threading
from opcheck.capture import cost
for estimating in (False, True):
    with cost.prepared_meanwhile(estimating):
        pass
    print('torch' in sys.modules, 'torch._dynamo' in sys.modules, threading.active_count())
"""
    assert imported(tmp_path, code).splitlines() == ["True False 1", "True True 1"]


def test_the_probe_of_a_new_specs_flags_imports_no_torch_dynamo(tmp_path: Path):
    code = """
from opcheck.capture import cost
from opcheck.spec.loader import load_spec_text
text = 'op: torch.sin\\nsamples:\\n  - name: a\\n    args: [{shape: [3, 4]}]\\n'
spec = load_spec_text(text, source='s.yaml', root='.')[0]
print(cost.probe_flags(spec), 'torch._dynamo' in sys.modules)
"""
    assert imported(tmp_path, code) == "[] False"
