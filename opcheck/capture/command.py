"""The command `opcheck capture` runs: a Python script, a `-m` module, `-c` code, or pytest.

It runs in a child of this Python (sys.executable), which is the one that has opcheck: a command
that starts with another interpreter's name runs under this one, and the summary says so.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

FORMS = "`python SCRIPT.py ARGS`, `python -m MODULE ARGS`, `python -c CODE`, `pytest ARGS` or `SCRIPT.py ARGS`"
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")
_XDIST = ("-n", "--numprocesses", "--dist", "--tx", "-d")


class CommandError(ValueError):
    """A command capture cannot run (the message says why and what it takes)."""


@dataclass(frozen=True)
class Command:
    mode: str  # "script", "module", "code" or "pytest"
    target: str  # the script's path, the module, the code; "pytest" for pytest
    argv: tuple[str, ...]  # sys.argv as the command sees it
    interpreter: str | None = None  # another Python the command named (it runs under this one)

    def shown(self) -> str:
        return " ".join(_quote(a) for a in self.words)

    @property
    def words(self) -> tuple[str, ...]:
        if self.mode == "pytest":
            return ("pytest", *self.argv[1:])
        if self.mode == "module":
            return ("python", "-m", self.target, *self.argv[1:])
        if self.mode == "code":
            return ("python", "-c", self.target, *self.argv[1:])
        return ("python", *self.argv)


def parse_command(words: list[str]) -> Command:
    """The command after `--`, as capture will run it."""
    if not words:
        raise CommandError(
            f"no command: give one after `--`, e.g. `opcheck capture --op OP -- {FORMS.split(',')[0].strip('`')}`"
        )
    first, rest = words[0], list(words[1:])
    name = os.path.basename(first)
    interpreter = None
    if _PYTHON.match(name):
        if os.path.realpath(shutil.which(first) or first) != os.path.realpath(sys.executable):
            interpreter = first
        return _python(rest, interpreter)
    if name in ("pytest", "py.test"):
        return _pytest(rest)
    if first.endswith(".py"):
        return _script(first, rest)
    raise CommandError(f"cannot run {first!r}: capture records a Python process; give {FORMS}")


def _python(words: list[str], interpreter: str | None) -> Command:
    options = []
    while words and words[0].startswith("-") and words[0] not in ("-m", "-c", "-"):
        options.append(words.pop(0))
    if options:
        raise CommandError(f"python options {' '.join(options)} are not supported by capture; give {FORMS}")
    if not words:
        raise CommandError(f"`python` with no script: give {FORMS}")
    if words[0] == "-m":
        if len(words) < 2:
            raise CommandError("`python -m` needs a module name")
        module, args = words[1], words[2:]
        if module == "pytest":
            return _pytest(args, interpreter)
        return Command("module", module, (module, *args), interpreter)
    if words[0] == "-c":
        if len(words) < 2:
            raise CommandError("`python -c` needs code")
        return Command("code", words[1], ("-c", *words[2:]), interpreter)
    if words[0] == "-":
        raise CommandError(f"capture cannot read a script from standard input; give {FORMS}")
    return _script(words[0], words[1:], interpreter)


def _script(path: str, args: list[str], interpreter: str | None = None) -> Command:
    if not Path(path).is_file():
        raise CommandError(f"no such script: {path}")
    return Command("script", path, (path, *args), interpreter)


def _pytest(args: list[str], interpreter: str | None = None) -> Command:
    for a in args:
        if a in _XDIST or any(a.startswith(o + "=") for o in _XDIST if o.startswith("--")) or re.match(r"^-n\d+$", a):
            raise CommandError(
                f"pytest option {a}: capture records the calls of one process, and xdist runs the tests in others; "
                "drop -n/--dist for the capture"
            )
    return Command("pytest", "pytest", ("pytest", *args), interpreter)


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)
