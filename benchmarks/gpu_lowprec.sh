#!/usr/bin/env bash
# The low-precision parts of gpu_check.sh: the catalog's low-precision checks on a CUDA GPU with
# TF32 off (the default) and on, and the generated low-precision tests there:
#
#     bash benchmarks/gpu_lowprec.sh OUTDIR
#
# Writes OUTDIR/env.txt (the GPU, torch, CUDA and triton), lowprec_tf32_off.txt and
# lowprec_tf32_on.txt (benchmarks/bench_lowprec.py --device cuda --no-corpus --details, with and
# without --tf32), suite.txt and suite.xml (python -m pytest generated_tests -m lowprec
# --opcheck-device cuda) and summary.txt. It takes gpu_check.sh's options (--device cpu, --workers N,
# --budget S) and sets up the machine as it does (wheels of .whl/, the plugin by name).
exec bash "$(dirname "$0")/gpu_check.sh" --parts env,suite,lowprec -m lowprec "$@"
