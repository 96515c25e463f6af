"""The project root the runtime resolves a spec's files against (`values_file:` paths).

The model keeps every path relative to the project root (the folder spec sources are relative
to). Whoever runs generated tests says where that is: the pytest plugin, per generated test (the
folder it also puts on sys.path), and the `opcheck` command. Unset, it is the working directory.
Nothing here imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

_root: Path | None = None


def set_project_root(path: str | os.PathLike[str] | None) -> None:
    """Resolve spec paths against `path` from now on (None: the working directory again)."""
    global _root
    _root = Path(os.path.abspath(path)) if path is not None else None


def project_root() -> Path:
    """The folder spec paths are relative to: as last set, else the working directory."""
    return _root if _root is not None else Path.cwd()
