#!/bin/bash
# while17 (issues 17, 19, 18; session 14, written without a GPU): run from the repository root on one H200,
#   bash tools/device/verify_while17.sh [pytest] [time] [shifts] [mg]   (all: ~300 s estimated; while17.tgz in $OUT)
# pytest: the GPU tests of session 14's changes: the frozen iterations' early return (the device-resident iterates
#   bitwise the host-driven ones for 1, 3, 8 iterations a graph), the device-side while loop (HMC_SOLVER_GRAPH_WHILE:
#   same iterates, far fewer launches; a refused while graph fails with its reason), the multigrid's batched inner
#   products (kernels/multi_dot.cu against NumPy; the multigrid graph tests);
# time: issue 17's "measure both": host checks every 8 iterations (HMC_SOLVER_GRAPH_WHILE=0) against the while loop
#   with bodies of 1, 2 and 4 iterations, one rank: the production CG iteration at 16^4 and 32^4 (whole solves of
#   200 iterations) and the 16^4 RHMC trajectory;
# shifts: tools/shift_stop_study.py 32 (issue 19: the light MD solve with and without the converged shifts stopped,
#   the production decks' new stop_converged_shifts; 8^4 CPU: 28 % of the shift updates left);
# mg: verify_mgcap18.sh (level-3 time per application at 32^4 with the batched products; 0.42 ms before).
export PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
O=/tmp/while17; rm -rf "$O"; mkdir -p "$O"
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "while17, commit $(git rev-parse --short HEAD 2>/dev/null), $GPU"
STEPS=" ${*:-pytest time shifts mg} "
want() { [[ "$STEPS" == *" $1 "* ]]; }

if want pytest; then
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/solvers/test_gpu_krylov_graph.py \
  tests/solvers/test_multigrid_multi_dot.py tests/solvers/test_operator_reuse.py \
  tests/solvers/test_solver_graph_while.py tests/solvers/test_multigrid_graph.py tests/solvers/test_multigrid_kernels.py \
  > "$O/pytest.log" 2>&1
echo "pytest rc=$? ($(( $(date +%s) - T0 )) s): $(tail -1 "$O/pytest.log")"
grep -E "^(FAILED|ERROR|E  )" "$O/pytest.log" | head -30
fi

if want time; then
for W in 0 1 2 4; do
  s=$(date +%s)
  HMC_SOLVER_GRAPH_WHILE=$W timeout 60 python3 -m hmc --backend cupy scaling --lattice 16^4 --lattice 32^4 --ranks 1 \
    --what cg --cg-iters 200 --halo-sizes --repeats 3 -o "$O/cg_w$W.h5" --force --report-dir "$O/cg_w$W" \
    > "$O/cg_w$W.log" 2>&1
  echo "cg HMC_SOLVER_GRAPH_WHILE=$W rc=$? ($(( $(date +%s) - s )) s)"; grep -iE "warn|error" "$O/cg_w$W.log" | head -3
  grep -E "^\| *(cg|1) " "$O/cg_w$W/report.md" 2>/dev/null | head -6
  s=$(date +%s)
  HMC_SOLVER_GRAPH_WHILE=$W timeout 45 python3 -m hmc --backend cupy scaling --lattice 16^4 --ranks 1 --what rhmc \
    --repeats 1 -o "$O/rhmc_w$W.h5" --force --report-dir "$O/rhmc_w$W" > "$O/rhmc_w$W.log" 2>&1
  echo "rhmc HMC_SOLVER_GRAPH_WHILE=$W rc=$? ($(( $(date +%s) - s )) s)"
  grep -E "^\| 1 \|" "$O/rhmc_w$W/report.md" 2>/dev/null | head -4
done
python3 tools/device/study_lines.py "$O" '*_w*.h5' cg rhmc
fi

if want shifts; then
s=$(date +%s)
timeout 120 python3 tools/shift_stop_study.py 32 --backend cupy > "$O/shift_stop_32.log" 2>&1
echo "shift_stop_study 32 rc=$? ($(( $(date +%s) - s )) s)"; cat "$O/shift_stop_32.log" | tail -6
fi

if want mg; then
s=$(date +%s)
timeout 150 bash tools/device/verify_mgcap18.sh > "$O/mgcap18.log" 2>&1
echo "verify_mgcap18 rc=$? ($(( $(date +%s) - s )) s)"
grep -iE "level 3|level-3|solve|PASS|FAIL" "$O/mgcap18.log" | tail -20
fi

echo "while17 done in $(( $(date +%s) - T0 )) s"
if [ -n "$OUT" ] && [ "$OUT" != "$O" ]; then
  (cd "$O" && timeout 30 tar czf "$OUT/while17.tgz" . 2>/dev/null)
  ls -la "$OUT"
fi
