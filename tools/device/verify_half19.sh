#!/bin/bash
# Half-precision links (solvers.half_links, HMC_DSLASH_HALF_LINKS = naik | all; issue 19): 1) the GPU tests of the
# hop kernels (load_link serves every table form); 2) the 32^4 hop in single and in both half forms; 3) the 32^4
# production trajectory with the Naik links in 16 bits and without, TRAJ_N each (the median of trajectories
# 2..TRAJ_N; session 19's first call timed "all" and the light MD solve: runs/rhmc/README.md). ~330 s with TRAJ_N=4.
# From the repository root.
cd "$(dirname "$0")/../.." || exit 1
export PYTHONPATH=. PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. tools/device/gpu_tests.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gpu_tests half 240 6 tests/solvers/test_half_links.py tests/solvers/test_long_link_compression.py \
    tests/solvers/test_batched_hops.py tests/solvers/test_gpu_staggered.py tests/solvers/test_compact_layout.py
for p in single half-naik half; do
    timeout 90 python3 -m hmc --backend cupy bench dslash --lattice 32 32 32 32 --precision $p --repeat 20 2>&1 \
        | tail -3
done
N=${TRAJ_N:-4}
for h in naik off; do
    echo "== 32^4 trajectory, HMC_DSLASH_HALF_LINKS=$h"
    HMC_DSLASH_HALF_LINKS=$h TRAJ_N=$N TRAJ_T=${TRAJ_T:-150} OUT=${OUT:-/tmp}/half_$h \
        bash tools/device/traj32.sh | grep -v "^[a-z_0-9]*\.\(h5\|toml\|log\|err\|json\)$"
    rm -f ${OUT:-/tmp}/half_$h/traj32/*.h5
done
