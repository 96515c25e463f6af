"""`opinfo: name[:variant]` samples: every SampleInput of a torch OpInfo, as calls of the spec's op.

op_db lives in torch.testing._internal, which imports the expecttest package: opcheck depends on
it, and where it is missing all the same (an install without dependencies) the tests skip with a
reason. torch.testing._internal imports pytest too: it is imported only when an `opinfo:` sample is
built (opcheck.spec.opinfo_db, the lookup every reader of op_db shares), so that the rest of the
runtime runs without pytest. OpInfo's sample_inputs draw from torch's global RNG, so they run under
torch.random.fork_rng seeded with the test's seed: the same id gives the same samples.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from opcheck.runtime.call import SampleCall, describe_call
from opcheck.runtime.devices import seed_global
from opcheck.runtime.outcomes import CheckSkipped
from opcheck.spec.opinfo_db import EXPECTTEST_MISSING, OpInfoUnavailable, UnknownOpInfo, find_entry


def find_opinfo(ref: str):
    """The entry an `opinfo:` sample names (`name` or `name:variant`).

    CheckSkipped where expecttest is missing, LookupError (with suggestions) for an unknown name.
    """
    try:
        return find_entry(ref)
    except OpInfoUnavailable as e:
        if e.needs_expecttest:
            raise CheckSkipped(f"opinfo: {ref} {EXPECTTEST_MISSING}") from None
        raise
    except UnknownOpInfo as e:
        raise LookupError(f"opinfo: {e}") from None


def opinfo_calls(ref: str, op: Callable, device: str, dtype: torch.dtype, seed: int) -> list[SampleCall]:
    info = find_opinfo(ref)
    devices: list[int] | None = [] if device == "cpu" else None
    kwargs = {"device_type": device} if device not in ("cpu", "cuda") else {}
    with torch.random.fork_rng(devices=devices, **kwargs):
        seed_global(device, seed)
        samples = list(info.sample_inputs(device, dtype, requires_grad=True))
    calls = []
    for i, s in enumerate(samples):
        args = [s.input, *s.args]
        wrapped = _wrapper(info, op)
        calls.append(
            SampleCall(
                wrapped,
                args,
                dict(s.kwargs),
                label=f"OpInfo {ref!r} sample {i} of {len(samples)}",
                post=s.output_process_fn_grad,
                description=describe_call(args, dict(s.kwargs)),
            )
        )
    return calls


def _wrapper(info, op):
    def call(*args, **kwargs):
        return info.gradcheck_wrapper(op, *args, **kwargs)

    return call
