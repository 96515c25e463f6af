#!/usr/bin/env bash
# Everything a GPU run should record, in one command and under 8 minutes on one GPU:
#
#     bash benchmarks/gpu_check.sh OUTDIR                 # on cuda
#     bash benchmarks/gpu_check.sh --device cpu OUTDIR    # the same parts, scaled down, on the CPU
#
# Parts, in this order, each under its own `timeout` and all under one overall budget:
#   env      the GPU(s), driver, torch / CUDA / cuDNN / triton versions         -> env.txt
#   suite    python -m pytest generated_tests --opcheck-device DEVICE           -> suite.txt, suite.xml
#            (several GPUs: one xdist worker per GPU, each pinned to its own;
#            one GPU: 4 workers share it)
#   opinfo   bench_opinfo.py --device DEVICE on a bounded subset of ops         -> opinfo.txt, opinfo.json
#   scale    bench_scale.py --device DEVICE on a few mutants and their twins    -> scale.txt, scale.json
#   single   bench_single.py --device DEVICE                                    -> single.txt
#   lowprec  bench_lowprec.py --device DEVICE --no-corpus, TF32 off and on      -> lowprec_tf32_off.txt, lowprec_tf32_on.txt
# then OUTDIR/summary.txt: the machine, the suite's counts (in all and per check kind) and failing
# tests, the benchmarks' ratio tables, every peak-memory line, and each part's status and time.
#
# Options (before OUTDIR):
#   --device D       cuda (default), cpu, or another device type of --opcheck-device; on cpu every
#                    part is scaled down (a few generated modules, two OpInfo ops, one mutant pair,
#                    two specs of the low-precision catalog)
#   --workers N      pytest-xdist workers for the suite (0: no xdist); default as above, 0 on cpu
#   --parts LIST     comma-separated subset of env,suite,opinfo,scale,single,lowprec (default: all)
#   -m EXPR          only the suite's tests matching the marker expression (e.g. -m lowprec)
#   --budget S       seconds for all parts together (default 455 on a GPU, 600 on cpu); a part gets
#                    at most what is left and is skipped when under 10 s are
#
# PYTHON (default python3) runs everything. Wheels in .whl/ of packages this Python lacks (e.g.
# jsonschema on a bare GPU machine) are installed into /tmp/site first (OPCHECK_WHEEL_SITE), and
# where opcheck is not pip-installed its pytest plugin is loaded with -p opcheck.plugin.
set -uo pipefail
cd "$(dirname "$0")/.."
device=cuda workers= parts=env,suite,opinfo,scale,single,lowprec marker= budget=
usage="usage: gpu_check.sh [--device D] [--workers N] [--parts LIST] [-m EXPR] [--budget S] OUTDIR"
while (($#)); do
    case $1 in
        --device) device=${2:?$usage}; shift 2 ;;
        --workers) workers=${2:?$usage}; shift 2 ;;
        --parts) parts=${2:?$usage}; shift 2 ;;
        -m) marker=${2:?$usage}; shift 2 ;;
        --budget) budget=${2:?$usage}; shift 2 ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "$usage" >&2; exit 2 ;;
        *) break ;;
    esac
done
out=${1:?$usage}
for part in ${parts//,/ }; do
    case $part in
        env | suite | opinfo | scale | single | lowprec) ;;
        *) echo "--parts: unknown part $part (expected env, suite, opinfo, scale, single, lowprec)" >&2; exit 2 ;;
    esac
done
[[ -z $workers || $workers =~ ^[0-9]+$ ]] || { echo "--workers: expected a count, got $workers" >&2; exit 2; }
[[ -z $budget || $budget =~ ^[0-9]+$ ]] || { echo "--budget: expected seconds, got $budget" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
started=$SECONDS

# ------------------------------------------------------------------------------------ setup
site=${OPCHECK_WHEEL_SITE:-/tmp/site}
missing=()
for wheel in .whl/*.whl; do
    [[ -e $wheel ]] || continue
    dist=$(basename "$wheel"); dist=${dist%%-*}
    "$py" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null || missing+=("$wheel")
done
if ((${#missing[@]})); then
    timeout 60 "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "${missing[@]}" && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
plugin=(-p opcheck.plugin)
"$py" -c "import importlib.metadata as m, sys; sys.exit(any(e.value == 'opcheck.plugin' for e in m.entry_points(group='pytest11')))" \
    || plugin=()

if [[ $device == cpu ]]; then
    : "${budget:=600}" "${workers:=0}"
    suite_paths=(generated_tests/test_sin.py generated_tests/test_softmax.py generated_tests/test_mul.py)
    opinfo_args=(--ops sin,mul --max-samples 2 --mode all)
    scale_args=(--cases sin_64x64_tail7,sin_64x64_tail7:twin --slow-max-entries 0)
    single_args=(--repeat 1)
    lowprec_args=(--ops sin,softmax)
    declare -A cap=([env]=60 [suite]=120 [opinfo]=120 [scale]=120 [single]=60 [lowprec]=120)
else
    : "${budget:=455}"
    suite_paths=(generated_tests)
    opinfo_args=(--ops sin,mul,sum,softmax,matmul,nn.functional.conv2d,cumsum,linalg.det --max-samples 3 --mode all)
    # J·U from forward AD (sin) and from VJP rows (attention); torch's slow mode where the Jacobian
    # has <= 4M entries: the attention pair, not the 16M-entry sin.
    pairs=sin_64x64_tail7,attention_2x32x16_head
    scale_args=(--cases "$(sed -E 's/([^,]+)/\1,\1:twin/g' <<<"$pairs")" --slow-max-entries 4000000)
    single_args=(--repeat 3)
    lowprec_args=()
    declare -A cap=([env]=20 [suite]=170 [opinfo]=50 [scale]=70 [single]=20 [lowprec]=60)
    if [[ -z $workers ]]; then
        gpus=$("$py" -c "import torch; print(torch.${device}.device_count())" 2>/dev/null || echo 0)
        # A small test leaves the GPU idle while its process launches kernels: one GPU is shared by 4.
        workers=$((gpus > 1 ? gpus : 4))
    fi
fi
if ((workers > 0)) && ! "$py" -c "import xdist" 2>/dev/null; then
    echo "pytest-xdist is not installed: the suite runs in one process" >"$out/suite_workers.txt"
    workers=0
fi

: >"$out/parts.tsv"
# run PART NAME CAP CMD...: CMD under `timeout`, its output in OUTDIR/NAME.txt, a row in parts.tsv.
run() {
    local part=$1 name=$2 limit=$3 rc
    shift 3
    local left=$((budget - (SECONDS - started)))
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        printf '%s\t%s\tskipped: the budget (%s s) is spent\t0\t%s\n' "$part" "$name" "$budget" "$*" >>"$out/parts.tsv"
        return
    fi
    echo "[$part] $name: $* (at most ${limit}s)"
    local t0=$SECONDS
    # SIGINT first, so that pytest still prints its summary of the tests that ran.
    timeout -s INT -k 15 "$limit" "$@" >"$out/$name.txt" 2>&1
    rc=$?
    local status=ok
    ((rc == 124)) && status="timed out after ${limit}s"
    ((rc != 0 && rc != 124)) && status="exit $rc"
    printf '%s\t%s\t%s\t%s\t%s\n' "$part" "$name" "$status" "$((SECONDS - t0))" "$*" >>"$out/parts.tsv"
    echo "[$part] $name: $status, $((SECONDS - t0))s"
}
want() { [[ ,$parts, == *,$1,* ]]; }

# ------------------------------------------------------------------------------------ parts
if want env; then
    run env env "${cap[env]}" "$py" - "$device" <<'EOF'
import importlib.metadata as md, platform, shutil, subprocess, sys
import torch

device = sys.argv[1]
print(f"python {platform.python_version()} | {platform.machine()} | torch {torch.__version__} | "
      f"CUDA (torch built with) {torch.version.cuda} | cuDNN {torch.backends.cudnn.version()}")
for dist in ("triton", "opcheck", "pytest", "pytest-xdist"):
    try:
        print(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
if device == "cuda":
    print(f"GPUs: {torch.cuda.device_count()}")
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"  cuda:{i} {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")
    if shutil.which("nvidia-smi"):
        print(subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv"],
                             capture_output=True, text=True).stdout.rstrip())
else:
    print(f"device: {device} (no GPU part)")
EOF
fi
if want suite; then
    suite=("$py" -m pytest "${plugin[@]}" "${suite_paths[@]}" --opcheck-device "$device" -p no:cacheprovider
        --junitxml "$out/suite.xml")
    [[ -n $marker ]] && suite+=(-m "$marker")
    ((workers > 0)) && suite+=(-n "$workers")
    run suite suite "${cap[suite]}" "${suite[@]}"
fi
if want opinfo; then
    run opinfo opinfo "${cap[opinfo]}" "$py" benchmarks/bench_opinfo.py --device "$device" "${opinfo_args[@]}" \
        --json "$out/opinfo.json"
fi
if want scale; then
    run scale scale "${cap[scale]}" "$py" benchmarks/bench_scale.py --device "$device" "${scale_args[@]}" \
        --json "$out/scale.json"
fi
if want single; then
    run single single "${cap[single]}" "$py" benchmarks/bench_single.py --device "$device" "${single_args[@]}"
fi
if want lowprec; then
    lowprec=("$py" benchmarks/bench_lowprec.py --device "$device" --no-corpus --details "${lowprec_args[@]}")
    run lowprec lowprec_tf32_off "${cap[lowprec]}" "${lowprec[@]}"
    run lowprec lowprec_tf32_on "${cap[lowprec]}" "${lowprec[@]}" --tf32
fi

# ---------------------------------------------------------------------------------- summary
"$py" - "$out" "$device" "$workers" "$((SECONDS - started))" <<'EOF' >"$out/summary.txt"
import collections, re, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, device, workers, wall = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
parts = [line.split("\t") for line in (out / "parts.tsv").read_text().splitlines() if line]
status = {name: (part, st, secs, cmd) for part, name, st, secs, cmd in parts}


def text(name):
    path = out / f"{name}.txt"
    return path.read_text(errors="replace") if path.exists() else ""


def section(title, name):
    print(f"\n## {title}")
    if name not in status:
        print("not run (--parts)")
        return None
    part, st, secs, cmd = status[name]
    print(f"status: {st}, {secs} s | {cmd}")
    return text(name)


def block(body, start, stop=lambda line: not line.strip()):
    """The lines from the first that `start` matches up to (not including) the first `stop` after it."""
    lines, on = [], False
    for line in body.splitlines():
        if not on and start(line):
            on = True
        elif on and stop(line):
            break
        if on:
            lines.append(line)
    return lines


print(f"# opcheck on {device}: benchmarks/gpu_check.sh, {wall} s in all ({out})")
body = section("machine", "env")
if body is not None:
    print(body.rstrip())

body = section(f"generated suite ({'pytest-xdist, ' + str(workers) + ' workers' if workers else 'one process'})", "suite")
if body is not None:
    note = text("suite_workers")
    if note:
        print(note.rstrip())
    finals = [ln for ln in body.splitlines() if re.search(r"\d+ (passed|failed|error|skipped|deselected)", ln)]
    print("pytest: " + (finals[-1].strip("= ") if finals else "no summary line (see suite.txt)"))
    xml = out / "suite.xml"
    if xml.exists():
        kinds = collections.defaultdict(collections.Counter)
        failed = []
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name", "")
            kind = name.split("[")[0].removeprefix("test_")
            tags = {child.tag: child for child in case}
            if "failure" in tags or "error" in tags:
                outcome = "failed"
                failed.append(f"{case.get('classname', '')}::{name}")
            elif "skipped" in tags:
                outcome = "xfailed" if tags["skipped"].get("type") == "pytest.xfail" else "skipped"
            else:
                outcome = "passed"
            kinds[kind][outcome] += 1
        total = sum(kinds.values(), collections.Counter())
        order = ("passed", "failed", "skipped", "xfailed")
        print("counts: " + ", ".join(f"{total[o]} {o}" for o in order))
        for kind, counts in sorted(kinds.items()):
            print(f"  {kind:24s} " + ", ".join(f"{counts[o]} {o}" for o in order))
        if failed:
            print(f"failed ({len(failed)}):")
            print("\n".join(f"  {f}" for f in failed[:40]) + ("\n  ..." if len(failed) > 40 else ""))

body = section("bench_opinfo: opcheck vs torch.autograd.gradcheck on OpInfo samples", "opinfo")
if body is not None:
    print("\n".join(block(body, lambda ln: ln.startswith("op ") and "ratio" in ln)))
    print("\n".join(ln for ln in body.splitlines() if ln.startswith(("== summary", "[", "SKIPPED", "skipped ops"))))

body = section("bench_scale: localized bugs at real sizes, auto vs torch fast and slow", "scale")
if body is not None:
    print("\n".join(block(body, lambda ln: ln.startswith("case "))))
    print("\n".join(ln for ln in body.splitlines() if ln.startswith("[")))

body = section("bench_single: one function, one input", "single")
if body is not None:
    print("\n".join(ln for ln in body.splitlines() if ln.startswith(("torch.", "[memory]"))))

for tf32 in ("off", "on"):
    body = section(f"bench_lowprec: the low-precision catalog, TF32 {tf32}", f"lowprec_tf32_{tf32}")
    if body is not None:
        print("\n".join(block(body, lambda ln: ln.strip().startswith("baseline"))) + "\n")
        print("\n".join(block(body, lambda ln: ln.startswith("floor"))) + "\n")
        print("\n".join(ln for ln in body.splitlines() if ln.startswith("[memory]")))

print("\n## peak memory")
for _, name, *_ in parts:
    for line in text(name).splitlines():
        if line.startswith("[memory]"):
            print(f"{name}: {line}")

print("\n## parts")
for part, name, st, secs, cmd in parts:
    print(f"{name:18s} {st:34s} {secs:>5s} s")
EOF
echo "summary: $out/summary.txt"
cat "$out/summary.txt"
