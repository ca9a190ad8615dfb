#!/usr/bin/env bash
# One call on the GPU machine: the GPU test suite under MPS (about 220 s), then one short HISQ 2+1+1 RHMC
# trajectory on 1, 2 and 4 ranks sharing the GPU (hmc scaling --what rhmc, 16^4, stream_gated; hmc scaling starts
# its own MPS daemon). Files under $OUT: pytest_gpu.txt, rhmc16.h5, rhmc16_report.tar.gz (report.md and plots).
# Env: HMC_GIT_COMMIT (the device copy may carry a stale .git), T_SUITE / T_RHMC step limits (s), SKIP_SUITE=1.
# MILC's fixtures do not travel with ../shared: copy them into the ignored .fixtures/milc and carry .fixtures.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx HMC_COMMS_TIMEOUT=30
[ -d .fixtures/milc ] && export HMC_MILC_FIXTURES=$PWD/.fixtures/milc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
say() { echo "== $* ($(date +%T))"; }
nvidia-smi --query-gpu=name,driver_version --format=csv

if [ -z "${SKIP_SUITE:-}" ]; then
  say "GPU test suite under MPS"
  timeout "${T_SUITE:-330}" python3 -m comms.cuda.mps run -- python3 -m pytest -m gpu -q -p no:cacheprovider \
    --durations=10 >"$OUT/pytest_gpu.txt" 2>&1
  say "suite rc=$?"; tail -25 "$OUT/pytest_gpu.txt"
fi

say "RHMC trajectory on 1, 2, 4 ranks (16^4, stream_gated)"
timeout "${T_RHMC:-220}" python3 -m hmc --backend cupy scaling --lattice 16^4 --ranks 1 2 4 --transports stream_gated \
  --mps --what rhmc --repeats 2 --traj-steps 4 --timeout 100 -o "$OUT/rhmc16.h5" --report-dir /tmp/rhmc16_report
say "rhmc rc=$?"
[ -d /tmp/rhmc16_report ] && tar -C /tmp -czf "$OUT/rhmc16_report.tar.gz" rhmc16_report
say "done"
