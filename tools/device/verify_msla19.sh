#!/bin/bash
# msla19 (issue 19): parity-compact Krylov vectors of the multishift CG. One H200, budget 150 s. Run from the
# repository root: bash tools/device/verify_msla19.sh
export PYTHONPATH=.
. tools/device/gpu_tests.sh
OUTDIR=${OUT:-/tmp}
T0=$SECONDS
left() { echo $(( 145 - (SECONDS - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1

echo "== 1. GPU tests of the change (compact hop bitwise = full hop, fused_blas switch, CG and multishift compact = strided"
echo "      bitwise host-driven and in graphs, graph = host-driven) and the GPU HMC test"
gpu_tests step1 75 12 tests/solvers/test_gpu_staggered.py \
    tests/solvers/test_gpu_blas.py tests/solvers/test_gpu_krylov_graph.py tests/hmc/test_gpu_hmc.py

echo "== 2. profile at 32^4: operator vs multishift iteration, compact vs strided Krylov vectors"
t=$(left); [ "$t" -gt 55 ] && t=55
timeout "$t" python3 tools/profile_md_solve.py 32 --layouts --repeat 2 --json "$OUTDIR/msla19_profile.json" 2>&1 \
    | grep -v '^ \|^{\|^}'
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then echo "PASS step2 profile"; else echo "FAIL step2 profile (rc $rc; 124 = timeout ${t} s)"; fi

echo "== 3. the other GPU solver tests, in the time left"
t=$(left)
if [ "$t" -gt 10 ]; then
    timeout "$t" python3 -m pytest -q -m gpu -p no:cacheprovider tests/solvers \
        --ignore=tests/solvers/test_gpu_staggered.py --ignore=tests/solvers/test_gpu_blas.py \
        --ignore=tests/solvers/test_gpu_krylov_graph.py 2>&1 | tail -8
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then echo "PASS step3 other gpu solver tests"; elif [ "$rc" = 124 ]; then \
        echo "INCOMPLETE step3 other gpu solver tests (ran out of the $t s left)"; \
    else echo "FAIL step3 other gpu solver tests (rc $rc)"; fi
else
    echo "SKIPPED step3 (no time left)"
fi
echo "total $((SECONDS - T0)) s"
