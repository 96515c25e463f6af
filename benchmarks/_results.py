"""The benchmarks' raw results: one JSON file per run, headed by what reproduces it."""

from __future__ import annotations

import json
from typing import Any

import torch


def write_json(path: str, command: str, threads: int, **content: Any) -> None:
    """Write the run's command, torch's version and thread count, then `content`, to `path` (values
    JSON cannot hold as their str), and say where."""
    with open(path, "w") as f:
        json.dump(
            {"command": command, "torch": torch.__version__, "threads": threads, **content}, f, indent=1, default=str
        )
    print(f"raw results written to {path}")
