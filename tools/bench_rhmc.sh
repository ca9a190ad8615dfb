#!/usr/bin/env bash
# RHMC benchmark (issue 5): HISQ 2+1+1 trajectories of the production deck (runs/hisq211_16.toml: beta 5.80,
# ml/ms/mc 0.013/0.065/0.838, 5 pseudofermions, 3G1F, tau 1) on the GPU for 16^4 and 32^4 (--backend cupy), and on
# the CPU (numpy) for 8^4 (runs/hisq211_8.toml). For each: `hmc init` (cold start) and `hmc run --trajectories N`,
# then the per-phase times the history stores, trajectory by trajectory: solvers (heat bath GR, actions FA, force MD),
# link smearing (fat/long link builds), fermion force without its solves (outer products + HISQ chain rule), gauge
# force, link updates, and the rest (actions, momenta, Metropolis). The first trajectory starts cold and, on the GPU,
# compiles the kernels: read the last one. The share of the solver time spent in Dslash is estimated as
# (multishift iterations = applications of A = -D_eo D_oe) x (time of one A, from `hmc bench dslash`) / solver time.
#
# 8^4 and 16^4 keep their decks' steps (12, 20); 32^4 takes 36 (eps ~ V^(-1/8) keeps the acceptance ~ 0.8).
#
# Usage (repository root, on the device machine):  bash tools/bench_rhmc.sh
#   GPU_SIZES="16 32"  CPU_SIZES="8"  TRAJ=2 (trajectories per size)  OUT=folder for logs and run files
#   STEPS_32=36 (STEPS_<L>: the integrator steps for an L^4 lattice; default: the deck's)
#   SKIP_GPU=1 / SKIP_CPU=1 to leave a part out.  The goal: a 32^4 trajectory in under 5 minutes on one H200.
#   HMC_HISQ_KERNELS=0 runs the HISQ smearing/force with the array-code twins instead of force/hisq_cuda.py's
#   kernels; HMC="python3 -m cProfile -o prof.out -m hmc" profiles the run. The link-update time is not
#   synchronized: on the GPU its kernel time shows up in the next phase (link smearing). docs/perf-notes.md.
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bench_rhmc}
TRAJ=${TRAJ:-2}
GPU_SIZES=${GPU_SIZES:-"16 32"}
CPU_SIZES=${CPU_SIZES:-"8"}
HMC=${HMC:-python3 -m hmc}
mkdir -p "$OUT"
RATIONALS=$PWD/runs/rationals/rationals.hisq211_b580

# deck for an L^4 lattice from the production deck (absolute rationals path, so that it can live in $OUT)
STEPS_32=${STEPS_32:-36}
make_deck() {
  local L=$1 src=$2 dst=$3
  local steps_var=STEPS_$L
  local steps=${!steps_var:-}
  sed -e "s|^dims = .*|dims = [$L, $L, $L, $L]|" \
      -e "${steps:+s|^steps = .*|steps = $steps|}" \
      -e "s|^rationals = .*|rationals = \"$RATIONALS\"|" \
      -e "s|^trajectories = .*|trajectories = $TRAJ|" \
      -e "s|^warmups = .*|warmups = $TRAJ|" "$src" > "$dst"
}

report() {   # run file, backend, operator time per application of A (s) or empty
  python3 - "$1" "$2" "$3" <<'EOF'
import sys
from hmc.runfile import load
path, backend, t_op = sys.argv[1], sys.argv[2], sys.argv[3]
st = load(path)
L = "x".join(map(str, st.deck["lattice"]["dims"]))
print(f"== {L} on {backend}: {st.deck['integrator']['scheme']} steps {st.deck['integrator']['steps']} "
      f"tau {st.deck['integrator']['tau']}, 5 pseudofermions")
for r in st.history:
    g = lambda k: float(r.get(k, 0.0))
    solve = {ph: g(f"time_fermion_solver_{ph}") for ph in ("GR", "FA", "MD")}
    solver = sum(solve.values())
    smear = g("time_fermion_links")
    fforce = g("time_fermion_outer") + g("time_fermion_force_chain")
    gforce = g("time_force_gauge")
    upd = g("time_links")
    total = g("time_total")
    rest = total - solver - smear - fforce - gforce - upd
    iters = int(r["cg_gr"] + r["cg_fa"] + r["cg_md"])
    print(f"traj {r['traj']}: total {total:9.2f} s | solvers {solver:8.2f} s ({100 * solver / total:4.1f}%: "
          f"GR {solve['GR']:.2f} FA {solve['FA']:.2f} MD {solve['MD']:.2f}) | link smearing {smear:7.2f} s "
          f"({100 * smear / total:4.1f}%, {int(r['fermion_link_builds'])} builds) | fermion force w/o solves "
          f"{fforce:7.2f} s ({100 * fforce / total:4.1f}%) | gauge force {gforce:7.2f} s ({100 * gforce / total:4.1f}%) "
          f"| link updates {upd:6.2f} s | rest {rest:6.2f} s")
    line = (f"        multishift iterations GR {r['cg_gr']} FA {r['cg_fa']} MD {r['cg_md']} (= applications of A), "
            f"dH {r['dH']:+.4f}, plaquette {(r['plaq_ss'] + r['plaq_st']) / 6:.6f}")
    if t_op:
        frac = iters * float(t_op) / solver if solver > 0 else float("nan")
        line += f"; Dslash share of solver time ~ {100 * frac:.0f}% ({iters} x {1e3 * float(t_op):.3f} ms)"
    print(line)
EOF
}

bench() {   # backend L deck
  local backend=$1 L=$2 src=$3
  local deck=$OUT/hisq211_${L}_${backend}.toml run=$OUT/hisq211_${L}_${backend}.h5
  make_deck "$L" "$src" "$deck"
  local t_op
  t_op=$($HMC --backend "$backend" bench dslash --lattice $L $L $L $L --precision double --repeat 20 --json \
         2> "$OUT/dslash_${L}_${backend}.err" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cg_operator_s"])' \
         || true)
  local t0=$SECONDS
  $HMC --backend "$backend" init "$deck" -o "$run" --force > "$OUT/init_${L}_${backend}.log" 2>&1 &&
    $HMC --backend "$backend" run "$run" --trajectories "$TRAJ" --no-progress > "$OUT/run_${L}_${backend}.log" 2>&1
  local rc=$?
  echo "-- $L^4 $backend: hmc init + run of $TRAJ trajectories: exit $rc, $((SECONDS - t0)) s wall (log $OUT/run_${L}_${backend}.log)"
  [ $rc -eq 0 ] || { tail -5 "$OUT/run_${L}_${backend}.log"; return; }
  report "$run" "$backend" "$t_op"
}

{
  echo "bench_rhmc: $(date -u +%FT%TZ), ${HMC_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, TRAJ=$TRAJ"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  if [ -z "${SKIP_GPU:-}" ]; then
    for L in $GPU_SIZES; do bench cupy "$L" runs/hisq211_16.toml; done
  fi
  if [ -z "${SKIP_CPU:-}" ]; then
    for L in $CPU_SIZES; do bench numpy "$L" runs/hisq211_8.toml; done
  fi
} 2>&1 | tee "$OUT/bench_rhmc.txt"
