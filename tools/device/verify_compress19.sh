#!/bin/bash
# Long-link compression of the GPU hop (issue 19, docs/perf-notes.md "Long-link compression"). One H200, budget
# ~180 s. Run from the repository root: bash tools/device/verify_compress19.sh
export PYTHONPATH=.
. tools/device/gpu_tests.sh
T0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1

echo "== 1. GPU tests: the compressed hop against the NumPy hop; the GPU staggered, solver and HMC tests (their"
echo "      HISQ links are compressed now; their random-link operators stay whole)"
gpu_tests step1 90 8 tests/solvers/test_long_link_compression.py \
    tests/solvers/test_gpu_staggered.py tests/solvers/test_gpu_solvers.py tests/hmc/test_gpu_hmc.py

echo "== 2. hmc bench dslash at 32^4: compressed (1) against whole (0) Naik links, double and single"
for prec in double single; do
    for c in 1 0; do
        echo "-- HMC_DSLASH_COMPRESS_LONG=$c $prec"
        HMC_DSLASH_COMPRESS_LONG=$c timeout 40 python3 -m hmc --backend cupy bench dslash --lattice 32 32 32 32 \
            --precision "$prec" --repeat 20 2>&1 | grep -E "hop|CG iteration|Error|error"
    done
done
echo "== 3. the cost of building a table at 32^4 (once per link update and precision: ~150 a trajectory)"
timeout 60 python3 - <<'PY'
import time
import cupy as cp
from lattice import CounterRNG, Geometry, get_backend
from bench.dslash import timing_links
from solvers import StaggeredDslash
from solvers.staggered_cuda import link_table
geom = Geometry((32, 32, 32, 32), get_backend("cupy"))
d = StaggeredDslash(geom, *timing_links(geom, CounterRNG(3)))
for dtype in ("complex128", "complex64"):
    dd = d.converted(dtype)
    blocks = dd._links[0]
    for compress in (True, False):
        table, compressed = dd._hop_impl._build_table(blocks, compress)
        twin, _ = link_table(blocks, cp, compress)
        print(f"TABLE {dtype} compress={compress}: kernel vs twin max |diff| {float(abs(table - twin).max()):.2e}")
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            table, compressed = dd._hop_impl._build_table(blocks, compress)
        cp.cuda.Device().synchronize()
        print(f"TABLE {dtype} compress={compress}: {(time.perf_counter() - t0) / 5 * 1e3:.2f} ms a parity, "
              f"compressed {compressed}, {table.nbytes / 1e9:.2f} GB")
PY
echo "total $((SECONDS - T0)) s"
