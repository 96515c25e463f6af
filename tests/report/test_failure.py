"""failure_details: the worst entry and hints of a failure message, by the marks the engine writes."""

import pytest

from opcheck.report.failure import MESSAGE_LIMIT, failure_details, kept_message

HEADER = """opcheck.runtime.checks.CheckFailed: opcheck gradcheck failed for torch.mm on cpu/float64, sample 'sq'
  op:          torch.mm (spec 'mm', op_specs/mm.yaml)
  rerun:       pytest 'generated_tests/test_mm.py::test_gradcheck[cpu-float64-sq]'

engine report:
"""

JACOBIAN = """Jacobian mismatch for output 0 with respect to input 1,
check: backward (VJP); d output 0 / d mat2, real part
1 of 16 Jacobian entries differ beyond atol=1e-05 + rtol=0.001 * |numerical| (input shape (4,), output shape (4,))
worst entries:
  d out[3] / d in[3]: analytical 2, numerical 1, abs err 1, rel err 1
  d out[0] / d in[0]: analytical 1.1, numerical 1, abs err 0.1, rel err 0.1
hint: only the last row is wrong: a tail tile?
hint: the error is exactly 1 x numerical
"""

PROJECTION = """Jacobian mismatch for output 0 with respect to input 0,
check: backward (VJP), auto: JVP stage (J·U from VJP of VJP); d output 0 / d input 0
3 of 64 projection entries (J u_l)[out] differ beyond atol=1e-05 + rtol=0.001 * |numerical| (...)
the block has 1048576 Jacobian entries, beyond the budget: not recomputed in full; these are projection entries
worst entries:
  (J u_2)[5, 1]: analytical 0.5, numerical 0.25, abs err 0.25, allowed 1e-05
"""

LOWPREC = """opcheck.runtime.checks.LowPrecisionMismatch: opcheck lowprec failed for k on cpu/float32, sample 'v': \
VJP: gradient of input 0 differs from the float64 run
  op:          k (spec 'k', op_specs/k.yaml)

VJP: gradient of input 0: 39 of 40 entries beyond the bound (shape (40,), float32 against float64)
criterion: baseline: |low - ref| <= ...
worst entries (op error / baseline error = how many times what the math loses at this dtype):
  [17]: float32 0.936219, float64 0.92695, op error 0.009269, baseline error 5.155e-08 (1.8e+05x), allowed 1.431e-05
  [2]: float32 0.658071, float64 0.651555, op error 0.006516, baseline error 5.383e-08 (1.21e+05x), allowed 1.431e-05
max error / allowed: 647.9
hint: errors of the size of bfloat16 rounding: is a kernel computing in a narrower dtype?
"""


@pytest.mark.parametrize(
    "message, worst, hint",
    [
        (
            HEADER + JACOBIAN,
            "d output 0 / d mat2, real part, d out[3] / d in[3]: analytical 2, numerical 1, abs err 1, rel err 1",
            "only the last row is wrong: a tail tile?\nthe error is exactly 1 x numerical",
        ),
        (
            HEADER + PROJECTION,
            "d output 0 / d input 0, (J u_2)[5, 1]: analytical 0.5, numerical 0.25, abs err 0.25, allowed 1e-05",
            "",
        ),
        (
            LOWPREC,
            "VJP: gradient of input 0, [17]: float32 0.936219, float64 0.92695, op error 0.009269, baseline error "
            "5.155e-08 (1.8e+05x), allowed 1.431e-05",
            "errors of the size of bfloat16 rounding: is a kernel computing in a narrower dtype?",
        ),
        (  # a crash: the runtime's hint, no entries
            "opcheck.runtime.checks.CheckCrashed: opcheck could not run the check\n\nTypeError: NoneType\n"
            "hint: a backward received None: with several outputs, ...",
            "",
            "a backward received None: with several outputs, ...",
        ),
        ("AssertionError: assert 1 == 2\n  where ... hint: not at a line's start", "", ""),
        ("", "", ""),
    ],
)
def test_worst_entry_and_hints(message, worst, hint):
    details = failure_details(message)
    assert (details.worst, details.hint) == (worst, hint)


def test_a_hint_said_twice_is_kept_once():
    assert failure_details("x\nhint: a\nhint: b\nhint: a\n").hint == "a\nb"


def test_kept_message_drops_a_one_line_message_and_cuts_a_huge_one():
    assert kept_message("AssertionError: boom\n") == ""
    assert kept_message(HEADER + JACOBIAN) == (HEADER + JACOBIAN).strip("\n")
    huge = "Error: first\n" + "x" * (2 * MESSAGE_LIMIT)
    kept = kept_message(huge)
    assert kept.startswith("Error: first\nxxx")
    assert kept.endswith(f"\n... ({len(huge) - MESSAGE_LIMIT:,} more characters)")
    assert len(kept) < MESSAGE_LIMIT + 100
