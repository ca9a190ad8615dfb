#!/usr/bin/env bash
# Issue 9 on a multi-GPU host (one rank per GPU; NVLink multicast off): halo latency per transport and face size
# (comms.cuda.bench: device and host time, with graph capture), then a strong-scaling study of the HISQ Dslash and CG
# at 32^4 over 1..NGPU GPUs per transport, stream_gated also as CUDA-graph replays (hmc scaling, answers checked
# against the 1-rank run). Files into $OUT: log.txt, halo_<n>gpu.json, multi_gpu.tar.gz (study .h5 + report + plots).
#   usage (repository root, on the device):  bash tools/multi_gpu.sh     env: NGPU (default: all visible), T_* limits
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx HMC_COMMS_TIMEOUT=30
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/log.txt
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
mkdir -p /tmp/mgpu; nvidia-smi -L >>"$LOG" 2>&1; nvidia-smi topo -m >>"$LOG" 2>&1
ranks=""; n=1; while [ "$n" -le "$NGPU" ]; do ranks="$ranks $n"; n=$((n * 2)); done

say "halo latency, $NGPU ranks on $NGPU GPUs"
timeout ${T_HALO:-45} mpiexec --oversubscribe -n "$NGPU" python3 -m comms.cuda.bench --transport mpi,event,stream_gated \
  --sizes 2 8 16 32 --reps 100 --repeats 3 --graph --graph-reps 200 --json "$OUT/halo_${NGPU}gpu.json" \
  --label "$NGPU ranks, one per H200" >>"$LOG" 2>&1
say "halo rc=$?"

say "strong scaling 32^4, ranks$ranks, one per GPU"
timeout --signal=INT --kill-after=15 ${T_SCALING:-110} python3 -m hmc --backend cupy scaling --lattice 32^4 \
  --ranks $ranks --transports mpi event stream_gated --graph --what halo,dslash,cg --repeats 3 --min-time 0.1 \
  --timeout 60 -o /tmp/mgpu/multi_gpu.h5 --report-dir /tmp/mgpu/multi_gpu >>"$LOG" 2>&1
say "scaling rc=$?"
[ -f /tmp/mgpu/multi_gpu.h5 ] && python3 -m hmc scaling report /tmp/mgpu/multi_gpu.h5 -o /tmp/mgpu/multi_gpu >/dev/null 2>&1
tar -C /tmp/mgpu -czf "$OUT/multi_gpu.tar.gz" . 2>>"$LOG"
say "done"
