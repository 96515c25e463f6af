"""`opinfo: name[:variant]` samples: every SampleInput of a torch OpInfo, as calls of the spec's op.

op_db lives in torch.testing._internal, which imports the expecttest package: opcheck depends on
it, and where it is missing all the same (an install without dependencies) the tests skip with a
reason. torch.testing._internal imports pytest too: it is imported only when an `opinfo:` sample is
built, so that the rest of the runtime runs without pytest. OpInfo's sample_inputs draw from
torch's global RNG, so they run under torch.random.fork_rng seeded with the test's seed: the same
id gives the same samples.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from functools import lru_cache

import torch

from opcheck.runtime.call import Call, describe_call
from opcheck.runtime.outcomes import CheckSkipped


@lru_cache(maxsize=1)
def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def find_opinfo(ref: str):
    try:
        import expecttest  # noqa: F401  (torch.testing._internal imports it)
    except ImportError:
        raise CheckSkipped(
            f"opinfo: {ref} needs the expecttest package (pip install expecttest), which is not installed"
        ) from None
    name, _, variant = ref.partition(":")
    db = _op_db()
    for info in db:
        if info.name == name and (info.variant_test_name or "") == variant:
            return info
    known = sorted({f"{i.name}:{i.variant_test_name}" if i.variant_test_name else i.name for i in db})
    close = difflib.get_close_matches(ref, known, n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise LookupError(f"opinfo: no OpInfo named {ref!r} in torch's op_db{hint}")


def opinfo_calls(ref: str, op: Callable, device: str, dtype: torch.dtype, seed: int) -> list[Call]:
    info = find_opinfo(ref)
    devices: list[int] | None = [] if device == "cpu" else None
    kwargs = {"device_type": device} if device not in ("cpu", "cuda") else {}
    with torch.random.fork_rng(devices=devices, **kwargs):
        torch.manual_seed(seed)
        samples = list(info.sample_inputs(device, dtype, requires_grad=True))
    calls = []
    for i, s in enumerate(samples):
        args = [s.input, *s.args]
        wrapped = _wrapper(info, op)
        calls.append(
            Call(
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
