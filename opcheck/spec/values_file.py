"""`values_file:` a tensor's values read from a file torch.save wrote, beside the specs.

Shared by validation (opcheck.spec.samples, once per file and load) and the runtime
(opcheck.runtime.file_values, which reads the file again when a test runs: it may have changed).
Paths are posix and relative: a spec writes one relative to its own folder, the model keeps it
relative to the project root (`project_path`), and neither may lead out of the project.

Reading never runs code from the file: torch.load with weights_only=True, which unpickles
tensors, containers and numbers only, refuses any other global before it is called. Files larger
than MAX_FILE_BYTES are refused before torch sees them. This module imports torch only when a file
is read.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import warnings
import zipfile
from pathlib import Path, PureWindowsPath
from typing import Any

from opcheck.spec import model
from opcheck.spec.problems import did_you_mean, show

MAX_FILE_BYTES = 256 * 2**20
"""The largest values file read (on disk, and unpacked for a zip archive): 256 MiB."""
SHOWN_KEYS = 5
"""How many of a dict's keys a message lists."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Lines of torch.load's weights-only message that say what to do rather than what is wrong.
_ADVICE = ("Weights only load failed", "(1)", "(2)", "Check the documentation", "In PyTorch 2.6")
_REASON_MARK = "WeightsUnpickler error:"


class ValuesFileError(Exception):
    """A values file that cannot give the tensor: `reason` says why, without naming the file
    (the caller does, as its reader knows it). `missing`: there is no such file; `about_key`:
    the problem is with `values_key`."""

    def __init__(self, reason: str, *, missing: bool = False, about_key: bool = False):
        super().__init__(reason)
        self.reason, self.missing, self.about_key = reason, missing, about_key


class ValuesFiles:
    """The values files one load of specs reads, each read once, whatever number of tensors
    name it (validation; the runtime keeps its own cache)."""

    def __init__(self, root: Path):
        self.root = root
        self._read: dict[str, tuple[Any, ValuesFileError | None]] = {}

    def tensor(self, path: str, key: str | None) -> Any:
        """The tensor at `path` (relative to the root) and `key`; ValuesFileError otherwise."""
        if path not in self._read:
            try:
                self._read[path] = (read(self.root, path), None)
            except ValuesFileError as e:
                self._read[path] = (None, e)
        loaded, error = self._read[path]
        if error is not None:
            raise ValuesFileError(error.reason, missing=error.missing, about_key=error.about_key)
        return pick(loaded, key)


# -- paths (no torch) ---------------------------------------------------------------------------


def spec_folder(source: str) -> str:
    """The folder of a spec, relative to the project root, as messages show it (`op_specs/`)."""
    return (posixpath.dirname(source) or ".") + "/"


def project_path(written: str, source: str) -> str:
    """The path of the values file written in the spec at `source` (both relative: `written` to
    the spec's folder, `source` to the project root), relative to the project root, normalized.

    ValueError, with the message a spec problem gives, for an absolute path, a backslash, and a
    path that leads out of the project.
    """
    folder = spec_folder(source)
    if "\\" in written:
        raise ValueError(f"expected a path with / as the separator, got {show(written)}")
    if written.startswith("/") or PureWindowsPath(written).drive:
        raise ValueError(
            f"expected a path relative to the spec's folder ({folder}), got the absolute path {show(written)}"
        )
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(source), written))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        raise ValueError(
            f"expected a path inside the project, got {show(written)}, which leads out of the project root "
            f"(from {folder})"
        )
    return joined


# -- reading ------------------------------------------------------------------------------------


def read(root: Path, path: str) -> Any:
    """What the file at `path` (relative to `root`, as project_path gives it) holds, loaded on the
    CPU by torch.load with weights_only=True; ValuesFileError where it cannot be read or torch
    refuses it."""
    full = root / path
    try:
        info = os.stat(full)
        inside = _inside(os.path.realpath(full), os.path.realpath(root))
    except FileNotFoundError:
        raise ValuesFileError("no such file", missing=True) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise ValuesFileError(f"cannot read it: {getattr(e, 'strerror', None) or e}") from None
    if not inside:
        raise ValuesFileError("a link leads it out of the project root; values files live inside the project")
    if not stat.S_ISREG(info.st_mode):
        raise ValuesFileError("not a regular file")
    _check_size(full, info.st_size)
    import torch  # only specs and tests that name a values file pay for it here

    try:
        with warnings.catch_warnings():  # e.g. a pickle protocol torch does not expect: the error says it
            warnings.simplefilter("ignore")
            return torch.load(full, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValuesFileError(f"torch.load(weights_only=True) cannot load it: {load_reason(e)}") from None


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # another drive on Windows
        return False


def _check_size(full: Path, size: int) -> None:
    limit = f"a values file may have at most {MAX_FILE_BYTES} bytes"
    if size > MAX_FILE_BYTES:
        raise ValuesFileError(f"it has {size} bytes; {limit}")
    try:
        with zipfile.ZipFile(full) as archive:  # torch.save's format: what its records unpack to counts
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # not a zip archive (an older torch.save format, or no torch file): torch.load says
    if unpacked > MAX_FILE_BYTES:
        raise ValuesFileError(f"its records unpack to {unpacked} bytes; {limit}")


def load_reason(e: BaseException) -> str:
    """The first line of what torch.load says is wrong: of a weights-only refusal, its reason
    without torch's advice; of any other error, the first line, after the error's type unless
    it is a RuntimeError (torch's own). Terminal colours and control characters are left out."""
    lines = [line.strip() for line in _ANSI.sub("", str(e)).splitlines()]
    lines = [line for line in lines if line]
    if lines and lines[0].startswith(_ADVICE[0]):
        for line in lines:
            if _REASON_MARK in line:
                line = line.split(_REASON_MARK, 1)[1].strip()
                if not line:
                    continue  # the reason is on a line of its own below
            elif line.startswith(_ADVICE):
                continue
            return show_text(_first_sentence(line))
    if not lines:
        return f"{type(e).__name__} (the file ends early, or is empty)"
    first = show_text(_first_sentence(lines[0]))
    return first if type(e) is RuntimeError else f"{type(e).__name__}: {first}"


def _first_sentence(line: str) -> str:
    end = line.find(". ")
    return line[: end + 1] if end >= 0 else line


def show_text(text: str, limit: int = 200) -> str:
    """Text from a file or from torch, for a message: control characters escaped, length bounded."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


# -- the tensor ---------------------------------------------------------------------------------


def pick(loaded: Any, key: str | None) -> Any:
    """The tensor a values file gives for `values_key` (None: the file holds one tensor);
    ValuesFileError where the file holds something else or the key does not fit it."""
    import torch

    if isinstance(loaded, torch.Tensor):
        if key is not None:
            raise ValuesFileError("it holds a single tensor, not a dict: drop `values_key`", about_key=True)
        return loaded
    if not isinstance(loaded, dict):
        raise ValuesFileError(
            f"it holds {_kind(loaded)}; expected a tensor or a dict of tensors with string keys (torch.save of one)"
        )
    keys = list(loaded)
    odd = next((k for k in keys if not isinstance(k, str)), None)
    if odd is not None:
        raise ValuesFileError(
            f"it holds a dict with a key that is not a string ({_kind(odd)} {show_text(repr(odd), 40)}); "
            f"expected string keys"
        )
    if key is None:
        raise ValuesFileError(
            f"it holds a dict of {len(keys)} entries; name the one for this tensor with `values_key` "
            f"(keys: {_listed(keys)})"
        )
    if key not in loaded:
        raise ValuesFileError(
            f"it has no entry {show(key)}; its keys are {_listed(keys)}{did_you_mean(key, keys)}", about_key=True
        )
    entry = loaded[key]
    if not isinstance(entry, torch.Tensor):
        raise ValuesFileError(f"its entry {show(key)} is {_kind(entry)}, not a tensor", about_key=True)
    return entry


def mismatch(tensor: Any, shape: tuple[int, ...], dtype: str | None) -> str | None:
    """What about the tensor does not fit a TensorArg of `shape` and `dtype` (None: the test's
    dtype), or None when it fits."""
    kind = _unusable(tensor)
    if kind:
        return kind
    got = str(tensor.dtype).removeprefix("torch.")
    if tensor.numel() > model.MAX_TENSOR_ELEMENTS:
        return f"it has {tensor.numel()} elements; a tensor may have at most {model.MAX_TENSOR_ELEMENTS} (2**24)"
    if tuple(tensor.shape) != tuple(shape):
        return f"it has shape {list(tensor.shape)}, but `shape` is {list(shape)}"
    if dtype is not None and got != dtype:
        return f"it holds {got} values, but `dtype` is {dtype}"
    if dtype is None and not (tensor.is_floating_point() or tensor.is_complex()):
        return (
            f"it holds {got} values; without `dtype` the tensor takes the test's (floating-point) dtype, "
            f"so an integer or bool tensor needs `dtype: {got}`"
        )
    return None


def _unusable(tensor: Any) -> str | None:
    import torch

    if tensor.is_meta:
        return "it holds a meta tensor, which has no values"
    if tensor.is_quantized:
        return "it holds a quantized tensor; values files hold plain (strided) tensors"
    if getattr(tensor, "is_nested", False):
        return "it holds a nested tensor; values files hold plain (strided) tensors"
    if tensor.layout != torch.strided:
        return (
            f"it holds a {str(tensor.layout).removeprefix('torch.')} tensor; values files hold strided (dense) tensors"
        )
    return None


def _kind(value: Any) -> str:
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _listed(keys: list[str]) -> str:
    shown = ", ".join(show(k) for k in keys[:SHOWN_KEYS])
    more = len(keys) - SHOWN_KEYS
    return shown + (f" and {more} more" if more > 0 else "") if keys else "none"


# -- which files a spec names ---------------------------------------------------------------------


def named_paths(text: str, source: str) -> list[str]:
    """The values files a spec text names (every `values_file:` string in it, `defaults` of a
    family included), relative to the project root, without validating anything: what the
    generate cache fingerprints (opcheck.codegen.cache). Paths a spec may not name are left out."""
    from opcheck.spec.yamlload import load_yaml  # the runtime, which reads the files, reads no YAML

    root = load_yaml(text, source).root
    found: dict[str, None] = {}
    stack, seen = [root] if root is not None else [], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.is_map:
            written = node.value.get("values_file")
            if written is not None and isinstance(written.value, str):
                try:
                    found.setdefault(project_path(written.value, source))
                except ValueError:
                    pass
            stack.extend(reversed(list(node.value.values())))
        elif node.is_list:
            stack.extend(reversed(node.value))
    return list(found)
