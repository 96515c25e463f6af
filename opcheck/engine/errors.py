"""The engine's error type and the torch wording it keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.autograd.gradcheck import GradcheckError as _TorchGradcheckError

if TYPE_CHECKING:
    from opcheck.engine.diagnostics import BlockMismatch


class GradcheckError(_TorchGradcheckError):
    """A gradient check failed.

    The first line of the message is torch.autograd.gradcheck's own wording; the lines after it
    localize the failure. Programs read the attributes instead of parsing the text:

    - `check`: which check failed ("backward", "forward AD", "batched backward", ...)
    - `path`: the derivative path, e.g. "VJP", "JVP", "VJP of VJP", "JVP of VJP"
    - `mismatch`: an `opcheck.engine.diagnostics.JacobianMismatch` for Jacobian comparisons (with
      the full analytical and numerical blocks as tensors), else None
    """

    def __init__(self, message: str, *, check: str = "", path: str = "", mismatch: BlockMismatch | None = None):
        super().__init__(message)
        self.check = check
        self.path = path
        self.mismatch = mismatch


FAILED_NONDET_NOTE = (
    "If the op relies on non-deterministic kernels (e.g. atomic adds in index_add/scatter_add on "
    "CUDA), pass nondet_tol=<tol> (in an op spec: gradcheck.nondet_tol)."
)

FAILED_BATCHED_GRAD_NOTE = (
    "gradcheck or gradgradcheck failed while testing batched gradient computation: vmap over the "
    "backward gives a different result from (or fails where) the one-at-a-time backward (does not). "
    "A backward that is not vmap-compatible (in-place writes into captured tensors, .item(), data-"
    "dependent control flow) is the usual cause; make it vmap-compatible or pass "
    "check_batched_grad=False."
)

FAILED_BATCHED_FWD_GRAD_NOTE = (
    "gradcheck failed while testing batched gradient computation with forward-mode AD: vmap over the "
    "JVP differs from (or fails where) the one-at-a-time JVP (does not). Make the jvp vmap-compatible "
    "or pass check_batched_forward_grad=False."
)

FAST_FAIL_SLOW_OK_NOTE = (
    "Fast gradcheck failed but element-wise differences are small: the full Jacobian block above "
    "matches within atol/rtol, so fast_mode=False would pass this check."
)
