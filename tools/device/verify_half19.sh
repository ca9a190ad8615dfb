#!/bin/bash
# Half-precision links (solvers.half_links, HMC_DSLASH_HALF_LINKS; issue 19): 1) the GPU tests of the hop kernels
# (load_link now serves every table form); 2) the 32^4 hop in double, single and half; 3) the light MD solve of
# tools/shift_stop_study.py with single and half links; 4) the 32^4 production trajectory with and without half
# links, TRAJ_N each (the median of trajectories 2..TRAJ_N). ~400 s with TRAJ_N=4. From the repository root.
cd "$(dirname "$0")/../.." || exit 1
export PYTHONPATH=. PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. tools/device/gpu_tests.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gpu_tests half 240 6 tests/solvers/test_half_links.py tests/solvers/test_long_link_compression.py \
    tests/solvers/test_batched_hops.py tests/solvers/test_gpu_staggered.py tests/solvers/test_compact_layout.py
for p in double single half; do
    timeout 90 python3 -m hmc --backend cupy bench dslash --lattice 32 32 32 32 --precision $p --repeat 20 2>&1 | tail -3
done
for h in 0 1; do
    echo "== light MD solve, HMC_DSLASH_HALF_LINKS=$h"
    HMC_DSLASH_HALF_LINKS=$h timeout 150 python3 tools/shift_stop_study.py 32 --backend cupy 2>&1 | tail -5
done
N=${TRAJ_N:-4}
for h in 1 0; do
    echo "== 32^4 trajectory, HMC_DSLASH_HALF_LINKS=$h"
    HMC_DSLASH_HALF_LINKS=$h TRAJ_N=$N TRAJ_T=${TRAJ_T:-150} OUT=${OUT:-/tmp}/half$h bash tools/device/traj32.sh \
        | grep -v "^[a-z_0-9]*\.\(h5\|toml\|log\|err\|json\)$"
done
