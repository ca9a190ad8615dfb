#!/usr/bin/env bash
# One call on the GPU machine: the GPU test suite under MPS (about 220 s), then one short HISQ 2+1+1 RHMC
# trajectory on 1, 2 and 4 ranks sharing the GPU (hmc scaling --what rhmc, 16^4, stream_gated; hmc scaling starts
# its own MPS daemon). Files under $OUT: pytest_gpu.txt, rhmc<L>.h5, rhmc<L>_report.tar.gz (report.md and plots).
# Env: HMC_GIT_COMMIT (the device copy may carry a stale .git), T_SUITE / T_RHMC step limits (s), SKIP_SUITE=1,
# SUITE="paths" (test files instead of the whole GPU suite), RHMC_L="16 32" (the lattices, one study each).
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
  # shellcheck disable=SC2086
  timeout "${T_SUITE:-330}" python3 -m comms.cuda.mps run -- python3 -m pytest -m gpu -q -p no:cacheprovider \
    --durations=10 ${SUITE:-} >"$OUT/pytest_gpu.txt" 2>&1
  say "suite rc=$?"; tail -25 "$OUT/pytest_gpu.txt"
fi

for L in ${RHMC_L:-16}; do
  say "RHMC trajectory on 1, 2, 4 ranks (${L}^4, stream_gated)"
  timeout "${T_RHMC:-220}" python3 -m hmc --backend cupy scaling --lattice "${L}^4" --ranks 1 2 4 \
    --transports stream_gated --mps --what rhmc --repeats 2 --traj-steps 4 --timeout 200 -o "$OUT/rhmc$L.h5" \
    --report-dir "/tmp/rhmc${L}_report"
  say "rhmc $L rc=$?"
  [ -d "/tmp/rhmc${L}_report" ] && tar -C /tmp -czf "$OUT/rhmc${L}_report.tar.gz" "rhmc${L}_report"
done
say "done"
