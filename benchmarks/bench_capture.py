#!/usr/bin/env python
"""What `opcheck capture` adds to a command's run: a trivial op's command alone and under capture
(with and without --no-cost), side by side in one run of this script, and where capture's time goes.

    python benchmarks/bench_capture.py              # 5 repeats of each, medians
    python benchmarks/bench_capture.py --repeat 9

The command is `python run.py` in a scratch project: pkg/ops.py `def f(x): return x.sin()`, called
once on a 3x4 tensor with a backward. Each capture writes a new spec (`--op pkg.ops:f --specs
specs`) into an emptied folder. The three forms run interleaved, repeat after repeat, so a busy
machine slows each alike. The opcheck measured is the one this Python imports (PYTHONPATH chooses).

The parts come from further runs of the capture command in a process that times capture's steps
(its functions wrapped, nothing else changed): python's start and exit (the exit tears down what
the process imported: torch's modules, torch._dynamo's most of all); the parent's imports before
the command starts; the child (the command with the recorder installed: its start, the recorder's
imports, the command, the records' dump), shown as what it adds to the command alone; then after
the command: validating the spec (every time it is validated), the probe of the new spec's flags,
the cost estimates, writing the spec, and the rest (merging the records, the summary, the schema
copy, and torch's import where no step above is the first to need it). A step includes the imports
it is the first to need. The cpu column is user and system time of the processes together: what
the machine's other work does not change, and what doing two things at once does not cut.

Measured with `python benchmarks/bench_capture.py` (5 repeats) on the project's 2-core x86,
torch 2.13 CPU, with other work running on it (load average 2-3.5), the command alone 1.4 s:

    opcheck                          capture: wall, cpu over alone   --no-cost: wall, cpu over alone
    before (8e5422e)                 +3.71 s, +3.47 s                +3.53 s, +3.30 s
    after                            +1.98 s, +3.35 s                +1.06 s, +2.41 s

Before, the parent imported torch before it started the command (the recorder's module imported
it at the top: 1.1 s), and the probe of a new spec's flags warmed torch.func.vjp, which imports
torch._dynamo (1.1 s, and 0.3 s more of teardown at exit) though only gradgradcheck's estimate
needs it. After, the parent's modules import no torch (the records are merged by
opcheck.capture.records, which needs none), it imports torch and what validating and probing need
while the command runs (opcheck.capture.cost.prepared_meanwhile around the wait for the child), and
torch._dynamo only for the estimates (the probes' warm-up runs a first backward instead: its import
of sympy, 0.3 s, would otherwise fall in a timed call). The wall time gained needs a core the
command leaves free; the cpu time is what is left to cut (python's exit with torch loaded, 0.6 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import opcheck

OPS = "def f(x):\n    return x.sin()\n"
RUN = "import torch\n\nfrom pkg.ops import f\n\nx = torch.randn(3, 4, requires_grad=True)\nf(x).sum().backward()\n"
CAPTURE = ["capture", "--op", "pkg.ops:f", "--specs", "specs", "--", "python", "run.py"]

# Run as `python -c DRIVER PARTS.json ARGS...`: the capture command, its steps timed.
DRIVER = """
import json, sys, time
start = time.perf_counter()
import opcheck.cli as cli
import opcheck.capture.run as run
from opcheck.capture import cost
imported = time.perf_counter()
parts = {}

def timing(owner, name, part):
    original = getattr(owner, name)
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            parts[part] = parts.get(part, 0.0) + time.perf_counter() - t
    setattr(owner, name, timed)

timing(run, "_run_child", "child")
timing(run._Builder, "validated", "validation")
timing(cost, "probe_flags", "probe")
timing(cost, "estimates", "estimates")
timing(run, "_store", "writing")
status = cli.main(sys.argv[2:])
parts["parent imports"] = imported - start
parts["in python"] = time.perf_counter() - start
with open(sys.argv[1], "w") as f:
    json.dump(parts, f)
sys.exit(status)
"""

STEPS = ("parent imports", "child", "validation", "probe", "estimates", "writing")


def scratch(folder: Path) -> None:
    (folder / "pkg").mkdir()
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "ops.py").write_text(OPS)
    (folder / "run.py").write_text(RUN)
    (folder / "pyproject.toml").write_text("")


def run(folder: Path, argv: list[str]) -> tuple[float, float]:
    """Seconds of one run of `argv` in `folder`, a fresh specs folder for each capture: the wall
    clock's, and the CPU's (user and system, of its processes together: what other work on the
    machine does not change, and what running two things at once does not cut)."""
    shutil.rmtree(folder / "specs", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(opcheck.__file__).parents[1]), str(folder)]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or ("capture" in argv and "wrote specs/f.yaml" not in done.stdout):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def parts(folder: Path, options: list[str]) -> dict[str, float]:
    """The steps of one instrumented capture, and `python start and exit` (the process's wall time
    less the time it spent in python: its start, and its exit's teardown of what it imported)."""
    out = folder / "parts.json"
    argv = [sys.executable, "-c", DRIVER, str(out), *CAPTURE[:-3], *options, *CAPTURE[-3:]]
    wall, _ = run(folder, argv)
    found = json.loads(out.read_text())
    found["python start and exit"] = wall - found.pop("in python")
    found["wall"] = wall
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    python = [sys.executable, "-m", "opcheck"]
    forms = {
        "command alone": [sys.executable, "run.py"],
        "under capture": [*python, *CAPTURE],
        "under capture --no-cost": [*python, *CAPTURE[:-3], "--no-cost", *CAPTURE[-3:]],
    }
    with tempfile.TemporaryDirectory(prefix="opcheck-capture-overhead-") as tmp:
        folder = Path(tmp)
        scratch(folder)
        for argv in forms.values():  # warm the file cache: every form reads the same files
            run(folder, argv)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in forms}
        steps: dict[str, list[dict[str, float]]] = {"cost": [], "no-cost": []}
        for _ in range(args.repeat):
            for name, form in forms.items():
                times[name].append(run(folder, form))
            steps["cost"].append(parts(folder, []))
            steps["no-cost"].append(parts(folder, ["--no-cost"]))
    alone = statistics.median(wall for wall, _ in times["command alone"])
    alone_cpu = statistics.median(cpu for _, cpu in times["command alone"])
    print(f"opcheck capture's overhead on `python run.py` (a sin on 3x4, one call), median of {args.repeat}")
    print(f"  opcheck: {Path(opcheck.__file__).parent}")
    print(f"  {'':<26}{'wall':<16}cpu")
    for name, found in times.items():
        wall, cpu = statistics.median(w for w, _ in found), statistics.median(c for _, c in found)
        cells = [f"{wall:.2f} s", f"{cpu:.2f} s"]
        if name != "command alone":
            cells = [f"{cells[0]} (+{wall - alone:.2f})", f"{cells[1]} (+{cpu - alone_cpu:.2f})"]
        print(f"  {name:<26}{cells[0]:<16}{cells[1]}")
    print("parts of capture, from a process that times its steps (median):")
    print(f"  {'':<22}{'capture':>9}{'--no-cost':>11}")
    rows = ("python start and exit", *STEPS, "the rest", "wall")
    for row in rows:
        cells = []
        for key in ("cost", "no-cost"):
            found = []
            for p_ in steps[key]:
                if row == "the rest":
                    found.append(p_["wall"] - sum(p_.get(k, 0.0) for k in ("python start and exit", *STEPS)))
                elif row == "child":
                    found.append(p_.get("child", 0.0) - alone)
                else:
                    found.append(p_.get(row, 0.0))
            cells.append(f"{statistics.median(found):9.2f}")
        label = "child (beyond alone)" if row == "child" else row
        print(f"  {label:<22}{cells[0]} s{cells[1]:>9} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
