"""Writes the values files of the invalid-spec corpus's `values_file_*` cases (committed bytes).

    python tests/spec/invalid/make_values_files.py

Each file is a few KiB at most; each case's YAML says which call here made its files. Rerunning
rewrites them (torch.save's bytes differ from run to run: a zip archive records a serialization
id), and the pinned .expected files stay the same.
"""

from __future__ import annotations

import builtins
import pickle
from pathlib import Path

import torch

HERE = Path(__file__).parent
RAN = "opcheck-values-file-ran"
"""What the hostile pickle would print if anything ever called what it names."""


class PrintsWhenLoaded:
    """A pickle whose loading would call builtins.print: a harmless global outside torch's
    weights-only allowlist."""

    def __reduce__(self):
        return (builtins.print, (RAN,))


def _save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


def main() -> None:
    mismatch = HERE / "values_file_mismatch" / "values"
    _save(torch.arange(6).reshape(2, 3), mismatch / "ints.pt")  # int64 [2, 3]
    _save(torch.zeros(2, 3, dtype=torch.float64), mismatch / "floats.pt")  # float64 [2, 3]

    hostile = HERE / "values_file_not_weights_only" / "values"
    hostile.mkdir(parents=True, exist_ok=True)
    # Protocol 2: torch's weights-only unpickler refuses the FRAME opcode of later protocols
    # before it reaches the global, which would make a less interesting case.
    (hostile / "prints.pt").write_bytes(pickle.dumps(PrintsWhenLoaded(), protocol=2))
    _save(PrintsWhenLoaded(), hostile / "saved_prints.pt")  # the same pickle in torch.save's zip archive

    dicts = HERE / "values_file_dict" / "values"
    _save({"args.0": torch.zeros(2, 3), "args.1": torch.ones(3), "meta": 3}, dicts / "sample.pt")
    _save(torch.zeros(3), dicts / "one.pt")

    _save(torch.zeros(3), HERE / "values_file_exclusive" / "values" / "one.pt")

    kinds = HERE / "values_file_tensor_kinds" / "values"
    _save(torch.eye(3).to_sparse(), kinds / "coo.pt")
    _save(torch.empty(3, 3, device="meta"), kinds / "meta.pt")
    _save(torch.quantize_per_tensor(torch.ones(3, 3), 0.1, 0, torch.quint8), kinds / "quantized.pt")
    _save([torch.zeros(3, 3)], kinds / "list.pt")


if __name__ == "__main__":
    main()
