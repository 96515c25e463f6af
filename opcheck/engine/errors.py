"""The engine's error type, and the notes its failures add after torch's words (torch_words.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.autograd.gradcheck import GradcheckError as _TorchGradcheckError

from opcheck.engine.reporting import torch_words
from opcheck.failure_facts import FailureFacts

if TYPE_CHECKING:
    from opcheck.engine.reporting.diagnostics import BlockMismatch


class GradcheckError(_TorchGradcheckError):
    """A gradient check failed.

    The first line of the message is torch.autograd.gradcheck's own wording; the lines after it
    localize the failure. Programs read the attributes instead of parsing the text:

    - `check`: which check failed ("backward", "forward AD", "batched backward", ...)
    - `path`: the derivative path, e.g. "VJP", "JVP", "VJP of VJP", "JVP of VJP"
    - `mismatch`: an `opcheck.engine.reporting.diagnostics.JacobianMismatch` for Jacobian comparisons (with
      the full analytical and numerical blocks as tensors), else None
    - `facts`: an `opcheck.failure_facts.FailureFacts`: the worst entry, the hints and the inputs the
      message names (a mismatch's own when not given)
    """

    def __init__(
        self,
        message: str,
        *,
        check: str = "",
        path: str = "",
        mismatch: BlockMismatch | None = None,
        facts: FailureFacts | None = None,
    ):
        super().__init__(message)
        self.check = check
        self.path = path
        self.mismatch = mismatch
        self.facts = facts if facts is not None else mismatch.facts() if mismatch is not None else FailureFacts()


def failed_nondet_note() -> str:
    """torch's note on nondeterministic ops, then what to pass."""
    return f"{torch_words.nondeterminism_note()} If so, pass nondet_tol=<tol> (in an op spec: gradcheck.nondet_tol)."


def failed_batched_grad_note() -> str:
    """torch's first line on a failed batched-gradient check, then what it means."""
    return (
        f"{torch_words.batched_note(forward=False)} vmap over the backward gives a different result from (or "
        "fails where) the one-at-a-time backward (does not). A backward that is not vmap-compatible (in-place "
        "writes into captured tensors, .item(), data-dependent control flow) is the usual cause; make it "
        "vmap-compatible or pass check_batched_grad=False."
    )


def failed_batched_fwd_grad_note() -> str:
    """torch's first line on a failed batched forward-AD check, then what it means."""
    return (
        f"{torch_words.batched_note(forward=True)} vmap over the JVP differs from (or fails where) the "
        "one-at-a-time JVP (does not). Make the jvp vmap-compatible or pass check_batched_forward_grad=False."
    )


def fast_fail_slow_ok_note(mode: str = "Fast") -> str:
    """torch's first sentence on a fast-mode failure whose full block matches (`mode` names the
    mode that failed), then what it means."""
    sentence = torch_words.fast_mode_slow_ok()
    if mode != "Fast" and sentence.startswith("Fast "):
        sentence = mode + sentence[len("Fast") :]
    return (
        f"{sentence} The full Jacobian block above matches within atol/rtol, so fast_mode=False would pass this check."
    )
