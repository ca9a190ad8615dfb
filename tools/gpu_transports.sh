#!/usr/bin/env bash
# GPU halo transports on the device machine, in one call: smoke checks, the GPU transport tests and the halo
# benchmark, the multi-rank parts under MPS (started here, stopped at the end; whether it ran is logged), then the
# benchmark again without MPS. Logs and JSON under $OUT (at most 8 files come back: everything small is packed into
# reports.tgz).
# Usage there: bash tools/gpu_transports.sh [all|smoke|tests|bench|dist|distbench|distall|legacy] [pytest args...]
# (dist: the distributed GPU Dslash/CG tests; distbench: hmc bench dslash per transport on 2 and 4 ranks;
#  legacy: the legacy CUDA IPC allocation, HMC_P2P_ALLOC=legacy: a smoke run of each transport, then
#  test_legacy_ipc_allocation; never run on a GPU before the session that wrote it. `all` runs it after smoke.)
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx
export HMC_COMMS_TIMEOUT=${HMC_COMMS_TIMEOUT:-30} HMC_GPU_TEST_TIMEOUT=${HMC_GPU_TEST_TIMEOUT:-90}
MODE=${1:-all}; shift || true
OUT=${OUT:-/tmp/out}
REP=$OUT/rep; mkdir -p "$REP"
export HMC_GPU_REPORT_DIR=$REP
LOG=$OUT/log.txt
say() { echo "== $*" | tee -a "$LOG"; }
MPIRUN="mpiexec --oversubscribe"
T0=$(date +%s)

{ nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv
  python3 -c 'import cupy, mpi4py, cuda.bindings as cb; print("cupy", cupy.__version__, "cuda-bindings", cb.__version__, "mpi4py", mpi4py.__version__)'
  mpiexec --version | head -1; } 2>&1 | tee -a "$LOG"

# --- MPS for everything below (pipe and log directories private to this run)
MPSDIR=$(mktemp -d /tmp/hmc-mps-XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$MPSDIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPSDIR/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if nvidia-cuda-mps-control -d >>"$LOG" 2>&1; then MPS=started; else MPS="failed to start"; fi
say "mps: $MPS"
mps_servers() { echo get_server_list | nvidia-cuda-mps-control 2>/dev/null | tr '\n' ' '; }

smoke() {
  for tr in stream_gated event; do
    say "smoke $tr (2 ranks, 1x1x1x2, partition xt)"
    timeout 75 $MPIRUN -n 2 python3 -m comms.cuda.checks halo "$REP/smoke_$tr" --transports $tr --partition xt \
      --iters 20 >>"$LOG" 2>&1; rc=$?
    say "smoke $tr rc=$rc (mps servers: $(mps_servers))"
  done
}

legacy() {
  for tr in stream_gated event; do
    say "legacy IPC smoke $tr (2 ranks, 1x1x1x2, partition xt, HMC_P2P_ALLOC=legacy)"
    HMC_P2P_ALLOC=legacy timeout 75 $MPIRUN -n 2 python3 -m comms.cuda.checks halo "$REP/legacy_smoke_$tr" \
      --transports $tr --partition xt --iters 20 >>"$LOG" 2>&1; rc=$?
    say "legacy IPC smoke $tr rc=$rc (mps servers: $(mps_servers))"
  done
  say "pytest tests/comms/test_gpu_transports.py -k legacy"
  timeout ${LEGACY_BUDGET:-120} python3 -m pytest tests/comms/test_gpu_transports.py -q -p no:cacheprovider -rA \
    -k legacy 2>&1 | tee "$OUT/pytest_legacy.txt" | tail -30 | tee -a "$LOG"
  say "legacy done (mps servers: $(mps_servers))"
}

tests() {
  say "pytest tests/comms/test_gpu_transports.py"
  timeout ${TEST_BUDGET:-170} python3 -m pytest tests/comms/test_gpu_transports.py -q -p no:cacheprovider -rA \
    "$@" 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -40 | tee -a "$LOG"
  say "pytest done (mps servers: $(mps_servers))"
}

bench() {
  say "bench under MPS: 2 ranks, mpi/event/stream_gated, --graph"
  timeout ${BENCH_BUDGET:-70} $MPIRUN -n 2 python3 -m comms.cuda.bench --transport mpi,event,stream_gated \
    --sizes 2 4 8 16 32 --graph --json "$OUT/bench_mps.json" --label "2 ranks, one H200" 2>&1 | tee -a "$LOG"
  say "mps servers during bench: $(mps_servers)"
  say "bench under MPS: 4 ranks (ring along t)"
  timeout ${BENCH4_BUDGET:-40} $MPIRUN -n 4 python3 -m comms.cuda.bench --transport mpi,event,stream_gated \
    --sizes 2 8 32 --reps 100 --repeats 3 --graph --graph-reps 200 --json "$REP/bench_mps_4ranks.json" \
    --label "4 ranks, one H200" 2>&1 | tee -a "$LOG"
  say "hmc bench halo --transport mpi,event,stream_gated (the CLI path)"
  timeout 40 $MPIRUN -n 2 python3 -m hmc bench halo --transport mpi,event,stream_gated --sizes 2 8 --element vector \
    2>&1 | tail -12 | tee -a "$LOG"
}

dist() {
  say "pytest tests/solvers/test_gpu_distributed.py (distributed GPU Dslash and CG, 2 and 4 ranks)"
  timeout ${DIST_BUDGET:-240} python3 -m pytest tests/solvers/test_gpu_distributed.py -q -p no:cacheprovider -rA \
    "$@" 2>&1 | tee "$OUT/pytest_dist.txt" | tail -40 | tee -a "$LOG"
  say "dist tests done (mps servers: $(mps_servers))"
}

distbench() {
  # hmc bench dslash on the distributed GPU hop: every transport, graph-captured stream_gated, local L^4 per rank;
  # DIST_CONNS="default 32" repeats it with CUDA_DEVICE_MAX_CONNECTIONS=32 (hardware queues per process)
  for conns in ${DIST_CONNS:-default}; do
    for spec in "2 1 1 1 2" "4 1 1 2 2"; do
      set -- $spec; n=$1; shift
      locs=${DIST_LOCALS:-4 8 16}
      if [ "$conns" != default ]; then locs=${DIST_LOCALS_CONNS:-4 8}; fi
      say "hmc bench dslash: $n ranks, grid $*, local $locs, CUDA_DEVICE_MAX_CONNECTIONS=$conns"
      ( if [ "$conns" != default ]; then export CUDA_DEVICE_MAX_CONNECTIONS=$conns; fi
        timeout ${DISTBENCH_BUDGET:-150} $MPIRUN -n $n python3 -m hmc --backend cupy \
          --grid "$@" bench dslash --local $locs --transports mpi,event,stream_gated --graph \
          --reps ${DIST_REPS:-100} --out "$OUT/dist_bench_${n}_conns_$conns.json" 2>&1 \
          | grep -v "^comms: \(fabric\|remote_write\)" | tee -a "$LOG" )
    done
  done
  say "mps servers during distbench: $(mps_servers)"
}

case $MODE in
  smoke) smoke ;;
  tests) tests "$@" ;;
  bench) bench ;;
  all) smoke; legacy; tests -k "not legacy" "$@"; bench ;;
  legacy) legacy ;;
  dist) dist "$@" ;;
  distbench) distbench ;;
  distall) dist "$@"; distbench ;;
esac

echo quit | nvidia-cuda-mps-control >>"$LOG" 2>&1
sleep 1
say "mps: stopped; control log tail:"; tail -5 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null | tee -a "$LOG"
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  say "bench without MPS: 2 ranks time-slice the GPU"
  timeout ${NOMPS_BUDGET:-50} $MPIRUN -n 2 python3 -m comms.cuda.bench --transport mpi,event,stream_gated \
    --sizes 2 8 32 --reps 60 --repeats 3 --graph --graph-reps 100 --json "$OUT/bench_nomps.json" \
    --label "2 ranks, one H200, no MPS" 2>&1 | tee -a "$LOG"
fi
rm -rf "$MPSDIR"
(cd "$REP" && tar czf "$OUT/reports.tgz" . 2>/dev/null) && rm -rf "$REP"
say "total $(( $(date +%s) - T0 )) s"
