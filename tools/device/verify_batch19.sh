#!/bin/bash
# batch19 (issue 19; session 15, written without a GPU): run from the repository root on one H200,
#   bash tools/device/verify_batch19.sh [pytest] [solve] [traj]        (all: ~200 s estimated)
# The refinement's starting true residuals with the shifts' products batched (HMC_BATCHED_HOPS=1: the hop_many
# kernel reads each hop's links once for up to 4 fields; default 0 until this has run):
# pytest: the batched hop equals one hop each bitwise, the refinement from the batched residuals equals the unbatched;
# solve: tools/shift_stop_study.py 32 with HMC_BATCHED_HOPS 0 and 1 (the light MD solve: cgprec 1's 9 refinements);
# traj: the 32^4 production trajectory (traj32.sh, 3 trajectories) with HMC_BATCHED_HOPS=1, against the same
#   command's default (14.84 / 15.17 s for trajectories 1 and 2 on 2026-12-03; ~1332 refinement starts a trajectory,
#   each a double A product of ~0.78 ms unbatched).
export PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T0=$(date +%s)
STEPS=" ${*:-pytest solve traj} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
echo "batch19, commit $(git rev-parse --short HEAD 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if want pytest; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/solvers/test_batched_hops.py 2>&1 | tail -4
  echo "pytest ($(( $(date +%s) - T0 )) s)"
fi
if want solve; then
  for B in 0 1; do
    echo "-- HMC_BATCHED_HOPS=$B"
    HMC_BATCHED_HOPS=$B timeout 90 python3 tools/shift_stop_study.py 32 --backend cupy 2>&1 | tail -2
  done
  echo "solve ($(( $(date +%s) - T0 )) s)"
fi
if want traj; then
  HMC_BATCHED_HOPS=1 TRAJ_N=3 TRAJ_T=150 bash tools/device/traj32.sh 2>&1 | grep -E "^traj|total|exit"
  echo "traj ($(( $(date +%s) - T0 )) s)"
fi
echo "batch19 done in $(( $(date +%s) - T0 )) s"
