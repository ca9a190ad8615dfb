#!/bin/bash
# reuse17 (issues 17, 19): the solvers' CUDA graphs kept across solves and link updates (GraphLoop.bind, operators
# kept by the RHMC monomial, link tables rebuilt in place). Run from the repository root on one H200:
#   bash tools/device/verify_reuse17.sh [pytest] [rhmc] [graph4] [traj32]   (all: ~230 s; works in /tmp/reuse17,
#   leaves reuse17.tgz under $OUT)
# Steps (arguments; default all): pytest: the GPU tests of the change (the kept graphs replay after a link update, the
# same bits as a fresh operator; also in gpu_suite.sh); rhmc: 16^4 RHMC trajectory on 1 / 2 / 4 ranks, event and
# stream_gated (issue 17: 2 ranks <= 0.5 x event and <= 2 x one rank, 4 ranks <= 3 x one rank; captures per
# trajectory in the study file's "graphs", and why they were captured: the WHY lines, solvers.krylov_graph
# capture_reason); graph4: the same, stream_gated, with 4 iterations per host check
# (HMC_SOLVER_GRAPH=4: fewer frozen iterations at each solve's end, twice the checks); traj32: the 32^4 production
# trajectory, 1 warm-up + TRAJ_N - 1 (issue 19; default TRAJ_N=2).
export PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
O=/tmp/reuse17; rm -rf "$O"; mkdir -p "$O"
T0=$(date +%s)
echo "reuse17, commit $(git rev-parse --short HEAD 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

STEPS=" ${*:-pytest rhmc graph4 traj32} "
want() { [[ "$STEPS" == *" $1 "* ]]; }

if want pytest; then
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/solvers/test_gpu_krylov_graph.py \
  tests/solvers/test_operator_reuse.py -k "kept_graphs or graph_iterates or reuse or rebuilt or conversions or bind" \
  > "$O/pytest_reuse.log" 2>&1
echo "pytest reuse rc=$? ($(( $(date +%s) - T0 )) s): $(tail -1 "$O/pytest_reuse.log")"
grep -E "^(FAILED|E  )" "$O/pytest_reuse.log" | head -20
fi

if want rhmc; then
s=$(date +%s)
# 3 repeats (the median): one-trajectory times varied by 15 % between calls on 2026-12-03 (runs/scaling/gpu_session15_2026-12-03)
timeout 160 python3 -m hmc --backend cupy scaling --lattice 16^4 --ranks 1 2 4 --transports event stream_gated --mps \
  --what rhmc --repeats ${RHMC_REPEATS:-3} -o "$O/rhmc.h5" --force --report-dir "$O/rhmc" > "$O/rhmc.log" 2>&1
echo "rhmc scaling rc=$? ($(( $(date +%s) - s )) s)"
grep -iE "graph|traj|stream_gated|event|serial" "$O/rhmc.log" | tail -30
grep -E "^\| [124] \|" "$O/rhmc/report.md" 2>/dev/null | head -12
fi

if want graph4; then
s=$(date +%s)
HMC_SOLVER_GRAPH=4 timeout 70 python3 -m hmc --backend cupy scaling --lattice 16^4 --ranks 1 2 4 --transports \
  stream_gated --mps --what rhmc --repeats 1 -o "$O/rhmc_graph4.h5" --force --report-dir "$O/rhmc_graph4" \
  > "$O/rhmc_graph4.log" 2>&1
echo "rhmc HMC_SOLVER_GRAPH=4 rc=$? ($(( $(date +%s) - s )) s)"
grep -E "^\| [124] \|" "$O/rhmc_graph4/report.md" 2>/dev/null | head -12
fi

if want traj32; then
s=$(date +%s)
OUT=$O TRAJ_N=${TRAJ_N:-2} TRAJ_T=150 bash tools/device/traj32.sh > "$O/traj32.log" 2>&1
echo "traj32 ($(( $(date +%s) - s )) s):"; grep -E "^traj|graphs|total" "$O/traj32.log" | tail -12
fi

echo "reuse17 done in $(( $(date +%s) - T0 )) s"
if [ -n "$OUT" ] && [ "$OUT" != "$O" ]; then
  (cd "$O" && timeout 30 tar czf "$OUT/reuse17.tgz" --exclude='traj32/*.h5' . 2>/dev/null)
  ls -la "$OUT"
fi
python3 tools/device/study_lines.py "$O" 'rhmc*.h5' rhmc
