"""Results of a small run, by hand, for the matrix and renderer tests."""

from opcheck.report.results import TestResult

CUDA = "cuda is not available on this machine (torch.cuda.is_available() is False)"


def result(spec, check, device, dtype, sample, outcome, reason="", op=None):
    ops = {"sin": ("torch.sin", "op_specs/sin.yaml"), "mm": ("torch.mm", "op_specs/mm.yaml")}
    op_path, source = ops[spec] if op is None else (op, "")
    return TestResult(
        spec=spec,
        check=check,
        device=device,
        dtype=dtype,
        sample=sample,
        outcome=outcome,
        reason=reason,
        nodeid=f"generated_tests/test_{spec}.py::test_{check}[{device}-{dtype}-{sample}]",
        op=op_path,
        source=source,
        duration=0.01,
    )


RESULTS = [
    result("sin", "lowprec", "cpu", "bfloat16", "b", "failed", "CheckFailed: lowprec | atol=1e-2 <off>"),
    result("sin", "lowprec", "cpu", "bfloat16", "a", "passed"),
    result("sin", "gradcheck", "cuda", "float64", "a", "skipped", CUDA),
    result("sin", "gradcheck", "cuda", "float64", "b", "skipped", CUDA),
    result("sin", "gradcheck", "cpu", "float64", "a", "passed"),
    result("sin", "gradcheck", "cpu", "float64", "b", "passed"),
    result("sin", "lowprec", "cuda", "bfloat16", "a", "skipped", CUDA),
    result("sin", "lowprec", "cuda", "bfloat16", "b", "skipped", CUDA),
    result("mm", "gradgradcheck", "cpu", "float64", "sq", "xfailed", "known bug (op_specs/mm.yaml:9:5)"),
    result("mm", "gradcheck", "cpu", "float64", "sq", "error", "error in setup: RuntimeError: no memory"),
]


# `render_markdown(build_matrix(RESULTS), "results.json")`, exactly.
GOLDEN_MARKDOWN = r"""# opcheck coverage

results.json: 10 tests of 2 ops on cpu, cuda: 1 failed, 3 passed, 4 skipped, 1 xfailed, 1 error.

| device | tests | failed | passed | skipped | xfailed | error |
| --- | --: | --: | --: | --: | --: | --: |
| cpu | 6 | 1 | 3 | 0 | 1 | 1 |
| cuda | 4 | 0 | 0 | 4 | 0 | 0 |
| all | 10 | 1 | 3 | 4 | 1 | 1 |

## Matrix

One row per op, check and dtype; a cell counts the row's samples on one device; [n] is a note below.

| op | check | dtype | cpu | cuda |
| --- | --- | --- | --- | --- |
| mm (`torch.mm`) | gradcheck | float64 | **1 error** [1] | - |
|  | gradgradcheck | float64 | 1 xfailed [2] | - |
| sin (`torch.sin`) | gradcheck | float64 | 2 passed | 2 skipped [3] |
|  | lowprec | bfloat16 | **1 failed**, 1 passed [4] | 2 skipped [3] |

## Notes

1. error, 1 test: error in setup: RuntimeError: no memory
2. xfailed, 1 test: known bug (op_specs/mm.yaml:9:5)
3. skipped, 4 tests: cuda is not available on this machine (torch.cuda.is_available() is False)
4. failed, 1 test: CheckFailed: lowprec \| atol=1e-2 \<off\>

## Failures

- error: `generated_tests/test_mm.py::test_gradcheck[cpu-float64-sq]` [1]
- failed: `generated_tests/test_sin.py::test_lowprec[cpu-bfloat16-b]` [4]
"""
