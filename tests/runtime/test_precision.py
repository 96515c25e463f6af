"""Reduced-precision switches: set as the spec declares while a low-precision test runs, restored
after (also when it fails), and named in its failure header. The flags exist on a CPU build."""

import pytest
import torch

from opcheck.runtime import LowPrecisionMismatch, run_check
from opcheck.runtime.precision import Switches, describe, reduced_precision
from opcheck.spec.model import OpSpec, ReducedPrecision, Sample, TensorArg

ON = ReducedPrecision(tf32=True, reduced_precision_reduction=True)
STRICT = ReducedPrecision()


@pytest.fixture
def loose_switches():
    """Start from the opposite of the strict setting, and put the machine's own back after."""
    before = Switches.read()
    Switches(True, True, True, True, "high").apply()
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=True):
        yield
    before.apply()


def test_the_default_block_turns_every_switch_off_and_restores_them(loose_switches):
    outside = Switches.read()
    with reduced_precision(ReducedPrecision()) as inside:
        assert inside == Switches.read()
        assert not (inside.matmul_tf32 or inside.cudnn_tf32 or inside.fp16_reduction or inside.bf16_reduction)
        assert torch.get_float32_matmul_precision() == "highest"
    assert Switches.read() == outside


def test_a_block_that_allows_them_turns_them_on_and_restores_them():
    outside = Switches.read()
    with reduced_precision(ON):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    assert Switches.read() == outside


def test_switches_are_restored_when_the_block_raises(loose_switches):
    outside = Switches.read()
    with pytest.raises(RuntimeError, match="kernel failed"), reduced_precision(ReducedPrecision()):
        raise RuntimeError("kernel failed")
    assert Switches.read() == outside


def test_cudnn_is_set_after_torch_testing_forbids_setting_flags_directly():
    # torch.testing._internal (imported for `opinfo:` samples) calls disable_global_flags().
    torch.backends.disable_global_flags()
    try:
        with reduced_precision(ON):
            assert torch.backends.cudnn.allow_tf32
        with reduced_precision(ReducedPrecision()):
            assert not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.__allow_nonbracketed_mutation_flag = True


def _spec(op, block=STRICT):
    return OpSpec(
        name="rp",
        op=op,
        source="op_specs/rp.yaml",
        sha256="0",
        samples=(Sample("vec", args=(TensorArg(shape=(40,)),)),),
        lowprec_dtypes=("float32",),
        dtypes=(),
        reduced_precision=block,
    )


def test_a_low_precision_test_runs_under_the_declared_switches_and_says_so(monkeypatch, loose_switches):
    seen = []

    def op(x):
        seen.append(Switches.read())
        return torch.sin(x)

    import runtime_ops as ops

    monkeypatch.setattr(ops, "sin_recording_switches", op, raising=False)
    outside = Switches.read()
    run_check(_spec("runtime_ops:sin_recording_switches"), "lowprec", "cpu", "float32", "vec")
    assert seen and all(not s.matmul_tf32 and not s.cudnn_tf32 and not s.fp16_reduction for s in seen)
    assert Switches.read() == outside
    seen.clear()
    run_check(_spec("runtime_ops:sin_recording_switches", ON), "lowprec", "cpu", "float32", "vec")
    assert seen and all(s.matmul_tf32 and s.cudnn_tf32 and s.bf16_reduction for s in seen)


def test_the_failure_header_names_the_switches_and_they_are_restored(loose_switches):
    outside = Switches.read()
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(_spec("runtime_ops:sin_wrong_in_float32", ON), "lowprec", "cpu", "float32", "vec")
    assert Switches.read() == outside
    (line,) = [line for line in str(info.value).splitlines() if line.strip().startswith("precision:")]
    assert line.strip().removeprefix("precision:").strip() == describe(ON)
    assert describe(ON).startswith("TF32 on (matmul, cuDNN), reduced-precision float16/bfloat16 matmul reductions on")
    assert describe(ReducedPrecision()).endswith("off (the strict default)")
