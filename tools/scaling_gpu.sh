#!/usr/bin/env bash
# The GPU strong-scaling study of issue 8 in one command (tools/final_device.sh calls it on the device machine):
# 8^4 and 16^4 on 1, 2 and 4 ranks sharing the GPU, transports mpi, event and stream_gated, stream_gated also
# replayed from CUDA graphs (--graph), the MPS daemon started and stopped by hmc scaling itself (--mps); halo,
# dslash and CG. Writes $OUT/gpu_scaling.tar.gz (gpu2.h5 and the report folder gpu2/: report.md and the PNG plots;
# unpack into runs/scaling/) and $OUT/gpu_scaling_report.md (the report alone, to read at once): two files, so
# that the device call's limit of 8 returned files is kept. Time: 18 configurations of ~6-8 s each (start-up, kernels,
# timed loops of --min-time 0.1 s, the latency sweep), capped at T_SCALING (default 180 s): a study cut there keeps
# every finished configuration, and its report is drawn from the file.
#
# Check the script on a CPU machine (same command line, CPU transports, tiny sizes):
#   BACKEND=numpy TRANSPORTS="mpi shm" GRAPH= MPS= LATTICES="4^4" REPEATS=2 \
#   EXTRA="--min-time 0.01 --cg-iters 3 --halo-sizes 2" OUT=/tmp/out bash tools/scaling_gpu.sh
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BACKEND=${BACKEND:-cupy}
TRANSPORTS=${TRANSPORTS:-mpi event stream_gated}
LATTICES=${LATTICES:-8^4 16^4}
GRAPH=${GRAPH---graph}
MPS=${MPS---mps}
NAME=${NAME:-gpu2}
DIR=${SCALING_DIR:-/tmp/hmc_scaling}
rm -rf "$DIR"; mkdir -p "$DIR"
lat=(); for l in $LATTICES; do lat+=(--lattice "$l"); done
# the hand-started MPS of the calling script (if any) must not serve the driver: hmc scaling --mps starts its own
# shellcheck disable=SC2086
env -u CUDA_MPS_PIPE_DIRECTORY -u CUDA_MPS_LOG_DIRECTORY timeout --signal=INT --kill-after=15 "${T_SCALING:-180}" \
  python3 -m hmc --backend "$BACKEND" scaling "${lat[@]}" --ranks 1 2 4 --transports $TRANSPORTS $GRAPH $MPS \
  --what halo,dslash,cg --repeats "${REPEATS:-3}" --min-time "${MIN_TIME:-0.1}" --timeout "${T_CONFIG:-90}" ${EXTRA:-} \
  -o "$DIR/$NAME.h5" --report-dir "$DIR/$NAME"
rc=$?
echo "hmc scaling rc=$rc"
# an interrupted study (time limit) still has every finished configuration: draw its report from the file
if [ -f "$DIR/$NAME.h5" ]; then
  python3 -m hmc scaling report "$DIR/$NAME.h5" -o "$DIR/$NAME" >/dev/null || echo "hmc scaling report failed"
  cp "$DIR/$NAME/report.md" "$OUT/gpu_scaling_report.md" 2>/dev/null
  tar -C "$DIR" -czf "$OUT/gpu_scaling.tar.gz" "$NAME.h5" "$NAME"
  echo "study: $OUT/gpu_scaling.tar.gz ($(tar -tzf "$OUT/gpu_scaling.tar.gz" | wc -l) entries)"
fi
exit $rc
