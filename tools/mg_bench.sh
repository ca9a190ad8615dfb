#!/bin/bash
# Issue 7 benchmark: KD multigrid against mixed-precision CG at m = 0.001 on one GPU (tools/mg_bench.py says
# what is measured and how). Makes its own thermalized quenched field (no ../shared fixtures needed).
#   run with: bash tools/mg_bench.sh                       (L=32 by default; L=16 or L=24 for a smaller lattice)
#   env: L (lattice size; a list "16 32" runs each), BUDGET (seconds for the whole script, default 135),
#        MG_TOL, THERM, MG_NV, MG_SETUP_ITERS, MG_BLOCKS ("4,4,4,4 2,2,2,2"), MG_LEVELS, MG_COARSEST, HMC_BACKEND
# Out ($OUT): mg_bench.md and mg_bench.json (the last lattice that completed, else the last tried), and per
# lattice mg_bench_L<L>.{md,json,log}. If the requested lattice fails or runs out of time and at least 40 s are
# left, 16^4 is tried instead. Every step runs under timeout, so the script ends within BUDGET (+15 s grace).
set -u
OUT=${OUT:-/tmp/mg_bench_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-4}
BUDGET=${BUDGET:-135}
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
timeout 10 nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$OUT/gpu.txt" 2>&1

run_one() {   # run_one L SECONDS -> exit status of the driver
  local l=$1 t=$2
  echo "== mg_bench L=$l, $t s" | tee -a "$OUT/mg_bench_summary.txt"
  env -u L timeout -k 10 "$t" python3 tools/mg_bench.py --lattice "$l" --budget $(( t - 10 )) --out "$OUT" \
      > "$OUT/mg_bench_L$l.log" 2>&1
  local rc=$?
  echo "   rc $rc" | tee -a "$OUT/mg_bench_summary.txt"
  tail -3 "$OUT/mg_bench_L$l.log"
  return $rc
}

LAST=""; DONE=""
for l in ${L:-32}; do
  t=$(left); [ "$t" -lt 30 ] && { echo "== L=$l skipped: only $t s left" | tee -a "$OUT/mg_bench_summary.txt"; continue; }
  LAST=$l
  if run_one "$l" "$t"; then DONE=$l; fi
done
if [ -z "$DONE" ] && [ "${LAST:-0}" -gt 16 ] && [ "$(left)" -ge 40 ]; then
  LAST=16
  if run_one 16 "$(left)"; then DONE=16; fi
fi
PICK=${DONE:-$LAST}
if [ -n "$PICK" ] && [ -f "$OUT/mg_bench_L$PICK.json" ]; then
  cp "$OUT/mg_bench_L$PICK.json" "$OUT/mg_bench.json"
  cp "$OUT/mg_bench_L$PICK.md" "$OUT/mg_bench.md"
  cat "$OUT/mg_bench.md"
fi
echo "mg_bench.sh: $(( $(date +%s) - START )) s, completed lattice: ${DONE:-none}" | tee -a "$OUT/mg_bench_summary.txt"
[ -n "$DONE" ]
