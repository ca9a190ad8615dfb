#!/usr/bin/env bash
# One call on the GPU machine: the GPU test subset, then the benchmarks, logs under $OUT.
# Usage there: bash tools/device_checks.sh [pytest-args...]
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -30
for a in wilson symanzik; do
  for L in 8 16 32; do
    python3 -m hmc --backend cupy bench gauge --lattice $L $L $L $L --action $a --repeat 5 2>&1 | tee -a "$OUT/bench_gauge.txt"
  done
done
