#!/usr/bin/env bash
# One call on the GPU machine for the closing checks: the whole GPU test subset (MILC fixtures carried in
# .fixtures/milc), a strong-scaling study with the GPU transports (tools/scaling_gpu.sh: 8^4 and 16^4 on 1, 2 and 4
# ranks sharing the H200, mpi, event and stream_gated, stream_gated also as CUDA-graph replays; hmc scaling starts
# and stops its own MPS daemon, --mps), and one 2+1+1 RHMC trajectory on 16^4. Three files come back: log.txt,
# gpu_scaling.tar.gz (the study's file, report and plots: unpack into runs/scaling/) and gpu_scaling_report.md.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx HMC_COMMS_TIMEOUT=30
[ -d .fixtures/milc ] && export HMC_MILC_FIXTURES=$PWD/.fixtures/milc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/log.txt
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }
MPSDIR=$(mktemp -d /tmp/hmc-mps-XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$MPSDIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPSDIR/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d >>"$LOG" 2>&1 && say "MPS started" || say "MPS failed to start"

say "GPU tests"
timeout ${T_TESTS:-240} python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -40 >>"$LOG"

say "scaling study with GPU transports (ranks share one H200; hmc scaling --mps runs its own MPS daemon)"
echo quit | nvidia-cuda-mps-control >>"$LOG" 2>&1; sleep 2     # the hand-started daemon steps aside
# at most T_SCALING (180 s) + 20: with the tests (240) and the RHMC trajectory (150) the call stays within 600 s
T_SCALING=${T_SCALING:-180} timeout $(( ${T_SCALING:-180} + 20 )) bash tools/scaling_gpu.sh >>"$LOG" 2>&1
say "scaling rc=$?"
nvidia-cuda-mps-control -d >>"$LOG" 2>&1 && say "MPS started again" || say "MPS failed to start again"

say "RHMC 2+1+1 trajectory on 16^4 (GPU)"
TRAJ=1 GPU_SIZES="16" SKIP_CPU=1 OUT=/tmp/bench_rhmc timeout ${T_RHMC:-150} bash tools/bench_rhmc.sh >>"$LOG" 2>&1
say "rhmc rc=$?"
echo quit | nvidia-cuda-mps-control >>"$LOG" 2>&1
say "done"
