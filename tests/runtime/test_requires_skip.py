"""run_check skips every test of a spec whose `requires:` names a module that is not installed,
before anything else (the op, whose module would fail to import, is never resolved), and runs
the spec as ever when every required module is there."""

from __future__ import annotations

import pytest

from opcheck.runtime import CheckSkipped, run_check
from opcheck.spec.model import CHECKS, GradcheckFlags, Location, OpSpec, Sample, TensorArg

MISSING = "a_module_that_does_not_exist_xyz"
VEC = Sample("vec", args=(TensorArg(shape=(5,)),), location=Location("op_specs/x.yaml", 7, 5))


def spec(op: str, requires: tuple[str, ...]) -> OpSpec:
    return OpSpec(
        name="x",
        op=op,
        source="op_specs/x.yaml",
        sha256="0",
        samples=(VEC,),
        requires=requires,
        lowprec_dtypes=("float32",),
        gradcheck=GradcheckFlags(check_forward_ad=True),
    )


@pytest.mark.parametrize("check", CHECKS)
def test_every_check_skips_naming_the_module_and_the_key(check):
    # The op's module does not exist either: resolving it would crash, so the skip comes first,
    # before the device's (mps is missing here too) and before the sample is built.
    missing = spec(f"{MISSING}.kernels:kernel", requires=("json", MISSING))
    reason = f"requires {MISSING}, which is not installed (op_specs/x.yaml: requires: [json, {MISSING}])"
    for device in ("cpu", "mps"):
        with pytest.raises(CheckSkipped) as info:
            run_check(missing, check, device, "float64", "vec")
        assert info.value.reason == str(info.value) == reason


def test_with_every_required_module_installed_the_check_runs():
    run_check(spec("torch.sin", requires=("json",)), "gradcheck", "cpu", "float64", "vec")
    run_check(spec("torch.sin", requires=("json",)), "lowprec", "cpu", "float32", "vec")
