"""Project settings: the `[tool.opcheck]` table of pyproject.toml, read by the `opcheck` command and the pytest plugin.

    [tool.opcheck]
    specs = "op_specs"                      # the `opcheck` commands' --specs
    out = "generated_tests"                 # `opcheck generate --out`
    results = "build/opcheck-results.json"  # pytest records every generated test there; `opcheck report` reads it
    device = ["cpu", "cuda"]                # pytest --opcheck-device
    dtype = "float64"                       # pytest --opcheck-dtype
    policy = "auto"                         # pytest --opcheck-policy
    budget = "4M"                           # pytest --opcheck-budget
    threads = 1                             # pytest --opcheck-threads
    time_budget = 600                       # pytest --opcheck-time-budget: seconds a generated test may take
    isolation = "process"                   # pytest --opcheck-isolation: a crash fails its test only
    triton_interpret = false                # leave Triton alone (default: its interpreter where there is no GPU)
    compile = true                          # `compile` tests for every spec without a `compile:` key (default: false)

Paths are relative to the folder of that pyproject.toml, wherever a command runs. The table is the
one of the nearest pyproject.toml at or above the starting folder that has it (the working directory
for `opcheck`, pytest's rootdir for the plugin). A command-line option overrides its key; pytest's
own ini keys (`opcheck_device`, ...) say the same as these, so a project sets a key in one of the two
places, not both.

`compile` is read by `opcheck generate`, `list` and `validate` (not by pytest: the generated modules
hold each spec's `compile:` as it was when they were written): true gives every spec that has no
`compile:` key of its own the block's defaults (`compile: true`), false (the default) leaves those
specs without `compile` tests; a spec's own `compile:`, true or false, always wins. Changing it
makes `opcheck generate --check` report the modules it changes as stale.

Every setting is validated here, from whichever source it comes (command line, pytest ini, this
table), so the plugin and the CLI accept the same values and word their errors alike: each names
where the bad value was written (`pyproject.toml:14: [tool.opcheck] policy: ...`).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from opcheck.spec.model import OpSpec

PYPROJECT = "pyproject.toml"
TABLE = "[tool.opcheck]"
POLICIES = ("auto", "full", "fast")
ALL_DEVICES = "all"
ALL_DTYPES = "all"
THREADS_KEEP = "keep"
DEFAULT_THREADS = 1
ISOLATION_MODES = ("process", "off")
DEFAULT_ISOLATION = "process"
TIME_BUDGET_OFF = "off"
DEFAULT_TIME_BUDGET = 600.0
"""Seconds a generated test may run (`time_budget`). The catalog's slowest test takes about a second
on a 2-core CPU; ten minutes ends a hung test well within a CI job and never a sound one."""

PATH_KEYS = ("specs", "out", "results")
LIST_KEYS = ("device", "dtype")
BOOL_KEYS = ("triton_interpret", "compile")
KEYS = (*PATH_KEYS, *LIST_KEYS, "policy", "budget", "threads", "time_budget", "isolation", *BOOL_KEYS)


class ConfigError(ValueError):
    """A bad setting; the message starts with where it was written."""


@dataclass(frozen=True)
class Setting:
    """One key of the table: its value as TOML gave it and where it was written."""

    key: str
    value: object
    file: Path
    line: int

    @property
    def where(self) -> str:
        return f"{_shown(self.file)}:{self.line}: {TABLE} {self.key}"

    @property
    def text(self) -> str:
        return str(self.value)

    @property
    def names(self) -> list[str]:
        """A list key's names: a TOML list, or one string of names separated by commas or spaces."""
        values = self.value if isinstance(self.value, list) else [self.value]
        return split_names(str(v) for v in values)


@dataclass(frozen=True)
class ProjectConfig:
    """The `[tool.opcheck]` table in effect (empty where no pyproject.toml has one)."""

    file: Path | None = None
    settings: dict[str, Setting] = field(default_factory=dict)

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key)

    def path(self, key: str) -> Path | None:
        """A path key, resolved against the folder of the pyproject.toml that set it."""
        setting = self.settings.get(key)
        if setting is None or self.file is None:
            return None
        return self.file.parent / str(setting.value)


def split_names(values: Iterable[str]) -> list[str]:
    """`["cpu,cuda", "mps"]` → `["cpu", "cuda", "mps"]`: names separated by commas or whitespace."""
    return [name for v in values for name in re.split(r"[\s,]+", v.strip()) if name]


def unknown(where: str, kind: str, value: str, known: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(value, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{where}: unknown {kind} {value!r}{hint}; expected one of {', '.join(known)}")


def check_devices(devices: list[str], where: str) -> list[str]:
    """Device type names (or `all` alone), as torch knows them."""
    from opcheck.runtime.devices import known_device_types

    known = known_device_types()
    for d in devices:
        if d not in known and d != ALL_DEVICES:
            raise unknown(where, "device", d, (*known, ALL_DEVICES))
    if ALL_DEVICES in devices:
        if len(devices) > 1:
            others = ", ".join(d for d in devices if d != ALL_DEVICES)
            raise ConfigError(
                f"{where}: {ALL_DEVICES!r} already means every device type; drop {others} or {ALL_DEVICES!r}"
            )
        return [ALL_DEVICES]
    return devices


def check_dtypes(dtypes: list[str], where: str) -> list[str]:
    """dtype names, or `all` alone, which selects every dtype as no list does (returned as [])."""
    from opcheck.spec.model import TENSOR_DTYPES

    for d in dtypes:
        if d not in TENSOR_DTYPES and d != ALL_DTYPES:
            raise unknown(where, "dtype", d, (*TENSOR_DTYPES, ALL_DTYPES))
    if ALL_DTYPES in dtypes:
        if len(dtypes) > 1:
            others = ", ".join(d for d in dtypes if d != ALL_DTYPES)
            raise ConfigError(f"{where}: {ALL_DTYPES!r} already means every dtype; drop {others} or {ALL_DTYPES!r}")
        return []
    return dtypes


def check_policy(policy: str, where: str) -> str:
    if policy not in POLICIES:
        raise unknown(where, "policy", policy, POLICIES)
    return policy


def check_threads(raw: object, where: str) -> int | None:
    """A positive thread count, or None for `keep` (torch's own setting)."""
    text = str(raw).strip().lower()
    if text == THREADS_KEEP:
        return None
    if not isinstance(raw, bool) and text.isdigit() and int(text) > 0:
        return int(text)
    raise ConfigError(f"{where}: expected a positive number of threads or {THREADS_KEEP!r}, got {raw!r}")


_DURATION = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>s|m|min|h)?")
_UNIT_SECONDS = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def check_time_budget(raw: object, where: str) -> float | None:
    """Seconds a generated test may run: a positive number (`90`, `2.5`), or one with a unit (`90s`,
    `10m`, `1h`); None for `off` or 0 (no budget)."""
    expected = f"expected a number of seconds (e.g. 600, 90s, 10m) or {TIME_BUDGET_OFF!r}, got {raw!r}"
    if isinstance(raw, bool):
        raise ConfigError(f"{where}: {expected}")
    text = str(raw).strip().lower()
    if text in (TIME_BUDGET_OFF, "0", "0.0"):
        return None
    found = _DURATION.fullmatch(text)
    if found is None:
        raise ConfigError(f"{where}: {expected}")
    seconds = float(found["number"]) * _UNIT_SECONDS[found["unit"]]
    if seconds == 0:
        return None
    return seconds


def check_isolation(raw: object, where: str) -> str:
    if not isinstance(raw, str) or raw not in ISOLATION_MODES:
        raise unknown(where, "isolation", str(raw), ISOLATION_MODES)
    return raw


def check_budget(raw: object, where: str) -> int:
    """A positive number of Jacobian entries: 1048576, "2**20", "1e6", "4M", "512k"."""
    from opcheck.runtime.context import parse_budget

    if isinstance(raw, bool):
        raise ConfigError(
            f"{where}: expected a positive number of Jacobian entries (e.g. 1048576, 2**20, 1M), got {raw!r}"
        )
    try:
        return parse_budget(str(raw), where=where)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def compile_default(project: ProjectConfig) -> bool:
    """`compile`: whether a spec without a `compile:` key gets `compile` tests (validated by `read`)."""
    setting = project.get("compile")
    return setting is not None and setting.value is True


def with_compile_default(specs: Iterable[OpSpec], project: ProjectConfig) -> list[OpSpec]:
    """The specs as the project's `compile` setting makes them: with it true, each spec without a
    `compile:` key (OpSpec.compile None) gets the block's defaults; a spec's own key always wins."""
    from dataclasses import replace

    from opcheck.spec.model import CompileFlags

    if not compile_default(project):
        return list(specs)
    return [spec if spec.compile is not None else replace(spec, compile=CompileFlags()) for spec in specs]


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start` that has a `[tool.opcheck]` table."""
    folder = Path(os.path.abspath(start))
    if not folder.is_dir():
        folder = folder.parent
    for candidate in (folder, *folder.parents):
        path = candidate / PYPROJECT
        if path.is_file() and _has_table(path):
            return path
    return None


def _has_table(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return re.search(r"^\s*\[\s*tool\s*\.\s*opcheck\s*\]", text, re.M) is not None or "opcheck" in _tool_keys(text)


def _tool_keys(text: str) -> set[str]:
    try:
        tool = tomllib.loads(text).get("tool", {})
    except tomllib.TOMLDecodeError:
        return set()
    return set(tool) if isinstance(tool, dict) else set()


def load(start: Path) -> ProjectConfig:
    """The `[tool.opcheck]` table of the nearest pyproject.toml at or above `start` that has one, validated."""
    path = find_pyproject(start)
    return ProjectConfig() if path is None else read(path)


def read(path: Path) -> ProjectConfig:
    """`path`'s `[tool.opcheck]` table, each key checked for its type and its value."""
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except OSError as e:
        raise ConfigError(f"{_shown(path)}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{_shown(path)}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{_shown(path)}: not valid TOML: {e}") from None
    table = data.get("tool", {}).get("opcheck", {})
    lines = text.splitlines()
    header = _header_line(lines)
    if not isinstance(table, dict):
        raise ConfigError(f"{_shown(path)}:{header}: tool.opcheck must be a table ({TABLE}), got {table!r}")
    settings = {}
    for key, value in table.items():
        setting = Setting(key, value, path, _key_line(lines, header, key))
        if key not in KEYS:
            raise unknown(f"{_shown(path)}:{setting.line}: {TABLE}", "key", key, KEYS)
        _check(setting)
        settings[key] = setting
    return ProjectConfig(path, settings)


def _check(setting: Setting) -> None:
    key, value, where = setting.key, setting.value, setting.where
    if key in PATH_KEYS:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: expected a path (a non-empty string), got {value!r}")
    elif key in LIST_KEYS:
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) for v in values):
            raise ConfigError(f"{where}: expected a list of names or one string of names, got {value!r}")
        (check_devices if key == "device" else check_dtypes)(setting.names, where)
    elif key == "policy":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected one of {', '.join(POLICIES)}, got {value!r}")
        check_policy(value, where)
    elif key == "budget":
        if not isinstance(value, (int, str)):
            raise ConfigError(f'{where}: expected a number of Jacobian entries (e.g. 1048576 or "4M"), got {value!r}')
        check_budget(value, where)
    elif key == "threads":
        if not isinstance(value, (int, str)):
            raise ConfigError(f"{where}: expected a positive number of threads or {THREADS_KEEP!r}, got {value!r}")
        check_threads(value, where)
    elif key == "time_budget":
        if not isinstance(value, (int, float, str)):
            raise ConfigError(f"{where}: expected a number of seconds or {TIME_BUDGET_OFF!r}, got {value!r}")
        check_time_budget(value, where)
    elif key == "isolation":
        check_isolation(value, where)
    elif key in BOOL_KEYS and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _header_line(lines: list[str]) -> int:
    for number, line in enumerate(lines, start=1):
        if re.match(r"\s*\[\s*tool\s*\.\s*opcheck\s*\]", line):
            return number
    return 1  # a dotted key or an inline table: the keys are searched from the top


def _key_line(lines: list[str], header: int, key: str) -> int:
    """The line that sets `key` in the table (TOML parsers give no positions); else the header's."""
    pattern = re.compile(rf"""\s*(?:opcheck\s*\.\s*)?(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*=""")
    for number in range(header, len(lines) + 1):
        line = lines[number - 1]
        if number > header and re.match(r"\s*\[", line):
            break
        if pattern.match(line):
            return number
    return header


def _shown(path: Path) -> str:
    """A path as the user reads it: relative to the working directory where it is below it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else Path(relative).as_posix()
