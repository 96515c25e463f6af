"""What capture learns by running a new sample before writing it: the flags one probe of the first
sample says the op lacks, and each sample's estimated test cost on this machine's cpu (the cost
model `opcheck list --cost` uses, under the same settings: opcheck.runtime.cost.settings). What
those need (torch, the probes' warm-up) is prepared while the command runs (prepared_meanwhile)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opcheck.capture import render, select


@contextlib.contextmanager
def quiet_vmap() -> Iterator[None]:
    """torch.func.vmap's C++ warning for every operator without a batching rule (a custom op's),
    off while the probes run: the spec's flags say it once."""
    from torch._C import _functorch

    switch = getattr(_functorch, "_set_vmap_fallback_warning_enabled", None)  # private: absent, nothing to quiet
    if switch is None:
        yield
        return
    switch(False)
    try:
        yield
    finally:
        switch(True)


@contextlib.contextmanager
def prepared_meanwhile(estimating: bool) -> Iterator[None]:
    """While the command runs (in a child process, on a core of its own where the machine has two),
    a thread of this process imports what validating the spec and probing its samples need, torch
    first, and warms torch.func's transforms (`estimating`: those the cost estimates probe too): work
    the user otherwise waits for after the command. Joined on the way out, so that no other import
    of this process runs beside it."""
    import threading

    thread = threading.Thread(target=_prepare, args=(estimating,), name="opcheck-capture-prepare", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _prepare(estimating: bool) -> None:
    try:
        from opcheck.engine._util import load_forward_ad_decompositions
        from opcheck.engine.batching import warm_functorch
        from opcheck.runtime.cost import estimate, probe  # noqa: F401 - the probes' modules, the runtime's with them
        from opcheck.spec import loader  # noqa: F401 - validation's modules

        probe.warm()
        load_forward_ad_decompositions()  # as an estimate does before it probes
        if estimating:
            warm_functorch("vjp")  # gradgradcheck's function, which the estimates probe: imports torch._dynamo
    except BaseException:  # noqa: BLE001 - what fails here fails again where it is needed, and is reported there
        pass


def probe_flags(spec: Any) -> list[str]:
    """What one probe of the first sample (float64, cpu) says the op lacks, as spec lines."""
    from opcheck.runtime.cost.samples import SampleProbes
    from opcheck.spec.case import CaseId

    first = spec.samples[0].name
    case = CaseId(spec.name, "gradcheck", "cpu", spec.dtypes[0] if spec.dtypes else "float64", first)
    try:
        probe = SampleProbes(spec).first_order(case)[0]
        lines = []
        if probe.batched_backward is None:
            lines.append("gradcheck: {check_batched_grad: false}  # the probe's vmapped backward raised: no vmap rule")
        if probe.double_backward != "ok":
            lines.append("supports_gradgrad: false  # the probe's double backward raised or was not differentiable")
        if probe.jvp is None or not probe.jvp_right:
            lines.append("supports_forward_ad: false  # the probe's forward AD raised or gave no tangent")
    except Exception as e:  # the generated tests will say the same; the user reviews the spec
        first_line = (str(e).strip().splitlines() or [""])[0]
        lines = [f"# the probe of sample {first} raised {type(e).__name__}: {render._one_line(first_line)}"]
    return lines


Estimates = dict[str, list[tuple[str, str, Any]]]
"""Per sample name: (check, dtype, its Estimate) for each of its cpu tests."""


def estimates(spec: Any, names: set[str], settings: Any = None) -> Estimates:
    """The estimated cost on this machine's cpu of each test of the samples `names`, under `settings`
    (default: the project's, as `opcheck list --cost` takes them, so that the two say the same)."""
    from opcheck.runtime.cost.estimate import estimate
    from opcheck.runtime.cost.samples import SampleProbes
    from opcheck.spec.case import cases_of

    settings = settings or project_settings()
    probes = SampleProbes(spec)
    out: Estimates = {}
    for case in cases_of(spec):
        if case.sample in names and case.device == "cpu":
            out.setdefault(case.sample, []).append((case.check, case.dtype, estimate(spec, case, settings, probes)))
    return out


def project_settings() -> Any:
    """The Settings `opcheck list --cost` estimates under, from the working directory's project (its
    `[tool.opcheck]` policy, budget and threads)."""
    from opcheck import config as project_config
    from opcheck.capture.run import CaptureError
    from opcheck.runtime.cost.settings import cost_settings

    try:  # read and checked before the command ran; the command may have changed it since
        return cost_settings(project_config.load(Path.cwd()))[0]
    except ValueError as e:
        raise CaptureError(f"opcheck capture: {e}") from None


def costlier_twins(twins: dict[str, str], estimates: Estimates) -> dict[str, str]:
    """The reduced twins whose tests are estimated to cost more than their sample's (a twin that falls
    within the Jacobian budget gets the full check where its sample got projections): name -> why."""
    from opcheck.runtime.cost.estimate import format_seconds

    out = {}
    for twin, original in twins.items():
        small, big = total(estimates.get(twin, [])), total(estimates.get(original, []))
        if small is not None and big is not None and small > big:
            out[twin] = (
                f"the reduced twin of {original} would cost more to test ({format_seconds(small)} against "
                f"{format_seconds(big)}, estimated: a smaller Jacobian gets the full check), so it is not written"
            )
    return out


def total(tests: list[tuple[str, str, Any]]) -> float | None:
    """The estimated seconds of a sample's tests together; None if any has no estimate."""
    if not tests or any(est.skipped is not None for _, _, est in tests):
        return None
    return sum(est.seconds for _, _, est in tests)


def with_costs(
    pending: list[tuple[render.Rendered, select.Candidate]], estimates: Estimates
) -> list[tuple[render.Rendered, select.Candidate]]:
    """Each new sample with its estimated test cost on this machine's cpu as a comment."""
    from opcheck.runtime.cost.estimate import format_seconds

    out = []
    for r, c in pending:
        words = [
            f"{check} {dtype} {format_seconds(est.seconds) if est.skipped is None else 'not estimated'}"
            for check, dtype, est in estimates.get(r.name, [])
        ]
        if words:
            comment = "estimated cost on this cpu: " + ", ".join(words)
            r = render.Rendered(r.name, r.item, (*r.comments, comment), r.values_keys)
        out.append((r, c))
    return out
