#!/bin/bash
# Multigrid on the GPU (issue 7): the batched kernels against NumPy (pytest -m gpu), then a KD multigrid solve of
# MILC's l8888 (HISQ links, m = 0.001, random source, tol 1e-10) on CuPy next to even-odd CG. Logs into $OUT.
#   run with: bash tools/mg_device.sh   (needs .fixtures/milc carried, HMC_MILC_FIXTURES set)
set -u
OUT=${OUT:-/tmp/mg_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD OMP_NUM_THREADS=4
FIX=${HMC_MILC_FIXTURES:-$PWD/.fixtures/milc}
nvidia-smi --query-gpu=name,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
timeout 100 python3 -m pytest -m gpu tests/solvers/test_multigrid_kernels.py -q -s -p no:cacheprovider \
    > "$OUT/pytest_kernels.txt" 2>&1; echo "pytest rc $?" >> "$OUT/pytest_kernels.txt"
tail -5 "$OUT/pytest_kernels.txt"
for m in 0.001; do
  timeout 60 python3 -m hmc --backend cupy solve "$FIX/lat.sample.l8888" --action hisq --mass $m --random 3 \
      --solver mg --tol 1e-10 > "$OUT/solve_l8888_m$m.txt" 2>&1; echo "rc $?" >> "$OUT/solve_l8888_m$m.txt"
  cat "$OUT/solve_l8888_m$m.txt"
done
