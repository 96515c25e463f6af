"""The spec's names of the tensors the engine numbers: its "input 2" is the third tensor that
requires grad, which is `args[3]` when `args[2]` is null, or a keyword argument.

The engine's words stay as they are (the first line keeps torch's, which `match=` patterns rely
on); a failure adds one line that names, in the spec's words, each input the report mentions (the
engine says which: opcheck.failure_facts.FailureFacts.inputs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


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


def spec_names_line(inputs: Iterable[int], names: list[str]) -> str | None:
    """`(input 1 is args[3] in the spec)` for the inputs a report names (FailureFacts.inputs), or
    None when it names none, or each is simply the argument of the same position."""
    mentioned = sorted({i for i in inputs if 0 <= i < len(names)})
    if not mentioned or all(names[i] == f"args[{i}]" for i in mentioned):
        return None
    return "(" + ", ".join(f"input {i} is {names[i]}" for i in mentioned) + " in the spec)"


def with_spec_names(report: str, inputs: Iterable[int], names: list[str]) -> str:
    """The engine's report with the spec-names line after its first line."""
    line = spec_names_line(inputs, names)
    if line is None:
        return report
    first, newline, rest = report.partition("\n")
    return f"{first}\n{line}{newline}{rest}" if newline else f"{first}\n{line}"
