"""The spec's names of the tensors the engine numbers: its "input 2" is the third tensor that
requires grad, which is `args[3]` when `args[2]` is null, or a keyword argument.

The engine's words stay as they are (the first line keeps torch's, which `match=` patterns rely
on); a failure adds one line that names, in the spec's words, each input the report mentions.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_INPUT = re.compile(r"\binputs? (\d+)\b")


def gradcheck_input_names(args: list[Any], kwargs: dict[str, Any]) -> list[str]:
    """The spec's name of each tensor requiring grad, in the order gradcheck is given them
    (opcheck.runtime.call.SampleCall.gradcheck_inputs: args, then kwargs, inside lists and tuples)."""
    names: list[str] = []

    def visit(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                names.append(name)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{name}[{i}]", item)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(f"{name}.{key}", item)

    for i, arg in enumerate(args):
        visit(f"args[{i}]", arg)
    for key, arg in kwargs.items():
        visit(f"kwargs.{key}", arg)
    return names


_GRADIENT_OF_INPUT = re.compile(r"\bgradient of input (\d+)\b")
"""The low-precision check's words for an input counted among those that require grad (its other
mentions, such as "wrote into its input 2", count every input and are left alone)."""


def spec_names_line(report: str, names: list[str], pattern: re.Pattern[str] = _INPUT) -> str | None:
    """`(input 1 is args[3] in the spec)` for the inputs `report` mentions (as `pattern` finds them),
    or None when it mentions none, or each is simply the argument of the same position."""
    mentioned = sorted({int(m) for m in pattern.findall(report) if int(m) < len(names)})
    if not mentioned or all(names[i] == f"args[{i}]" for i in mentioned):
        return None
    return "(" + ", ".join(f"input {i} is {names[i]}" for i in mentioned) + " in the spec)"


def with_spec_names(report: str, names: list[str], pattern: re.Pattern[str] = _INPUT) -> str:
    """The engine's report with the spec-names line after its first line."""
    line = spec_names_line(report, names, pattern)
    if line is None:
        return report
    first, newline, rest = report.partition("\n")
    return f"{first}\n{line}{newline}{rest}" if newline else f"{first}\n{line}"


def with_lowprec_spec_names(report: str, names: list[str]) -> str:
    """The low-precision check's report with the spec-names line for its "gradient of input N"."""
    return with_spec_names(report, names, _GRADIENT_OF_INPUT)
