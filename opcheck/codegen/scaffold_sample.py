"""`opcheck new --sample NAME`: a sample already written in a spec for the op, to probe and to copy.

The sample is read through the spec loader (the spec validates first), from the spec file being
rewritten, else from another spec in the folder for the same op; it is written back as flow YAML
from the model, its `values_file` relative to the new spec's folder.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GivenSample:
    """A sample's arguments as spec text (`args` items, `kwargs` entries) and as model values."""

    args: list[str]
    kwargs: list[str]
    values: tuple[Any, ...]
    keywords: tuple[tuple[str, Any], ...]
    source: str  # where it was read, for the spec's comment


def find_sample(sample: str, *, op: str, name: str, path: Path, root: Path) -> GivenSample:
    """Sample `sample` of the spec at `path`, else of a spec in its folder that tests `op`."""
    from opcheck.spec import SpecError
    from opcheck.spec.loader import load_spec_text

    folder = path.parent
    files = [path] if path.is_file() else []
    files += sorted(f for f in folder.glob("*.y*ml") if f != path and f.is_file()) if folder.is_dir() else []
    for file in files:
        source = Path(os.path.relpath(file.resolve(), root.resolve())).as_posix()
        try:
            specs = load_spec_text(file.read_text(encoding="utf-8"), source=source, root=root)
        except (SpecError, OSError, UnicodeDecodeError):
            continue  # `opcheck validate` says what is wrong with it
        for spec in specs:
            if spec.op != op and not (file == path and spec.name == name):
                continue
            for found in spec.samples:
                if found.name == sample and found.generator is None and found.opinfo is None:
                    return GivenSample(
                        args=[arg_text(a, folder, root) for a in found.args],
                        kwargs=[f"{k}: {arg_text(v, folder, root)}" for k, v in found.kwargs],
                        values=found.args,
                        keywords=found.kwargs,
                        source=f"{found.location.file}:{found.location.line}",
                    )
    raise ValueError(
        f"--sample {sample}: no valid spec in {folder.as_posix()} for {op} has a sample of that name "
        "with args or kwargs (`opcheck validate` reports a spec that does not load)"
    )


def arg_text(arg: Any, folder: Path, root: Path) -> str:
    """One argument of the model as flow YAML the spec loader reads back the same."""
    from opcheck.spec.model import DtypeArg, TensorArg, TensorListArg, TupleArg

    if isinstance(arg, TensorArg):
        return "{" + ", ".join(_tensor_fields(arg, folder, root)) + "}"
    if isinstance(arg, TensorListArg):
        return "[" + ", ".join(arg_text(a, folder, root) for a in arg.items) + "]"
    if isinstance(arg, TupleArg):
        return "{tuple: [" + ", ".join(arg_text(a, folder, root) for a in arg.items) + "]}"
    if isinstance(arg, DtypeArg):
        return "{dtype: " + arg.name + "}"
    return _literal(arg)


def _tensor_fields(arg: Any, folder: Path, root: Path) -> list[str]:
    fields = []
    for f in dataclasses.fields(arg):
        value = getattr(arg, f.name)
        if f.name != "shape" and value == f.default:
            continue
        if f.name == "values_file":
            value = Path(os.path.relpath((root / value).resolve(), folder.resolve())).as_posix()
        fields.append(f"{f.name}: {_literal(value)}")
    return fields


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted YAML scalar
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    raise ValueError(f"--sample: cannot write {value!r} back as YAML")
