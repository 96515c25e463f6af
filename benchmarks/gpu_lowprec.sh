#!/usr/bin/env bash
# The catalog's low-precision checks on a CUDA GPU, with TF32 off (the default) and on, and the
# generated low-precision tests there:
#
#     bash benchmarks/gpu_lowprec.sh OUTDIR
#
# Writes OUTDIR/gpu.txt (the GPU, torch and triton), lowprec_tf32_off.txt and lowprec_tf32_on.txt
# (benchmarks/bench_lowprec.py --device cuda, with and without --tf32), and pytest_lowprec_cuda.txt
# (python -m pytest generated_tests -m lowprec --opcheck-device cuda). Wheels in .whl/ (packages
# the machine lacks, e.g. jsonschema) are installed into /tmp/site first when present.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_lowprec.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$py" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$out/gpu.txt"
"$py" benchmarks/bench_lowprec.py --device cuda --no-corpus --details 2>&1 | tee "$out/lowprec_tf32_off.txt"
"$py" benchmarks/bench_lowprec.py --device cuda --no-corpus --tf32 --details 2>&1 | tee "$out/lowprec_tf32_on.txt"
# Where opcheck is not pip-installed, its pytest plugin is loaded by name.
plugin=(-p opcheck.plugin)
"$py" -c "import importlib.metadata as m, sys; sys.exit(any(e.value == 'opcheck.plugin' for e in m.entry_points(group='pytest11')))" \
    || plugin=()
"$py" -m pytest "${plugin[@]}" generated_tests -m lowprec --opcheck-device cuda -n 8 -p no:cacheprovider \
    2>&1 | tee "$out/pytest_lowprec_cuda.txt" | tail -n 40
