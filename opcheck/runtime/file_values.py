"""A TensorArg's values from its `values_file`, when a test runs.

The file was checked when the spec was validated, but it may have changed since: it is read and
checked again (opcheck.spec.values_file), and anything that no longer fits the spec is a
SampleError naming the file. Reads are cached per process, keyed by the file's resolved path,
modification time and size, so a sample's tests read a file once while it stays the same; every
caller gets its own copy, so a test that writes into its tensor changes no other test's values.
Paths are resolved against opcheck.runtime.project_root.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch

from opcheck.runtime.makers import SampleError
from opcheck.runtime.project_root import project_root
from opcheck.spec import values_file
from opcheck.spec.model import TensorArg

CACHED_FILES = 16
"""Files whose contents a process keeps (the most recently used)."""

_cache: OrderedDict[tuple[str, int, int], Any] = OrderedDict()


def file_values(arg: TensorArg, dtype: torch.dtype) -> torch.Tensor:
    """The values of `arg`'s file at `dtype`, on the CPU, contiguous, in a tensor of their own."""
    path = arg.values_file
    if path is None:
        raise ValueError("file_values needs a TensorArg with a values_file")
    where = f"values_file {values_file.show_text(path)}"
    if arg.is_sparse:
        raise SampleError(f"{where}: a values file gives a strided tensor, and `layout` is {arg.layout}")
    try:
        tensor = values_file.pick(_read(path), arg.values_key)
    except values_file.ValuesFileError as e:
        if e.missing:
            raise SampleError(f"{where}: no such file (relative to the project root {project_root()})") from None
        raise SampleError(f"{where}: {e}") from None
    problem = values_file.mismatch(tensor, arg.shape, arg.dtype)
    if problem:
        entry = "" if arg.values_key is None else f"[{values_file.show_text(repr(arg.values_key))}]"
        raise SampleError(
            f"{where}{entry}: {problem}; the file changed after the spec was validated: save values "
            "that fit the spec, or change the spec to fit them and run `opcheck generate`"
        )
    if tensor.is_complex() and not dtype.is_complex:
        raise SampleError(
            f"{where}: it holds complex values, and this test's dtype is {str(dtype).removeprefix('torch.')}, "
            "which would drop their imaginary parts; list only complex dtypes for this spec, or save real values"
        )
    return tensor.detach().to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)


def _read(path: str) -> Any:
    root = project_root()
    full = root / path
    try:
        info = os.stat(full)
        key = (os.path.realpath(full), info.st_mtime_ns, info.st_size)
    except (OSError, ValueError):
        return values_file.read(root, path)  # which says what is wrong
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    loaded = values_file.read(root, path)
    _cache[key] = loaded
    while len(_cache) > CACHED_FILES:
        _cache.popitem(last=False)
    return loaded


def clear_cache() -> None:
    """Forget every file read (for tests)."""
    _cache.clear()
