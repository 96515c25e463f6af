"""The op_db benchmark end to end on one op: records, resume, report, and the batching compare."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from bench_runner import run_benchmark, script

from tests import forked_python

SCRIPT = script("bench_opdb")


def bench(*args: str) -> subprocess.CompletedProcess:
    return run_benchmark("bench_opdb", *args)


def in_child(script: str) -> subprocess.CompletedProcess:
    """Python `script` in a child process, with the benchmark module loaded as `bench` (a time or
    memory limit, or a patched function, holds there for the rest of the process), and
    `run_main(argv)`, which runs bench.main(argv) as the script runs it: [its exit status, its
    stdout, its stderr, the text its --out file holds after it (None without one)]. The child is
    forked from a process that imported torch and op_db (tests/forked_python.py)."""
    loader = (
        "import contextlib, importlib.util, io, json, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('bench_opdb', {str(SCRIPT)!r})\n"
        "bench = importlib.util.module_from_spec(spec)\n"
        f"sys.path.insert(0, {str(SCRIPT.parent)!r})\n"
        "spec.loader.exec_module(bench)\n"
        "\n"
        "def run_main(argv):\n"
        "    stdout, stderr = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):\n"
        "        try:\n"
        "            status = bench.main(argv)\n"
        "        except SystemExit as e:  # argparse's usage errors\n"
        "            status = e.code\n"
        "    out = argv[argv.index('--out') + 1] if '--out' in argv else None\n"
        "    text = open(out).read() if out and os.path.exists(out) else None\n"
        "    return [status, stdout.getvalue(), stderr.getvalue(), text]\n"
        "\n"
    )
    return forked_python.run_code(loader + script, timeout=300, preload=forked_python.OP_DB)


def ran(result: list) -> SimpleNamespace:
    """One run_main result: returncode, stdout and stderr as a run of the script has them, and out."""
    status, stdout, stderr, out = result
    return SimpleNamespace(returncode=status, stdout=stdout, stderr=stderr, out=out)


def bench_runs(*runs: list, before: str = "") -> list[SimpleNamespace]:
    """The benchmark's main() on each argument list in turn, in one child process that imports op_db
    once for them all (after the Python code `before`): see run_main."""
    argvs = [[str(a) for a in argv] for argv in runs]
    proc = in_child(before + f"\nprint(json.dumps([run_main(argv) for argv in {argvs!r}]))\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [ran(r) for r in json.loads(proc.stdout.splitlines()[-1])]


def records(path: Path | str) -> list[dict]:
    text = path.read_text() if isinstance(path, Path) else path
    return [json.loads(line) for line in text.splitlines()]


def test_one_op_paired_resumed_reported_and_compared(tmp_path):
    # exp makes every kind of call, on a first sample of 20 elements
    on, off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    proc = bench("--ops", "exp", "--limit", "1", "--out", str(on))  # the script as its user runs it
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(on)
    assert [r["done"] for r in recs if "done" in r] == ["exp|float64", "exp|complex128"]
    calls = [r for r in recs if "call" in r]
    # exp: grad, fwd, gradgrad(+noncontig), fwgrad_bwgrad(+noncontig), each slow and fast, per dtype
    assert {(r["call"], r["mode"]) for r in calls} == {
        (c, m)
        for c in ("grad", "fwd", "gradgrad", "gradgrad_noncontig", "fwgrad_bwgrad", "fwgrad_bwgrad_noncontig")
        for m in ("slow", "fast")
    }
    assert len(calls) == 24
    assert all(r["torch"]["verdict"] is True and r["opcheck"]["verdict"] is True for r in calls)
    # CPU seconds beside wall seconds: what other work on the machine does not stretch
    assert all(0 <= r[side]["cpu_seconds"] for r in calls for side in ("torch", "opcheck"))

    # The later runs, in turn in one child, start from these files: a run stopped inside a group,
    # and the records of earlier runs kept gzipped elsewhere.
    partial = tmp_path / "partial.jsonl"
    kept = [r for r in calls if r["group"] == "exp|float64"][:5]
    partial.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"call": "cut sh')
    kept_gz = tmp_path / "kept.jsonl.gz"
    with gzip.open(kept_gz, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in kept))
    on_gz = tmp_path / "on.jsonl.gz"
    on_gz.write_bytes(gzip.compress(on.read_bytes()))
    only, fresh, nothing, nothing_off = (
        tmp_path / f"{n}.jsonl" for n in ("complex", "fresh", "nothing", "nothing_off")
    )
    one = ["--ops", "exp", "--limit", "1"]
    only_run, again, resumed_run, fresh_run, nothing_run, report, report_gz, off_run, again_off, missing, same = (
        bench_runs(
            [*one, "--dtypes", "complex128", "--out", only],
            [*one, "--out", on],
            [*one, "--dtypes", "float64", "--out", partial],
            [*one, "--dtypes", "float64", "--out", fresh, "--skip-recorded", kept_gz],
            [*one, "--out", nothing, "--skip-recorded", fresh, on_gz],
            ["--report", on],
            ["--report", on_gz],
            [*one, "--out", off, "--no-batching", "--skip-recorded", on_gz],
            [*one, "--out", nothing_off, "--no-batching", "--skip-recorded", off],
            ["--report", tmp_path / "missing.jsonl.gz"],
            ["--compare", on, off],
        )
    )

    assert only_run.returncode == 0, only_run.stderr[-3000:]
    assert [r["done"] for r in records(only_run.out) if "done" in r] == ["exp|complex128"]

    assert again.returncode == 0 and len(records(again.out)) == len(recs)  # every group is done: nothing reruns

    # a run stopped inside a group: the next one makes only the calls it had not recorded
    assert resumed_run.returncode == 0, resumed_run.stderr[-3000:]
    resumed = [json.loads(line) for line in resumed_run.out.splitlines()[: len(kept)]]
    after = [json.loads(line) for line in resumed_run.out.splitlines()[len(kept) + 1 :]]
    assert resumed == kept  # untouched
    keys = [(r["sample"], r["call"], r["mode"]) for r in kept + after if "call" in r]
    assert len(keys) == len(set(keys)) == 12
    assert after[-1] == {"done": "exp|float64"}

    # the records of earlier runs kept gzipped elsewhere: their groups and calls are not made again
    assert fresh_run.returncode == 0, fresh_run.stderr[-3000:]
    made = records(fresh_run.out)
    assert {(r["sample"], r["call"], r["mode"]) for r in made if "call" in r} == set(keys) - {
        (r["sample"], r["call"], r["mode"]) for r in kept
    }
    assert len(made) == 12 - len(kept) + 1 and made[-1] == {"done": "exp|float64"}
    assert nothing_run.returncode == 0 and nothing_run.out == "", nothing_run.stderr[-3000:]

    assert report.returncode == 0, report.stdout
    assert report_gz.stdout == report.stdout
    assert "1 ops, 2 samples, 24 paired calls" in report.stdout
    assert re.search(r"groups: 2 of op_db.s [1-9][0-9]{2} \(op, dtype\) groups done", report.stdout), report.stdout
    assert "times: CPU seconds for 24 calls, wall seconds for the 0 older records" in report.stdout
    longer = r"ops opcheck takes longer on than torch in sum, of the 1 with CPU-timed calls: [01]\n"
    assert re.search(longer, report.stdout), report.stdout
    assert "verdict disagreements: 0" in report.stdout and "first-line disagreements: 0" in report.stdout

    # the paired run's records do not stand for the --no-batching run's: all 24 calls are made
    assert off_run.returncode == 0, off_run.stderr[-3000:]
    assert len([r for r in records(off_run.out) if "call" in r]) == 24
    assert all(r["torch"] is None for r in records(off_run.out) if "call" in r)  # opcheck alone
    assert [r for r in records(off_run.out) if "done" in r] == [
        {"done": g, "no_batching": True} for g in ("exp|float64", "exp|complex128")
    ]
    assert again_off.returncode == 0 and again_off.out == "", again_off.stderr[-3000:]
    assert missing.returncode == 2 and "missing.jsonl.gz: no such file" in missing.stderr
    assert same.returncode == 0, same.stdout
    assert "24 calls in both runs; opcheck's verdict differs on 0, its first line on 0 more" in same.stdout

    # the paired and the --no-batching records are told apart by torch's side, in any files
    mixed = tmp_path / "mixed.jsonl.gz"
    mixed.write_bytes(gzip.compress(off.read_bytes() + on.read_bytes()))
    # a run whose verdict differs on one call is reported and fails the compare
    changed = records(off)
    target = next(r for r in changed if r.get("call") == "grad" and r["mode"] == "slow")
    target["opcheck"] = {"verdict": "GradcheckError", "first_line": "Jacobian mismatch", "seconds": 0.0}
    differing = tmp_path / "differing.jsonl"
    differing.write_text("".join(json.dumps(r) + "\n" for r in changed))
    mixed_same, alone, differ = bench_runs(["--compare", mixed], ["--compare", on], ["--compare", on, differing])
    assert mixed_same.stdout == same.stdout
    assert alone.returncode == 1  # nothing to compare is not a pass
    assert differ.returncode == 1
    assert "verdict differs on 1," in differ.stdout and "Jacobian mismatch" in differ.stdout


def test_a_call_past_the_memory_limit_is_out_of_memory_and_counted_apart(tmp_path):
    path = tmp_path / "limited.jsonl"
    ok = {"verdict": True, "first_line": "", "seconds": 1.0}
    oom = {"verdict": "OutOfMemory", "first_line": "RuntimeError: can't allocate memory", "seconds": 1.0}
    rec = {"group": "abs|float64", "op": "abs", "dtype": "float64", "call": "grad", "mode": "slow"}
    path.write_text(
        json.dumps(dict(rec, sample=0, torch=ok, opcheck=ok))
        + "\n"
        + json.dumps(dict(rec, sample=1, torch=ok, opcheck=oom))
        + "\n"
    )
    timed = {"verdict": True, "first_line": "", "seconds": 9.0}
    path.write_text(
        path.read_text()
        + json.dumps(dict(rec, sample=2, torch=dict(timed, cpu_seconds=3.0), opcheck=dict(timed, cpu_seconds=1.5)))
        + "\n"
    )
    # In a child process: the limit holds for the rest of the process, so the report of these
    # records comes first.
    script = f"""
import torch
report = run_main(["--report", {str(path)!r}])
bench.limit_memory(0.5)
big = bench.run(lambda fn, args, **kw: torch.empty(2**28, dtype=torch.float64).fill_(1.0), None, (), {{}}, 60)
small = bench.run(lambda fn, args, **kw: bool(torch.ones(2**20).sum() > 0), None, (), {{}}, 60)
print(big["verdict"], small["verdict"])
print(json.dumps(report))
"""
    proc = in_child(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts, reported = proc.stdout.splitlines()
    assert verdicts.split() == ["OutOfMemory", "True"]  # 2 GiB refused, 8 MiB still fine after it

    report = ran(json.loads(reported))
    assert report.returncode == 0, report.stdout
    assert "verdict disagreements: 0" in report.stdout
    assert "timeouts or out of memory, apart: 1" in report.stdout
    # wall seconds where a record has no CPU seconds; the CPU-timed calls are also summed alone
    assert "slow: torch 4.0 s, opcheck 2.5 s (torch / opcheck 1.60x)" in report.stdout  # sample 1 is apart
    assert "the 1 calls timed in CPU seconds alone:\n    slow: torch 3.0 s, opcheck 1.5 s (torch / opcheck 2.00x)" in (
        report.stdout
    )


def test_the_time_limit_counts_cpu_seconds_and_a_wall_limit_backs_it():
    script = """
import time

def spin(fn, args, **kw):
    end = time.monotonic() + 60
    while time.monotonic() < end:  # computes: its CPU seconds run out
        sum(range(1000))
    return True

def nap(fn, args, seconds, **kw):
    time.sleep(seconds)  # waits: no CPU seconds
    return True

burn = bench.run(spin, None, (), {}, 0.2)
short = bench.run(nap, None, (), {"seconds": 0.3}, 0.2)
long = bench.run(nap, None, (), {"seconds": 60}, 0.2)
print(burn["verdict"], burn["first_line"], "|", short["verdict"], "|", long["verdict"], long["first_line"])
"""
    proc = in_child(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "Timeout over 0.2 CPU s | True | Timeout over 0.8 wall s"


RESULTS = SCRIPT.parent / "results" / "opdb"
README = SCRIPT.parents[1] / "README.md"


@pytest.mark.long
def test_the_readme_quotes_the_kept_records_of_the_op_db_run():
    # The op_db run's records are kept with the project: README's numbers are what they report.
    files = [str(p) for p in sorted(RESULTS.glob("*.jsonl.gz"))]
    assert files, f"no records in {RESULTS}"
    text = " ".join(README.read_text().split())
    quoted = re.search(
        r"([\d,]+) of torch ([\d.]+)'s ([\d,]+) groups \(([\d,]+) ops, ([\d,]+) samples, ([\d,]+) paired calls\): "
        r"0 verdict and 0 first-line disagreements",
        text,
    )
    assert quoted, "README quotes no op_db totals"
    release = quoted.group(2)
    groups, total, ops, samples, calls = (int(quoted.group(i).replace(",", "")) for i in (1, 3, 4, 5, 6))
    same = re.search(r"With batching off \(.*?\): the ([\d,]+) calls made in both runs", text)
    assert same, "README quotes no batching compare"
    report, compared = bench_runs(["--report", *files], ["--compare", *files])
    assert report.returncode == 0, report.stdout[-3000:]  # 0 verdict and 0 first-line disagreements
    assert f"{ops} ops, {samples} samples, {calls} paired calls\n" in report.stdout, report.stdout[:300]
    # op_db's size is the installed torch's: the total is the records' torch's only on that release
    if torch.__version__.split("+")[0] == release:
        assert f"groups: {groups} of op_db's {total} (op, dtype) groups done" in report.stdout, report.stdout[:300]
    else:
        assert f"groups: {groups} of op_db's " in report.stdout, report.stdout[:300]
    assert compared.returncode == 0, compared.stdout[-3000:]
    assert compared.stdout.startswith(
        f"{int(same.group(1).replace(',', ''))} calls in both runs; opcheck's verdict differs on 0, its first line on 0"
    ), compared.stdout[:300]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_opdb", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def test_the_least_cost_of_a_slow_call_is_two_calls_per_input_element_at_the_fastest_probe():
    bench = load_bench()
    args = (torch.zeros(2, 3), torch.zeros(4))  # 10 elements
    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 23.0])  # probes of 5, 2 and 3 seconds: the fastest counts
    assert bench.least_slow_seconds(torch.add, args[:1] * 2, clock=lambda: next(ticks)) == 2 * 12 * 2.0
    ticks = iter([0.0, 5.0, 5.0, 9.0])
    assert bench.least_slow_seconds(lambda a, b: a, args, clock=lambda: next(ticks), repeats=2) == 2 * 10 * 4.0

    def fails(a, b):
        raise ValueError("shapes")

    assert bench.least_slow_seconds(fails, args, clock=iter(range(10)).__next__) == 0.0
    # a complex element is two directions (real and imaginary part)
    z = torch.zeros(3, dtype=torch.complex128)
    assert bench.least_slow_seconds(torch.neg, (z,), clock=iter([0.0, 1.0] * 3).__next__) == 2 * 6 * 1.0


def test_the_least_cost_of_a_grad_or_second_order_call_counts_its_backward_calls():
    bench = load_bench()
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    grad_enabled, backward = [], []

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            backward.append(g.shape)
            return g * 2

    def fn(a):
        grad_enabled.append(torch.is_grad_enabled())
        return Double.apply(a).sum(0), a.detach()  # one differentiable output of 3 elements, one not

    def probe(call, f=fn):  # each probe: a forward of 1 s under no_grad, a backward of 3 s
        ticks = iter([0.0, 1.0, 10.0, 13.0] * 3)
        return bench.least_slow_seconds(f, (x,), call=call, clock=lambda: next(ticks))

    # gradgradcheck's function is the VJP (forward and backward) of x and the sum's grad_output
    assert probe("gradgrad") == 2 * (6 + 3) * (1.0 + 3.0)
    assert grad_enabled == [False, True] * 3 and backward == [(2, 3)] * 3
    # gradcheck: 2 forwards per direction of x, then 2 backward calls per element of the output
    assert probe("grad") == 2 * 6 * 1.0 + 2 * 3 * 3.0
    # with two differentiable outputs, one backward from both is no floor for either alone
    assert probe("grad", lambda a: (Double.apply(a), Double.apply(a).sum(0))) == 2 * 6 * 1.0
    assert bench.least_slow_seconds(fn, (x,), call="fwd", clock=iter([0.0, 1.0] * 3).__next__) == 12.0


def test_a_slow_call_predicted_past_the_limit_is_not_made_and_is_counted_apart(tmp_path):
    # In a child process whose probe says every slow call would take 1e9 CPU s.
    paired, alone = tmp_path / "paired.jsonl", tmp_path / "alone.jsonl"
    common = ["--ops", "abs", "--limit", "1", "--dtypes", "float64"]
    made, made_alone, report, compared = bench_runs(
        [*common, "--out", paired],
        [*common, "--out", alone, "--no-batching"],
        ["--report", paired],
        ["--compare", paired, alone],
        before="bench.least_slow_seconds = lambda *probe: 1e9\n",
    )
    assert made.returncode == made_alone.returncode == 0, made.stderr[-3000:] + made_alone.stderr[-3000:]
    calls = [r for r in records(paired) if "call" in r]
    slow, fast = [r for r in calls if r["mode"] == "slow"], [r for r in calls if r["mode"] == "fast"]
    assert len(slow) == len(fast) == 6
    assert all(r["torch"]["verdict"] is True and r["opcheck"]["verdict"] is True for r in fast)
    line = "predicted: over 300 CPU s (at least 1e+09 s)"
    assert all(r["torch"] == bench_record(line) for r in slow)
    assert all(r["opcheck"] == bench_record("not run: torch's call " + line) for r in slow)
    assert all(r["opcheck"] == bench_record(line) for r in records(alone) if r.get("mode") == "slow")
    assert all(r["floor"] == 1e9 for r in slow) and all("floor" not in r for r in fast)

    assert report.returncode == 0, report.stdout
    assert "timeouts or out of memory, apart: 6 (6 of them predicted, not run)" in report.stdout
    assert "  abs|float64: 6 calls on samples [0]\n" in report.stdout
    assert compared.stdout.startswith("6 calls in both runs; opcheck's verdict differs on 0, its first line on 0 more;")
    assert "6 timeouts or out of memory apart" in compared.stdout


def bench_record(line: str) -> dict:
    return {"verdict": "Timeout", "first_line": line, "seconds": 0.0, "cpu_seconds": 0.0, "predicted": True}


def test_the_report_holds_the_probes_floors_to_torchs_time(tmp_path):
    path = tmp_path / "floors.jsonl"
    rec = {"group": "abs|float64", "op": "abs", "dtype": "float64", "call": "grad", "mode": "slow"}
    side = {"verdict": True, "first_line": "", "seconds": 9.0}
    rows = [
        dict(rec, sample=0, floor=1.5, torch=dict(side, cpu_seconds=2.0), opcheck=dict(side, cpu_seconds=1.0)),
        dict(rec, sample=1, floor=0.5, torch=dict(side, cpu_seconds=4.0), opcheck=dict(side, cpu_seconds=1.0)),
        dict(rec, sample=2, floor=0.5, torch=dict(side, cpu_seconds=0.5), opcheck=dict(side, cpu_seconds=0.1)),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = bench("--report", str(path))
    assert report.returncode == 0, report.stdout
    # sample 2 took torch under a second: too short to hold a probe's floor to
    assert "of the 2 that took torch 1 s or more: at most 0.75 of torch's time" in report.stdout


def test_a_noncontiguous_twin_of_a_call_past_a_limit_is_not_made_and_no_limited_call_is_rerun(tmp_path):
    # In a child process whose torch gradgradcheck runs past the time limit in slow reverse over
    # reverse and past the memory limit in slow forward over reverse.
    first, resumed = tmp_path / "first.jsonl", tmp_path / "resumed.jsonl"
    script = f"""
import json, torch
real, calls = bench.run, []
PAST = {{
    False: {{"verdict": "Timeout", "first_line": "over 300 CPU s", "seconds": 1.0, "cpu_seconds": 1.0}},
    True: {{"verdict": "OutOfMemory", "first_line": "RuntimeError: can't allocate memory", "seconds": 1.0,
            "cpu_seconds": 1.0}},
}}

def run(checker, fn, args, kwargs, limit):
    if checker is torch.autograd.gradgradcheck and not kwargs["fast_mode"]:
        over = bool(kwargs.get("check_fwd_over_rev"))
        calls.append([over, kwargs["gen_non_contig_grad_outputs"]])
        return PAST[over]
    return real(checker, fn, args, kwargs, limit)

bench.run = run
common = ["--ops", "abs", "--limit", "1", "--dtypes", "float64"]
bench.main([*common, "--out", {str(first)!r}])
print(json.dumps(calls))
bench.run = real  # a later run knows the twins' verdicts from the records alone
recs = [json.loads(line) for line in open({str(first)!r})]
cut = next(i for i, r in enumerate(recs) if r.get("call") == "fwgrad_bwgrad" and r["mode"] == "fast")
open({str(resumed)!r}, "w").write("".join(json.dumps(r) + "\\n" for r in recs[: cut + 1]))
bench.main([*common, "--out", {str(resumed)!r}])
print(json.dumps(run_main(["--report", {str(first)!r}])))
"""
    proc = in_child(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made, reported = proc.stdout.splitlines()
    # torch's calls past a limit are not rerun; their twins are not made
    assert json.loads(made) == [[False, False], [True, False]]
    for path in (first, resumed):
        slow = {r["call"]: r for r in records(path) if r.get("mode") == "slow"}
        made = ("grad", "fwd", "gradgrad", "gradgrad_noncontig", "fwgrad_bwgrad", "fwgrad_bwgrad_noncontig")
        assert set(slow) == set(made)
        for name, verdict, past in [
            ("gradgrad", "Timeout", "300 CPU s"),
            ("fwgrad_bwgrad", "OutOfMemory", "the 10 GiB memory limit"),
        ]:
            twin = slow[name + "_noncontig"]
            line = f"predicted: over {past} (its contiguous twin ran past it)"
            assert twin["torch"] == dict(bench_record(line), verdict=verdict), path
            assert twin["opcheck"] == dict(bench_record("not run: torch's call " + line), verdict=verdict)
            assert slow[name]["torch"]["verdict"] == verdict and not slow[name]["torch"].get("predicted")
            assert "nondeterministic" not in slow[name]
        assert slow["grad"]["torch"]["verdict"] is True  # no twin: made
    report = ran(json.loads(reported))
    assert report.returncode == 0, report.stdout
    assert "timeouts or out of memory, apart: 4 (2 of them predicted, not run)" in report.stdout
    assert "  abs|float64: 2 calls on samples [0]\n" in report.stdout


def test_calls_an_op_declares_unsupported_are_made_as_their_own_kinds(tmp_path):
    # torch's tests make the forward-AD calls on an op that declares them unsupported, and expect
    # NotImplementedError: the same calls, under their own names.
    from torch.testing._internal.common_methods_invocations import op_db

    module = load_bench()
    by_key = {module.op_key(op.name, op.variant_test_name): op for op in op_db}
    unsupported = {name: kw for name, _, kw in module.calls_for(by_key["to_sparse"])}
    supported = {name: kw for name, _, kw in module.calls_for(by_key["abs"])}
    assert set(module.UNSUPPORTED) <= set(unsupported) and not set(module.UNSUPPORTED) & set(supported)
    for name in module.UNSUPPORTED:
        assert set(unsupported[name]) == set(supported[name.replace("_unsupported", "")])
        assert unsupported[name]["check_forward_ad" if name == "fwd_unsupported" else "check_fwd_over_rev"]
    assert [name for name, _, _ in module.calls_for(by_key["abs"], module.UNSUPPORTED)] == []

    out = tmp_path / "unsupported.jsonl"
    only = ["--ops", "to_sparse", "--limit", "1", "--out", out]
    first, every, again, report = bench_runs([*only, "--calls", *module.UNSUPPORTED], only, only, ["--report", out])
    assert first.returncode == 0, first.stderr[-3000:]
    recs = records(first.out)
    calls = [r for r in recs if "call" in r]
    assert {(r["call"], r["mode"]) for r in calls} == {(c, m) for c in module.UNSUPPORTED for m in ("slow", "fast")}
    assert all(r["torch"]["verdict"] == r["opcheck"]["verdict"] == "NotImplementedError" for r in calls)
    assert all(r["torch"]["first_line"] == r["opcheck"]["first_line"] for r in calls)
    assert recs[-1] == {"done": "to_sparse|float64", "calls": list(module.UNSUPPORTED)}
    # the group is done for those kinds only: a run of every kind makes the others, and no more
    assert every.returncode == 0, every.stderr[-3000:]
    made = [r for r in records(every.out)[len(recs) :] if "call" in r]
    assert made and not {r["call"] for r in made} & set(module.UNSUPPORTED)
    assert records(every.out)[-1]["done"] == "to_sparse|float64"
    assert again.returncode == 0 and len(records(again.out)) == len(recs) + len(made) + 1

    assert report.returncode == 0, report.stdout
    lines = report.stdout.splitlines()
    assert lines[0] == f"1 ops, 1 samples, {len(made)} paired calls"
    assert lines[1].startswith("  and 1 ops, 1 samples, 6 paired calls of the kinds an op declares unsupported")
    assert "verdict disagreements: 0" in report.stdout and "first-line disagreements: 0" in report.stdout
