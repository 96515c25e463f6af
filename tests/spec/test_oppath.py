"""resolve_op: whatever a named module's code raises while importing, exits included, is an OpPathError
(a spec problem at `op:`), except a Ctrl-C the user really pressed."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest

from opcheck.spec.oppath import OpPathError, resolve_op


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch):
    """Write `name`.py (dots make packages) under a folder on sys.path; forget it afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make(name: str, body: str) -> str:
        parts = name.split(".")
        folder = tmp_path.joinpath(*parts[:-1])
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(1, len(parts)):
            tmp_path.joinpath(*parts[:i], "__init__.py").touch()
        (folder / f"{parts[-1]}.py").write_text(textwrap.dedent(body))
        made.append(parts[0])
        return name

    yield make
    for key in [k for k in sys.modules if k.split(".")[0] in made]:
        del sys.modules[key]


@pytest.mark.parametrize(
    "raise_it, shown",
    [
        ("import sys\nsys.exit(3)", "SystemExit(3)"),
        ("raise SystemExit('usage: tool [-h]')", "SystemExit('usage: tool [-h]')"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt()"),
        ("raise GeneratorExit", "GeneratorExit()"),
    ],
    ids=["sys_exit", "exit_with_message", "keyboard_interrupt", "generator_exit"],
)
def test_an_exit_while_importing_is_reported_not_obeyed(make_module, raise_it, shown):
    name = make_module("opcheck_t_exits", f"print('some output of its own')\n{raise_it}\n\ndef f(x):\n    return x\n")
    with pytest.raises(OpPathError) as info:
        resolve_op(f"{name}:f")
    assert str(info.value) == (
        f"importing 'opcheck_t_exits' raised {shown} while running its top-level code; code "
        f"a spec names must not exit or interrupt (while resolving 'opcheck_t_exits:f')"
    )
    assert name not in sys.modules  # nothing half-imported stays behind
    # and again: the import is retried (and fails the same way), not served from a broken cache
    with pytest.raises(OpPathError, match=r"raised"):
        resolve_op(f"{name}:f")


def test_a_dotted_path_names_the_module_that_exited(make_module):
    make_module("opcheck_t_pkg.inner.exits", "raise SystemExit(2)\n")
    with pytest.raises(OpPathError, match=r"^importing 'opcheck_t_pkg\.inner\.exits' raised SystemExit\(2\) "):
        resolve_op("opcheck_t_pkg.inner.exits.f")
    with pytest.raises(OpPathError, match=r"^importing 'opcheck_t_pkg\.inner\.exits' raised SystemExit\(2\) "):
        resolve_op("opcheck_t_pkg.inner.exits:f")


def test_a_module_getattr_that_exits_is_reported(make_module):
    make_module("opcheck_t_lazy", "def __getattr__(name):\n    raise SystemExit(4)\n")
    with pytest.raises(OpPathError, match=r"^looking up 'f' in 'opcheck_t_lazy' raised SystemExit\(4\)"):
        resolve_op("opcheck_t_lazy:f")


def test_ordinary_failures_keep_their_messages(make_module):
    make_module("opcheck_t_boom", "raise RuntimeError('boom')\n")
    with pytest.raises(OpPathError, match=r"^importing 'opcheck_t_boom' failed: RuntimeError: boom$"):
        resolve_op("opcheck_t_boom.f")
    make_module("opcheck_t_fine", "def f(x):\n    return x\n")
    assert resolve_op("opcheck_t_fine.f").__name__ == "f"
    with pytest.raises(OpPathError, match=r"'opcheck_t_fine' has no attribute 'g'"):
        resolve_op("opcheck_t_fine.g")
    with pytest.raises(OpPathError, match=r"^no module named 'opcheck_t_absent'"):
        resolve_op("opcheck_t_absent.f")


needs_default_sigint = pytest.mark.skipif(
    sys.platform == "win32" or signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="needs POSIX signals and Python's own SIGINT handler",
)


@needs_default_sigint
def test_a_real_ctrl_c_during_the_import_still_stops(make_module):
    make_module(
        "opcheck_t_sigint", "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport time\ntime.sleep(5)\n"
    )
    with pytest.raises(KeyboardInterrupt):
        resolve_op("opcheck_t_sigint:f")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@needs_default_sigint
def test_the_sigint_handler_is_restored_and_a_module_s_own_is_kept(make_module):
    make_module("opcheck_t_quiet", "def f(x):\n    return x\n")
    resolve_op("opcheck_t_quiet:f")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    make_module(
        "opcheck_t_handler", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ndef f(x):\n    return x\n"
    )
    try:
        resolve_op("opcheck_t_handler:f")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_dotted_path_resolves_as_python_evaluates_it(make_module, tmp_path):
    # torchvision.ops binds roi_align, the function, over its submodule of that name
    make_module("visionlike.ops.roi_align", "def roi_align(x):\n    return x\n\ndef helper(x):\n    return x\n")
    (tmp_path / "visionlike" / "ops" / "__init__.py").write_text("from .roi_align import roi_align\n")
    op = resolve_op("visionlike.ops.roi_align")
    assert callable(op) and op.__name__ == "roi_align" and op.__module__ == "visionlike.ops.roi_align"
    assert resolve_op("visionlike.ops:roi_align") is op
    # a submodule the package does not bind is still reached, and so is its function
    assert resolve_op("visionlike.ops.roi_align.helper").__name__ == "helper"


def test_a_torch_ops_operator_not_registered_says_what_registers_it():
    with pytest.raises(OpPathError) as info:
        resolve_op("torch.ops.aten.no_such_operator_xyz")
    assert "no attribute 'no_such_operator_xyz'" in str(info.value)
    with pytest.raises(OpPathError) as info:
        resolve_op("torch.ops.opcheck_unregistered_ns.rms_normalize")
    text = str(info.value)
    assert "'torch.ops.opcheck_unregistered_ns' has no attribute 'rms_normalize'" in text
    assert "once the module that registers it" in text and "has been imported" in text
