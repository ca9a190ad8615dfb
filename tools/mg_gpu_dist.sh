#!/usr/bin/env bash
# Issue 7 on the device machine (one H200; the ranks share it under MPS, started here and stopped at the end):
#  1. the distributed multigrid-kernel tests (tests/solvers/test_multigrid_dist_kernels.py,
#     tests/lattice/test_gpu_halo_device.py): 2 and 4 ranks, transports mpi, event, stream_gated, against the
#     single-rank GPU solve; faces device to device with the GPU engine;
#  2. a made field (cold start and THERM pure-gauge MD trajectories of Wilson beta 6.0 on L^4, written as a MILC
#     file outside $OUT), then `hmc --backend cupy solve FIELD --solver mg --mass 0.001` on 1, 2 (grid 1 1 1 2) and
#     4 (grid 1 1 2 2) ranks x mpi/event/stream_gated (one run on 1 rank: no exchange), printing the per-level split
#     (compute / halo exchange / reductions) of each run. Four levels (4^4 then 2^4 aggregates) so that the coarse
#     stencil runs inside a K-cycle (with three levels the coarsest is the LU and its stencil is never applied).
#
# Usage there: bash tools/mg_gpu_dist.sh   (OUT=... for the outputs; about 200 s; every step under timeout, the
# whole script within BUDGET, default 235 s, later steps skipped with a line saying so when time runs short)
# Outputs in $OUT: log.txt (everything), split.txt (the per-level lines of every solve), pytest.txt, solves.json
# (each run's --json result), reports.tgz (the tests' JSON reports). At most 8 files.
# env: L (16), MASS (0.001), THERM (4), RANKS ("1 2 4"), TRANSPORTS ("mpi event stream_gated"), MG_NV (24),
#      MG_SETUP_ITERS (20), MG_LEVELS (4), TOL (1e-8), BACKEND (cupy), TESTS (1; 0 skips them), BUDGET (235),
#      T_SOLVE (seconds per solve, 45), T_TESTS (120), SYNC_OFF (1: one more 2-rank solve with HMC_MG_TIMING_SYNC=0
#      if 30 s are left, to show what the split's device synchronizations cost)
# Check it on a CPU machine (NumPy backend, CPU transports, small lattice, the CPU parts of the tests):
#   BACKEND=numpy TRANSPORTS="mpi shm" L=8 THERM=1 MG_LEVELS=3 MG_NV=8 MG_SETUP_ITERS=5 OUT=/tmp/mgd \
#     bash tools/mg_gpu_dist.sh
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx
export HMC_COMMS_TIMEOUT=${HMC_COMMS_TIMEOUT:-30} HMC_GPU_TEST_TIMEOUT=${HMC_GPU_TEST_TIMEOUT:-100}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${OUT:-/tmp/mg_gpu_dist}; mkdir -p "$OUT"
REP=$OUT/rep; mkdir -p "$REP"; export HMC_GPU_REPORT_DIR=$REP
LOG=$OUT/log.txt; SPLIT=$OUT/split.txt; : >"$SPLIT"
BACKEND=${BACKEND:-cupy}; L=${L:-16}; MASS=${MASS:-0.001}; THERM=${THERM:-4}; TOL=${TOL:-1e-8}
RANKS=${RANKS:-1 2 4}; TRANSPORTS=${TRANSPORTS:-mpi event stream_gated}
MG_NV=${MG_NV:-24}; MG_SETUP_ITERS=${MG_SETUP_ITERS:-20}; MG_LEVELS=${MG_LEVELS:-4}
BUDGET=${BUDGET:-235}; T_SOLVE=${T_SOLVE:-45}
WORK=$(mktemp -d /tmp/hmc-mgdist-XXXXXX)
FIELD=$WORK/field_L$L.milc
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
MPIRUN="mpiexec --oversubscribe"

{ if [ "$BACKEND" = cupy ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv
    python3 -c 'import cupy, mpi4py; print("cupy", cupy.__version__, "mpi4py", mpi4py.__version__)'
  fi
  mpiexec --version | head -1; git log --oneline -1; } 2>&1 | tee -a "$LOG"

MPS=off
if [ "$BACKEND" = cupy ] && [ "${USE_MPS:-1}" = 1 ]; then
  MPSDIR=$(mktemp -d /tmp/hmc-mps-XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY=$MPSDIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPSDIR/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d >>"$LOG" 2>&1; then MPS=started; else MPS="failed to start"; fi
fi
say "mps: $MPS"

# ---- 1. the tests
if [ "${TESTS:-1}" = 1 ]; then
  if [ "$BACKEND" = cupy ]; then SEL=(-m gpu); else SEL=(-m "not gpu"); fi
  say "pytest ${SEL[*]} tests/solvers/test_multigrid_dist_kernels.py tests/lattice/test_gpu_halo_device.py"
  timeout "${T_TESTS:-120}" python3 -m pytest -q -p no:cacheprovider -rA "${SEL[@]}" \
    tests/solvers/test_multigrid_dist_kernels.py tests/lattice/test_gpu_halo_device.py >"$OUT/pytest.txt" 2>&1
  say "pytest rc=$?"; tail -15 "$OUT/pytest.txt" | tee -a "$LOG"
fi

# ---- 2. the field
say "field: cold start + $THERM pure-gauge MD trajectories, Wilson beta 6.0, ${L}^4 ($BACKEND)"
timeout "${T_FIELD:-60}" python3 - "$FIELD" "$L" "$THERM" "$BACKEND" >>"$LOG" 2>&1 <<'EOF'
import sys, time
from hmc.assemble import make_gauge_action
from hmc.integrators import Level, build_schedule
from hmc.monomials import GaugeMonomial
from hmc.trajectory import hmc_trajectory
from lattice import CounterRNG, GaugeField, Geometry, get_backend
from lattice.gauge import plaquette
from lattice.io import write_gauge

path, L, therm, backend = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
geom = Geometry((L,) * 4, get_backend(backend))
u, rng = GaugeField.unit(geom), CounterRNG(616)
mon = [GaugeMonomial(make_gauge_action({"action": "wilson", "beta": 6.0}))]
sched = build_schedule([Level("omelyan", 12, ["gauge"])], 1.0)
for i in range(therm):
    t0 = time.perf_counter()
    u, res = hmc_trajectory(u, rng, mon, sched, metropolis=False)
    ps, pt = plaquette(u)
    print(f"trajectory {i + 1}: plaquette {(ps + pt) / 6:.5f}, dH {float(res.delta_h):.3g}, "
          f"{time.perf_counter() - t0:.2f} s", flush=True)
write_gauge(path, u, "milc")
print(f"wrote {path}")
EOF
rc=$?; say "field rc=$rc"
if [ $rc -ne 0 ] || [ ! -f "$FIELD" ]; then say "no field: the solves are skipped"; RANKS=""; fi

# ---- 3. the solves
summarize() {   # summarize LABEL: the outer line and the per-level lines of $WORK/solve.json
  python3 - "$WORK/solve.json" "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
mg = r.get("mg", {})
print(f"{sys.argv[2]}: {mg.get('outer_iters')} outer iterations, true residual {r.get('true_residual'):.2e}, "
      f"set-up {mg.get('setup_time_s', 0):.2f} s, solve {mg.get('solve_time_s', 0):.3f} s")
for line in mg.get("level_lines", []):
    print("  " + line)
EOF
}
grid_of() { case $1 in 1) echo "1 1 1 1" ;; 2) echo "1 1 1 2" ;; 4) echo "1 1 2 2" ;; *) echo "" ;; esac; }
echo "[" >"$OUT/solves.json"; first=1
for n in $RANKS; do
  trs=$TRANSPORTS; [ "$n" = 1 ] && trs=${TRANSPORTS%% *}        # one rank: nothing is exchanged
  for tr in $trs; do
    t=$(left); if [ "$t" -lt 25 ]; then say "skip $n ranks $tr: only $t s left"; continue; fi
    [ "$t" -gt $(( T_SOLVE + 5 )) ] && t=$T_SOLVE
    label="$n rank(s), ${tr}"; [ "$n" = 1 ] && label="1 rank"
    say "hmc solve --solver mg: $label, grid $(grid_of "$n"), L=$L, m=$MASS"
    # shellcheck disable=SC2046
    timeout -k 5 "$t" $MPIRUN -n "$n" python3 -m hmc --backend "$BACKEND" --grid $(grid_of "$n") --transport "$tr" \
      solve "$FIELD" --action hisq --mass "$MASS" --random 3 --solver mg --tol "$TOL" --no-mg-compare \
      --mg-levels "$MG_LEVELS" --mg-nv "$MG_NV" --mg-setup-iters "$MG_SETUP_ITERS" --json \
      >"$WORK/solve.json" 2>"$WORK/solve.err"
    rc=$?
    tail -3 "$WORK/solve.err" >>"$LOG"
    if [ $rc -ne 0 ]; then say "$label: rc=$rc"; echo "$label: FAILED rc=$rc" >>"$SPLIT"; continue; fi
    summarize "$label" | tee -a "$SPLIT" "$LOG"
    [ $first = 1 ] || echo "," >>"$OUT/solves.json"; first=0
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["label"]=sys.argv[2]; print(json.dumps(r))' \
      "$WORK/solve.json" "$label" >>"$OUT/solves.json"
  done
done
echo "]" >>"$OUT/solves.json"

# ---- 4. (time permitting) the price of the split: 2 ranks, the last transport, without the clocks' device syncs
#      (on the CPU the variable changes nothing: there it checks the script only)
if [ -n "$RANKS" ] && [ "${SYNC_OFF:-1}" = 1 ] && [ "$(left)" -ge 30 ]; then
  tr=${TRANSPORTS##* }; t=$(left); [ "$t" -gt $(( T_SOLVE + 5 )) ] && t=$T_SOLVE
  say "hmc solve --solver mg: 2 ranks, $tr, HMC_MG_TIMING_SYNC=0 (host-side split, solve time without the syncs)"
  # shellcheck disable=SC2046
  HMC_MG_TIMING_SYNC=0 timeout -k 5 "$t" $MPIRUN -n 2 python3 -m hmc --backend "$BACKEND" --grid $(grid_of 2) \
    --transport "$tr" solve "$FIELD" --action hisq --mass "$MASS" --random 3 --solver mg --tol "$TOL" \
    --no-mg-compare --mg-levels "$MG_LEVELS" --mg-nv "$MG_NV" --mg-setup-iters "$MG_SETUP_ITERS" --json \
    >"$WORK/solve.json" 2>"$WORK/solve.err" && summarize "2 rank(s), $tr, HMC_MG_TIMING_SYNC=0" | tee -a "$SPLIT" "$LOG"
fi

if [ "$MPS" = started ]; then
  echo quit | nvidia-cuda-mps-control >>"$LOG" 2>&1; sleep 1; say "mps: stopped"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; rm -rf "$MPSDIR"
fi
rm -rf "$WORK"
(cd "$REP" && tar czf "$OUT/reports.tgz" . 2>/dev/null) && rm -rf "$REP"
say "per-level split of every solve: $SPLIT"
cat "$SPLIT"
say "total $(( $(date +%s) - T0 )) s"
