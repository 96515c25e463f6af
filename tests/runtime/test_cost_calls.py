"""What estimating costs (`opcheck list --cost`): a few calls of the op per sample, whatever the
dtypes and checks, each probe made once (counted calls, never seconds: probe.REPEAT_UNDER is 0 here,
so a timing is never repeated and the counts are the probes')."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import opcheck.runtime.cost.probe as probe
from opcheck.runtime.context import Settings
from opcheck.runtime.cost.estimate import estimate
from opcheck.runtime.cost.report import estimate_specs
from opcheck.runtime.cost.samples import SampleProbes
from opcheck.spec.case import cases_of
from opcheck.spec.model import (
    CompileFlags,
    GradcheckFlags,
    GradgradcheckFlags,
    Location,
    OpSpec,
    Sample,
    TensorArg,
)

pytestmark = pytest.mark.filterwarnings("ignore")

SOURCE = "op_specs/counted.yaml"
CALLS: Counter[str] = Counter()


class Cube(torch.autograd.Function):
    """x**3 as a kernel is: no vmap rule, no forward AD, a backward of its own; counting its calls."""

    @staticmethod
    def forward(ctx, x):
        CALLS["forward"] += 1
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, g):
        CALLS["backward"] += 1
        (x,) = ctx.saved_tensors
        return 3 * x**2 * g


def reference(x: torch.Tensor) -> torch.Tensor:
    CALLS["reference"] += 1
    return x**3


SAMPLES = (
    Sample("rows", args=(TensorArg(shape=(4, 8)),), location=Location(SOURCE, 5, 5)),
    Sample("square", args=(TensorArg(shape=(12, 12)),), location=Location(SOURCE, 6, 5)),
)


def _spec(**changes) -> OpSpec:
    fields = dict(
        name="counted",
        op="test_cost_calls:Cube.apply",
        source=SOURCE,
        sha256="0",
        samples=SAMPLES,
        devices=("cpu",),
        location=Location(SOURCE, 1, 1),
    )
    fields.update(changes)
    return OpSpec(**fields)


@pytest.fixture
def counted(monkeypatch):
    monkeypatch.setattr(probe, "REPEAT_UNDER", 0.0, raising=False)
    CALLS.clear()
    return CALLS


def test_the_low_precision_runs_are_timed_once_per_sample_whatever_the_dtypes(counted):
    spec = _spec(
        dtypes=(),
        lowprec_dtypes=("float32", "float16", "bfloat16"),
        reference="test_cost_calls:reference",
        gradcheck=GradcheckFlags(check_forward_ad=False),
    )
    estimates = estimate_specs([spec], Settings(), ["cpu"])
    assert len(estimates) == 6 and all(e.skipped is None for e in estimates)
    # per sample: the op's run (the spec's first timed twice: a kernel's first launch pays a warm-up),
    # the float64 reference's and the rounded reference's
    assert counted == {"forward": 3, "backward": 3, "reference": 6}, counted


def test_the_checks_that_only_run_the_op_share_one_probe_per_sample_across_dtypes(counted):
    """compile and torch.library.opcheck at three dtypes and the low-precision runs: the op's forward
    and backward timed once per sample, at the first dtype asked for."""
    spec = _spec(
        dtypes=(),
        lowprec_dtypes=("float32", "float16", "bfloat16"),
        reference="test_cost_calls:reference",
        gradcheck=GradcheckFlags(check_forward_ad=False),
        compile=CompileFlags(),
        library_opcheck=True,
    )
    estimates = estimate_specs([spec], Settings(), ["cpu"])
    checks = Counter(e.case.check for e in estimates if e.skipped is None)
    assert checks == {"lowprec": 6, "compile": 6, "library_opcheck": 2}, estimates
    # per sample one forward and one backward (the spec's first twice: a kernel's first launch pays a
    # warm-up); the float64 reference's run and the rounded reference's
    assert counted == {"forward": 3, "backward": 3, "reference": 6}, counted


def test_a_gradient_check_probes_the_op_at_its_own_dtype(counted):
    """What a plan learns from its probe (which batched evaluations agree with a plain call) holds at
    the probe's dtype: gradcheck at float64, estimated after the float32 compile test, is not priced
    from that test's probe; the compile test after gradcheck's is."""
    spec = _spec(
        dtypes=("float64",),
        supports_forward_ad=False,
        supports_gradgrad=False,
        gradcheck=GradcheckFlags(check_batched_grad=False),
        compile=CompileFlags(dtypes=("float32", "float64")),
        samples=SAMPLES[:1],
    )
    cases = {(c.check, c.dtype): c for c in cases_of(spec)}
    seen: list[torch.dtype] = []
    real_init = probe.Probe.__init__

    def spy(self, fn, inputs, *args, **kwargs):
        seen.append(next(x.dtype for x in inputs if isinstance(x, torch.Tensor)))
        real_init(self, fn, inputs, *args, **kwargs)

    probes = SampleProbes(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probe.Probe, "__init__", spy)
        for key in (("compile", "float32"), ("gradcheck", "float64"), ("compile", "float64")):
            assert estimate(spec, cases[key], Settings(), probes).skipped is None
    assert seen == [torch.float32, torch.float64], seen


def test_the_gradient_checks_probe_the_op_a_few_times_per_sample(counted):
    spec = _spec(
        supports_forward_ad=False,
        gradcheck=GradcheckFlags(check_batched_grad=False),
        gradgradcheck=GradgradcheckFlags(check_batched_grad=False),
    )
    estimates = estimate_specs([spec], Settings(), ["cpu"])
    checks = {e.case.check for e in estimates if e.skipped is None}
    assert {"gradcheck", "gradgradcheck"} <= checks, estimates
    per_sample = {kind: n / len(SAMPLES) for kind, n in counted.items()}
    # a forward and a backward timed, forward AD tried, a double backward, the first derivative
    # probed for gradgradcheck, and for the projections (both samples take them: Cube cannot be
    # vmapped, and 32 columns cost more looped) their sources: never the op's own probe again
    assert per_sample["forward"] <= 10 and per_sample["backward"] <= 6, counted
