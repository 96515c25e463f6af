"""The matrix: rows per (op, check, dtype) in a fixed order, cells counting samples per device."""

from report_samples import CUDA, RESULTS, result

from opcheck.report import build_matrix
from opcheck.report.matrix import Cell


def test_rows_devices_and_cells():
    matrix = build_matrix(RESULTS)
    assert matrix.devices == ("cpu", "cuda")
    assert [(r.spec, r.op, r.source, r.check, r.dtype) for r in matrix.rows] == [
        ("mm", "torch.mm", "op_specs/mm.yaml", "gradcheck", "float64"),
        ("mm", "torch.mm", "op_specs/mm.yaml", "gradgradcheck", "float64"),
        ("sin", "torch.sin", "op_specs/sin.yaml", "gradcheck", "float64"),
        ("sin", "torch.sin", "op_specs/sin.yaml", "lowprec", "bfloat16"),
    ]
    lowprec = matrix.rows[3]
    cpu, cuda = lowprec.cells
    assert cpu == Cell(
        counts=(("failed", 1), ("passed", 1)),
        reasons=(("failed", "CheckFailed: lowprec | atol=1e-2 <off>", ("b",)),),
        notes=(4,),
    )
    assert (cpu.status, cpu.text, cpu.tests) == ("failed", "1 failed, 1 passed", 2)
    assert cpu.title == "1 failed, 1 passed\n1 failed (b): CheckFailed: lowprec | atol=1e-2 <off>"
    assert (cuda.status, cuda.text, cuda.notes) == ("skipped", "2 skipped", (3,))
    assert cuda.title == f"2 skipped\n2 skipped (a, b): {CUDA}"
    assert matrix.rows[0].cells[1] is None  # mm has no cuda test
    assert [c.status for row in matrix.rows for c in row.cells if c] == [
        "error",
        "xfailed",
        "passed",
        "skipped",
        "failed",
        "skipped",
    ]


def test_totals_notes_and_failures():
    matrix = build_matrix(RESULTS)
    assert matrix.tests == 10 and matrix.specs == ("mm", "sin")
    assert dict(matrix.totals) == {"failed": 1, "passed": 3, "skipped": 4, "xfailed": 1, "xpassed": 0, "error": 1}
    assert dict(matrix.device_totals)["cuda"] == (
        ("failed", 0),
        ("passed", 0),
        ("skipped", 4),
        ("xfailed", 0),
        ("xpassed", 0),
        ("error", 0),
    )
    assert matrix.outcomes_present() == ("failed", "passed", "skipped", "xfailed", "error")
    assert [(n.number, n.outcome, n.tests) for n in matrix.notes] == [
        (1, "error", 1),
        (2, "xfailed", 1),
        (3, "skipped", 4),
        (4, "failed", 1),
    ]
    assert [(r.nodeid, number) for r, number in matrix.failures] == [
        ("generated_tests/test_mm.py::test_gradcheck[cpu-float64-sq]", 1),
        ("generated_tests/test_sin.py::test_lowprec[cpu-bfloat16-b]", 4),
    ]


def test_order_of_checks_dtypes_devices_is_the_models_not_the_inputs():
    results = [
        result("sin", check, device, dtype, "a", "passed")
        for check, dtype in (
            ("lowprec", "float32"),
            ("lowprec", "bfloat16"),
            ("gradcheck", "float64"),
            ("gradgradcheck", "complex128"),
            ("gradgradcheck", "float64"),
        )
        for device in ("hpu", "xpu", "cuda", "cpu", "acme")
    ]
    matrix = build_matrix(results)
    assert matrix.devices == ("cpu", "cuda", "xpu", "acme", "hpu")
    assert [(r.check, r.dtype) for r in matrix.rows] == [
        ("gradcheck", "float64"),
        ("gradgradcheck", "float64"),
        ("gradgradcheck", "complex128"),
        ("lowprec", "float32"),
        ("lowprec", "bfloat16"),
    ]


def test_the_worst_outcome_colours_a_cell_and_the_same_reason_is_one_note():
    results = [
        result("sin", "gradcheck", "cpu", "float64", "a", "xpassed", "fixed upstream?"),
        result("sin", "gradcheck", "cpu", "float64", "b", "passed"),
        result("sin", "gradcheck", "cpu", "float64", "c", "xfailed", "bug"),
        result("sin", "gradcheck", "cpu", "complex128", "a", "xfailed", "bug"),
        result("sin", "gradcheck", "cpu", "complex128", "b", "skipped", "no complex"),
    ]
    matrix = build_matrix(results)
    float64, complex128 = (row.cells[0] for row in matrix.rows)
    assert float64.status == "xpassed" and float64.text == "1 passed, 1 xfailed, 1 xpassed"
    assert complex128.status == "xfailed"
    assert [(n.number, n.outcome, n.text, n.tests) for n in matrix.notes] == [
        (1, "xpassed", "fixed upstream?", 1),
        (2, "xfailed", "bug", 2),
        (3, "skipped", "no complex", 1),
    ]
    assert complex128.notes == (2, 3)


def test_results_without_op_paths_still_group_by_spec():
    results = [
        result("sin", "gradcheck", "cpu", "float64", "a", "passed", op=""),
        result("sin", "gradcheck", "cpu", "float64", "b", "failed", "", op=""),
    ]
    (row,) = build_matrix(results).rows
    assert (row.op, row.source) == ("", "")
    assert build_matrix(results).failures[0][1] is None  # no reason, no note
