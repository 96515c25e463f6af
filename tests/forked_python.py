"""`python -m MODULE ARGS` or `python -c CODE ARGS` in a process of its own, forked from a server
process that has imported torch.

Every `opcheck` command imports torch, about 2 s of CPU a run (5 s with torch's OpInfo database),
which was most of what many tests spent. `run` and `run_code` run the command in a child forked
from a server that imported those modules once: the child is a process of its own, started as
`python -m MODULE` or `python -c CODE` starts (its working directory, environment, sys.argv,
sys.orig_argv, sys.path with the working directory first and then PYTHONPATH's entries, a fresh
__main__), with its own exit status, stdout and stderr; it runs Python's shutdown (non-daemon
threads joined, atexit, streams flushed) and exits, so nothing it imports, patches or limits
outlives it. What differs from a fresh interpreter: the preloaded modules (torch, and what importing
torch imports) are already in sys.modules, imported under the server's environment, and the CPU
seconds of those imports are not the child's.

So it is for tests of what a command does, never of what a fresh interpreter imports, sets up or
costs. Where the command's environment differs from the server's in a variable read when Python or
torch starts (PYTHON*, TORCH_*, OMP_*, ...) or when a preloaded module was imported (TORCHINDUCTOR_*
where it imported torch's inductor, ...), or PYTHONPATH names a folder with a sitecustomize or
usercustomize module, a fresh interpreter runs it instead, as it does off POSIX.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

TORCH = ("torch",)
OP_DB = ("torch", "torch.testing._internal.common_methods_invocations")
"""Preloads: torch; torch and its OpInfo database (op_db)."""

STARTUP = ("PYTHON", "TORCH_", "PYTORCH", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "CUDA_", "LD_", "MALLOC_")
"""Prefixes of the variables read when Python and torch start: a command whose environment differs
from the server's in one of them runs in a fresh interpreter (PYTHONPATH aside: sys.path is set)."""
ON_IMPORT = {"TORCHDYNAMO_": "torch._dynamo", "TORCHINDUCTOR_": "torch._inductor", "TRITON_": "triton"}
"""Prefixes of the variables these modules read when imported: they count where the server imported
the module (torch's OpInfo database imports all three; torch alone none)."""

SERVER = r"""
import builtins, importlib, json, os, runpy, signal, sys, threading, traceback, types

before = dict(os.environ)
for name in sys.argv[1:]:  # the point of the server: each child starts with these imported
    importlib.import_module(name)

requests = os.fdopen(os.dup(0), "r")
replies = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
os.dup2(2, 1)  # a stray print of the server goes to its stderr, never into the replies
BASE_PATH = sys.path[1:]  # without '' (the -c script's): what a fresh interpreter has after PYTHONPATH
# what importing set in the environment (torch's inductor sets its cache folder), and what it imported
replies.write(json.dumps([{k: v for k, v in os.environ.items() if before.get(k) != v}, list(sys.modules)]) + "\n")
replies.flush()


def exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def child(request):
    code = 1
    try:
        requests.close()
        replies.close()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(target, fd)
            os.close(target)
        pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        module, source = request.get("module"), request.get("code")
        sys.path[:] = [os.getcwd() if module else "", *pythonpath, *BASE_PATH]
        sys.argv = ["-m" if module else "-c", *request["args"]]  # runpy puts the module's file first
        sys.orig_argv = [sys.executable, "-m" if module else "-c", module or source, *request["args"]]
        main = types.ModuleType("__main__")  # as a fresh interpreter's, before runpy or the code fills it
        main.__builtins__, main.__annotations__, main.__loader__ = builtins, {}, importlib.machinery.BuiltinImporter
        sys.modules["__main__"] = main
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                exec(compile(source, "<string>", "exec"), main.__dict__)
            code = 0
        except SystemExit as e:
            code = exit_code(e.code)
        except KeyboardInterrupt as e:
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # from the command's frames
            code = -signal.SIGINT
        except BaseException as e:
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        threading._shutdown()  # what interpreter shutdown does, in its order
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(code & 0xFF)


for line in requests:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)
    replies.write(f"{pid}\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(f"{os.waitstatus_to_exitcode(status)}\n")
    replies.flush()
"""


class _Server:
    def __init__(self, preload: tuple[str, ...], env: dict[str, str]) -> None:
        self.env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=tempfile.gettempdir(),
        )
        self.pending = b""
        self.set_on_import: dict[str, str] = {}
        self.read: tuple[str, ...] = STARTUP
        try:
            line = self.line(None)
        except RuntimeError:
            return  # fits nothing: the commands run in fresh interpreters
        self.set_on_import, modules = json.loads(line)
        self.read += tuple(prefix for prefix, module in ON_IMPORT.items() if module in modules)

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a child of the server starts as a fresh interpreter with `env` would, but for
        the preloaded modules."""
        if self.proc.poll() is not None:
            return False
        for key in {*env, *self.env, *self.set_on_import}:
            if key == "PYTHONPATH" or not key.startswith(self.read):
                continue
            value = env.get(key)
            if value != self.env.get(key) and (key not in self.set_on_import or value != self.set_on_import[key]):
                return False
        folders = [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        return not any((f / f"{name}.py").exists() for f in folders for name in ("sitecustomize", "usercustomize"))

    def line(self, timeout: float | None) -> str | None:
        """The server's next line, or None past `timeout` seconds."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"the fork server ended (exit status {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def reply(self, timeout: float | None) -> int | None:
        """The server's next line as an int (a child's pid, then its exit status), or None past
        `timeout` seconds."""
        line = self.line(timeout)
        return None if line is None else int(line)

    def run(self, request: dict, argv: list[str], timeout: float | None) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="forked_python_") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            out.touch()
            err.touch()
            self.proc.stdin.write((json.dumps(dict(request, stdout=str(out), stderr=str(err))) + "\n").encode())
            self.proc.stdin.flush()
            pid = self.reply(None)
            status = self.reply(timeout)
            if status is None:
                os.kill(pid, signal.SIGKILL)
                self.reply(None)
            encoding = locale.getpreferredencoding(False)
            stdout = out.read_text(encoding=encoding)
            stderr = err.read_text(encoding=encoding)
        if status is None:
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, status, stdout, stderr)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_servers: dict[tuple[str, ...], _Server] = {}
_lock = threading.Lock()


def _run(request: dict, argv: list[str], cwd, env, timeout, preload) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(os.getcwd() if cwd is None else cwd)
    with _lock:
        server = _servers.get(preload)
        if os.name == "posix" and (server is None or server.proc.poll() is not None):
            server = _servers[preload] = _Server(preload, env)
            atexit.register(server.close)
        if os.name == "posix" and server.fits(env):
            return server.run(dict(request, cwd=cwd, env=env), argv, timeout)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run(
    module: str,
    *args: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    preload: tuple[str, ...] = TORCH,
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in `cwd` with `env` (default: this process's), its output as text:
    what subprocess.run(..., capture_output=True, text=True) gives, from a child of the server."""
    argv = [sys.executable, "-m", module, *args]
    return _run({"module": module, "args": list(args)}, argv, cwd, env, timeout, preload)


def run_code(
    code: str,
    *args: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    preload: tuple[str, ...] = TORCH,
) -> subprocess.CompletedProcess[str]:
    """`python -c CODE ARGS`, as `run` runs `python -m`."""
    argv = [sys.executable, "-c", code, *args]
    return _run({"code": code, "args": list(args)}, argv, cwd, env, timeout, preload)
