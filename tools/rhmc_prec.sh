#!/usr/bin/env bash
# 32^4 production trajectory (runs/hisq211_16.toml at 32^4, 36 steps), MD solves in double (cgprec 2) and in single
# (cgprec 1: solvers.multishift.mixed_multishift_cg); TRAJ trajectories each from the same cold start.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; TRAJ=${TRAJ:-3}; L=${L:-32}; STEPS=${STEPS:-36}
R=$PWD/runs/rationals/rationals.hisq211_b580
for prec in 2 1; do
  d=/tmp/deck_p$prec.toml
  sed -e "s|^dims = .*|dims = [$L, $L, $L, $L]|" -e "s|^steps = .*|steps = $STEPS|" \
      -e "s|^rationals = .*|rationals = \"$R\"|" -e "s|^trajectories = .*|trajectories = $TRAJ|" \
      -e "s|^warmups = .*|warmups = $TRAJ|" runs/hisq211_16.toml > $d
  if [ $prec = 1 ]; then
    sed -i "s|^max_multicg = 5000|max_multicg = 5000\ncgprec_md_fa_gr = [[1, 2, 2], [1, 2, 2], [1, 2, 2], [1, 2, 2], [1, 2, 2]]|" $d
  fi
  t0=$SECONDS
  python3 -m hmc --backend cupy init $d -o /tmp/p$prec.h5 --force > $OUT/init_p$prec.log 2>&1 &&
  timeout ${T_RUN:-300} python3 -m hmc --backend cupy run /tmp/p$prec.h5 --no-progress > $OUT/run_p$prec.log 2>&1
  echo "== cgprec MD $prec: exit $? in $((SECONDS - t0)) s"
  python3 - /tmp/p$prec.h5 <<'PY'
import sys
from hmc.runfile import load
st = load(sys.argv[1])
for r in st.history:
    g = lambda k: float(r.get(k, 0.0))
    s = {ph: g(f"time_fermion_solver_{ph}") for ph in ("GR", "FA", "MD")}
    print(f"traj {r['traj']}: total {g('time_total'):.2f} s | solvers GR {s['GR']:.2f} FA {s['FA']:.2f} MD {s['MD']:.2f}"
          f" | smear {g('time_fermion_links'):.2f} | fforce {g('time_fermion_outer') + g('time_fermion_force_chain'):.2f}"
          f" | gforce {g('time_force_gauge'):.2f} | iters GR {r['cg_gr']} FA {r['cg_fa']} MD {r['cg_md']}"
          f" | dH {r['dH']:+.5f} plaq {(r['plaq_ss'] + r['plaq_st']) / 6:.8f}")
PY
done
