#!/usr/bin/env bash
# One call on the GPU machine: the GPU test subset, then the benchmarks, logs under $OUT.
# Usage there: bash tools/device_checks.sh [pytest-args...]
# MILC's fixtures do not travel with ../shared: copy them into the ignored folder .fixtures/milc here and name
# .fixtures in the call's carry list; the tests find them through HMC_MILC_FIXTURES.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
[ -d .fixtures/milc ] && export HMC_MILC_FIXTURES=$PWD/.fixtures/milc
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -30
[ -n "${SKIP_BENCH:-}" ] && exit 0
for a in wilson symanzik; do
  for L in 8 16 32; do
    python3 -m hmc --backend cupy bench gauge --lattice $L $L $L $L --action $a --repeat 5 2>&1 | tee -a "$OUT/bench_gauge.txt"
  done
done
