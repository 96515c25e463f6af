"""tests/forked_python.py against a fresh interpreter: the same commands, run both ways, give the
same exit status, stdout and stderr; only the preloaded modules differ."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import forked_python

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the fork server is POSIX only")

SHOW = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    print("argv", sys.argv, "orig", sys.orig_argv[1:])
    print("cwd", os.getcwd() == os.path.realpath(sys.argv[-1]) or os.getcwd())
    print("path0", sys.path[0] == "" or sys.path[0] == os.getcwd(), "in path", os.environ["EXTRA"] in sys.path)
    print("env", os.environ.get("MARK"), "PYTEST_CURRENT_TEST" in os.environ)
    print("main", __name__, sorted(k for k in vars() if k.startswith("__")))
    atexit.register(print, "at exit")
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
    print("to stderr", file=sys.stderr)
    """
)

ENDINGS = {
    "returns": "",
    "exits with a status": "sys.exit(3)",
    "exits with a message": "sys.exit('gave up')",
    "raises": "def inner():\n    raise ValueError('wrong')\ninner()",
    "is interrupted": "raise KeyboardInterrupt",
}


def _both(tmp_path: Path, code: str, *args: str, env: dict[str, str]):
    fresh = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    forked = forked_python.run_code(code, *args, cwd=tmp_path, env=env, timeout=120)
    return fresh, forked


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    extra_path = str(tmp_path / "extra")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    return env | {"EXTRA": extra_path, **extra}


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_command_gives_what_a_fresh_interpreter_gives(tmp_path, ending):
    code = SHOW + ENDINGS[ending] + "\n"
    fresh, forked = _both(tmp_path, code, "an arg", str(tmp_path), env=_env(tmp_path, MARK="set"))
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    assert forked.stderr == fresh.stderr
    assert "at exit" in forked.stdout and "thread done" in forked.stdout


def test_a_module_runs_as_python_m_runs_it_from_the_working_directory(tmp_path):
    (tmp_path / "tool.py").write_text("import sys\nprint(__name__, sys.argv[1:], __file__ == sys.argv[0])\n")
    env = _env(tmp_path)
    fresh = subprocess.run(
        [sys.executable, "-m", "tool", "x"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    forked = forked_python.run("tool", "x", cwd=tmp_path, env=env, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout == "__main__ ['x'] True\n"


PRELOADED = "import sys\nprint('torch' in sys.modules)\n"


def test_the_child_starts_with_torch_imported_unless_a_startup_variable_differs(tmp_path):
    """What makes it faster, and where it steps aside: a variable read when torch starts."""
    same = forked_python.run_code(PRELOADED, cwd=tmp_path, env=_env(tmp_path), timeout=120)
    assert same.stdout == "True\n", same.stderr
    threads = os.environ.get("OMP_NUM_THREADS", "1") + "0"
    other = forked_python.run_code(PRELOADED, cwd=tmp_path, env=_env(tmp_path, OMP_NUM_THREADS=threads), timeout=120)
    assert other.stdout == "False\n", other.stderr


def test_what_a_child_changes_does_not_reach_the_next(tmp_path):
    code = "import sys, torch\nprint(getattr(torch, 'marked', None), 'marker' in sys.modules)\n"
    code += "torch.marked = 1\nsys.modules['marker'] = sys\n"
    runs = [forked_python.run_code(code, cwd=tmp_path, env=_env(tmp_path), timeout=120) for _ in range(2)]
    assert [run.stdout for run in runs] == ["None False\n"] * 2, runs[-1].stderr


def test_a_child_past_its_timeout_is_killed_and_the_server_runs_the_next(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        forked_python.run_code("import time\nprint('started', flush=True)\ntime.sleep(60)", cwd=tmp_path, timeout=2)
    assert raised.value.output == "started\n"
    after = forked_python.run_code(PRELOADED, cwd=tmp_path, env=_env(tmp_path), timeout=120)
    assert after.stdout == "True\n"
