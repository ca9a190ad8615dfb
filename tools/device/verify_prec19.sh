#!/bin/bash
# prec19 (issue 19, "physics unchanged"): the 16^4 precision study from a thermalized start on one H200.
#   hmc bench precision --lattice 16 --deck runs/hisq211_16.toml --thermalize 40 6 --steps 24 --trajectories 10
#       --cgprec 1 2 2 --reversibility-resid 1e-10 --reversibility-trajectories 2
# 40 quenched warm-ups (the deck's gauge action, no fermions) from cold, 6 dynamical trajectories (3 warm-ups, 3 with
# the Metropolis test, double precision), then two chains of PREC_TRAJ (10) trajectories from that configuration with
# the same seed: cgprec 2 2 2 (reference) and 1 2 2 (MD solves single, refined in double; every trajectory also
# integrated forward and back with the deck's MD residual 1e-5), then 2 trajectories of each setting forward and back
# with every MD solve to 1e-10 (the issue's reversibility to 1e-8: with 1e-5 the round trip measures the solves'
# error, 4.6e-6 in the links on 2026-12-03). Session 12/13 on the H200: 205 s for the chains (thermalize 40 s,
# reference 45 s, test 119 s); the tight runs add ~60-90 s. PREC_TRAJ=2 gives the reversibility alone in ~150 s.
# Session 20 on an H100 (PREC_TRAJ=4): thermalize 34 s, reference 19 s, test 43 s, reference tight round trips 40 s,
# the test's tight round trips ~35 s a trajectory (every mixed MD solve refined to 1e-10): 320 s did not finish them.
# Run from the repository root: bash tools/device/verify_prec19.sh   (writes to $OUT: prec19.txt, precision_16.json,
# prec19_runs.tgz with the decks and logs).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/prec19_out}
W=/tmp/prec19_study
rm -rf "$W"; mkdir -p "$W" "$OUT"
T0=$(date +%s)

echo "== prec19: 16^4 precision study, thermalized start (cgprec 1 2 2 against 2 2 2)"
timeout 30 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout ${PREC_TIMEOUT:-420} python3 -m hmc --backend cupy bench precision --lattice 16 --deck runs/hisq211_16.toml \
    --thermalize 40 6 --steps 24 --trajectories ${PREC_TRAJ:-10} --cgprec 1 2 2 \
    --reversibility-resid 1e-10 --reversibility-trajectories 2 --out "$W" 2>&1 | tee "$OUT/prec19.txt"
RC=${PIPESTATUS[0]}
echo "== study exit $RC (124: timed out), $(( $(date +%s) - T0 )) s wall so far"

cp "$W/precision_16.json" "$OUT/" 2>/dev/null
(cd "$W" && timeout 20 tar czf "$OUT/prec19_runs.tgz" ./*.toml ./*.log ./*.json 2>/dev/null)

if [ ! -f "$W/precision_16.json" ]; then
    echo "FAIL study: no precision_16.json (exit $RC); the last trajectory lines of each log:"
    for f in "$W"/*.log; do
        echo "-- $f"; grep -h -E "delta S|REVERSIBILITY|^traj|Error|error" "$f" | tail -12
    done
    exit 1
fi

timeout 30 python3 - "$W/precision_16.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
o = r["observables"]
acc_ref, acc_test = o["acceptance"]["reference"][0], o["acceptance"]["test"][0]
n = len(r["per_trajectory"])
print(f"{'PASS' if min(acc_ref, acc_test) >= 0.5 else 'FAIL'} acceptance >= 0.5 over {n} trajectories: "
      f"reference {acc_ref:.2f}, test {acc_test:.2f} (steps {r['steps']})")
for name, v in o.items():
    sig = v["sigmas"]
    print(f"{'PASS' if v['agree_within_2_sigma'] else 'FAIL'} {name} agrees within 2 sigma: "
          f"{v['reference'][0]:.8f} +- {v['reference'][1]:.2e} vs {v['test'][0]:.8f} +- {v['test'][1]:.2e} "
          f"({sig:.2f} sigma)" if sig == sig else
          f"{'PASS' if v['agree_within_2_sigma'] else 'FAIL'} {name} agrees: {v['reference'][0]:.8f} vs "
          f"{v['test'][0]:.8f} (both errors 0)")
rev = r["reversibility"]
print("INFO reversibility with the deck's MD residual (1e-5: a solve stopping at another iteration on the way back moves it by the tolerance): max|dU| "
      + (f"{rev['max_dU']:.3e} (max|dP| {rev['max_dP']:.3e}, max|dH| {rev['max_abs_dH']:.3e}, "
         f"{rev['trajectories']} trajectories)" if rev else "none measured"))
for label, t in r.get("reversibility_tight", {"none": {}}).items():
    ok = t.get("max_dU", float("inf")) <= 1e-8
    print(f"{'PASS' if ok else 'FAIL'} reversibility max|dU| <= 1e-8 with MD residual {t.get('md_resid')}, {label} "
          f"(cgprec {t.get('cgprec')}): max|dU| {t.get('max_dU', float('nan')):.3e} (max|dP| "
          f"{t.get('max_dP', float('nan')):.3e}, max|dH| {t.get('max_abs_dH', float('nan')):.3e}, "
          f"{t.get('trajectories', 0)} trajectories)")
t = r["thermalization"].get("dynamical")
if t:
    print(f"INFO thermalization: plaquette {r['thermalization']['quenched']['plaquette_last']:.6f} (quenched) -> "
          f"{t['plaquette_last']:.6f} (dynamical); Metropolis dH {t['dH']} acceptance {t['acceptance']:.2f}")
EOF
echo "== prec19 done, $(( $(date +%s) - T0 )) s wall"
