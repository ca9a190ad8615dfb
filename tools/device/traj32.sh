#!/bin/bash
# 32^4 production trajectories (issue 19): 1 warm-up + 5, the median of the 5.
export PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUTD=${OUT:-/tmp}/traj32
timeout ${TRAJ_T:-300} python3 -m hmc --backend cupy bench rhmc --lattice 32 --deck runs/hisq211_16.toml --trajectories ${TRAJ_N:-6} --steps 36 --cgprec 1 2 2 --out $OUTD 2>&1 | awk '!/^        / || /solver CUDA graphs/' | tail -40
ls $OUTD
