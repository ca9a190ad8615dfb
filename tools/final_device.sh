#!/usr/bin/env bash
# One call on the GPU machine for the closing measurements, in order of priority (each step under its own timeout, so
# that a cut call still returns what the earlier steps wrote):
#   1. the GPU strong-scaling study (tools/scaling_gpu.sh: 8^4 and 16^4 on 1, 2 and 4 ranks sharing the H200; mpi,
#      event, stream_gated, stream_gated as CUDA-graph replays; hmc scaling starts and stops its own MPS daemon)
#   2. a short HISQ 2+1+1 RHMC trajectory on 2 and 4 ranks through event / stream_gated / mpi against 1 rank
#      (tests/hmc/test_gpu_hmc_dist.py, under a hand-started MPS daemon)
#   3. one 2+1+1 RHMC trajectory on 32^4 (tools/bench_rhmc.sh)
#   4. multigrid against mixed-precision CG at m = 0.001 on 16^4 and 32^4 (tools/mg_bench.sh)
# Files back: log.txt, gpu_scaling.tar.gz + gpu_scaling_report.md (unpack into runs/scaling/), hmc_dist.tar.gz,
# bench_rhmc.tar.gz, mg_bench.tar.gz.   Env: HMC_GIT_COMMIT (the device copy has no .git), T_* step limits.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx HMC_COMMS_TIMEOUT=30
[ -d .fixtures/milc ] && export HMC_MILC_FIXTURES=$PWD/.fixtures/milc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/log.txt
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$LOG" 2>&1

say "1. scaling study with GPU transports (hmc scaling --mps runs its own MPS daemon)"
T_SCALING=${T_SCALING:-150} timeout $(( ${T_SCALING:-150} + 20 )) bash tools/scaling_gpu.sh >>"$LOG" 2>&1
say "scaling rc=$?"

MPSDIR=$(mktemp -d /tmp/hmc-mps-XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$MPSDIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPSDIR/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d >>"$LOG" 2>&1 && say "MPS started" || say "MPS failed to start"
say "2. distributed GPU RHMC trajectory = 1 rank (event, stream_gated, mpi; 2 and 4 ranks)"
mkdir -p /tmp/hmc_dist
HMC_GPU_REPORT_DIR=/tmp/hmc_dist timeout ${T_DIST:-110} python3 -m pytest tests/hmc/test_gpu_hmc_dist.py -m gpu -q -rA \
  -p no:cacheprovider --durations=0 >/tmp/hmc_dist/pytest.txt 2>&1
say "hmc_dist rc=$?"; tail -15 /tmp/hmc_dist/pytest.txt >>"$LOG"
tar -C /tmp -czf "$OUT/hmc_dist.tar.gz" hmc_dist
echo quit | nvidia-cuda-mps-control >>"$LOG" 2>&1; sleep 1

say "3. RHMC 2+1+1 trajectory on 32^4 (GPU)"
TRAJ=1 GPU_SIZES="32" SKIP_CPU=1 OUT=/tmp/bench_rhmc timeout ${T_RHMC:-100} bash tools/bench_rhmc.sh >>"$LOG" 2>&1
say "rhmc rc=$?"
tar --exclude='*.h5' -C /tmp -czf "$OUT/bench_rhmc.tar.gz" bench_rhmc

say "4. multigrid vs mixed CG at m = 0.001"
L=${MG_L:-"16 32"} BUDGET=${T_MG:-130} OUT=/tmp/mg_bench timeout $(( ${T_MG:-130} + 20 )) bash tools/mg_bench.sh >>"$LOG" 2>&1
say "mg rc=$?"
tar -C /tmp -czf "$OUT/mg_bench.tar.gz" mg_bench
say "done"
