"""What `opcheck capture` prints after the command: per op, what was recorded, kept, dropped and
written where, and what to run next; and its exit status: the command's where it failed (what it
recorded before is written all the same), else 1 where an op's spec could not be written or
nothing was written, else 0."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from opcheck.capture.command import Command
from opcheck.capture.run import Outcome


def summary(outcome: Outcome, command: Command, out_folder: str) -> tuple[str, int]:
    lines = ["", f"opcheck capture: `{command.shown()}` exited with status {outcome.exit_status}"]
    if command.interpreter:
        lines.append(
            f"  (it ran under {sys.executable}, the Python opcheck runs in; `{command.interpreter}` is another)"
        )
    written_any = False
    next_tests = []
    for op in outcome.ops:
        lines.append(f"{op.path}: {op.calls} call(s), {op.distinct} distinct")
        if op.error:
            lines.append(f"  not written: {op.error.removeprefix('opcheck capture: ')}")
        for note in op.notes:
            lines.append(f"  note: {note}")
        if op.file is not None and op.written:
            written_any = True
            verb = "wrote" if op.created else "added to"
            lines.append(f"  {verb} {_shown(op.file)}: {', '.join(op.written)}")
            replaced = [name for name in op.replaced if name in op.written]
            if replaced:
                lines.append(f"  replaced capture's own earlier sample(s), unedited since: {', '.join(replaced)}")
            next_tests.append(f"{out_folder}/test_{op.spec_name}.py")
        for f in op.values_files:
            lines.append(f"  values: {_shown(f)}")
        for s in op.skipped:
            lines.append(f"  not written: {s}")
        for d in op.dropped:
            lines.append(f"  dropped: {d}")
    for text in outcome.unseen:
        lines.append(f"{text}: no call recorded")
        if text in outcome.hidden_by_compile:
            lines.append(
                f"  the run compiled {outcome.compiled} frame(s) with torch.compile, whose graphs run what "
                f"{text} does without calling it: rerun with TORCHDYNAMO_DISABLE=1 (compile off) to record its calls"
            )
    if written_any:
        lines.append(
            "next: review the samples, then opcheck validate && opcheck generate && pytest " + " ".join(next_tests)
        )
    else:
        lines.append("nothing written")
    failed = [op.path for op in outcome.ops if op.error]
    status = 0 if written_any and not failed else 1
    if failed:
        lines.append(f"exit status 1: the spec of {', '.join(failed)} could not be written (above)")
    if outcome.exit_status:  # what it recorded up to then is written all the same
        status = outcome.exit_status if 0 < outcome.exit_status < 256 else 1
        lines.append(
            f"exit status {status}: the command failed (status {outcome.exit_status}); "
            + ("the calls it made before are written above" if written_any else "nothing was written")
        )
    return "\n".join(lines) + "\n", status


def _shown(path: Path) -> str:
    try:
        return Path(os.path.relpath(path)).as_posix()
    except ValueError:
        return str(path)
