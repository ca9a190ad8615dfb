#!/bin/bash
# e2e18 (issue 17): credit-free graph mode + batched signals by default; the 4-rank RHMC. Budget 265 s wall total.
# Run from the repository root on one H200: bash tools/device/verify_e2e18.sh   (works in /tmp/e2e18; with $OUT set,
# leaves two archives there, e2e18_reports.tgz (logs, reports, plots, json) and e2e18_h5.tgz (the studies' files):
# the device gives back at most 8 files)
export PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
O=/tmp/e2e18; rm -rf "$O"; mkdir -p "$O"
T0=$(date +%s); BUDGET=265
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# step NAME SECONDS CMD...: runs CMD under MPS with timeout min(SECONDS, what is left); PASS/FAIL line with rc and time
step() {
  local name=$1 want=$2; shift 2
  local t=$(left); (( t > want )) && t=$want
  if (( t < 10 )); then echo "SKIP $name (budget spent)"; return; fi
  local s=$(date +%s)
  timeout $((t + 15)) python3 -m comms.cuda.mps run $MPSFLAG -- timeout "$t" "$@" > "$O/$name.log" 2>&1
  local rc=$?
  local d=$(( $(date +%s) - s ))
  if (( rc == 0 )); then echo "PASS $name (${d} s)"; else echo "FAIL $name rc=$rc (${d} s, limit $t s)"; tail -25 "$O/$name.log"; fi
}
echo "e2e18 device script, commit $(git rev-parse --short HEAD 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

# 1. halo benchmark graph rows: 2 ranks, credit-free CapturedGraph round trip (every link an exchange)
step halo_graph 25 mpiexec --oversubscribe -n 2 python3 -m bench.halo_cuda --transport stream_gated --sizes 2 8 \
  --reps 50 --repeats 2 --graph --graph-reps 200 --json "$O/halo_graph.json" --label "e2e18 defaults"
grep -E "graph|stream_gated" "$O/halo_graph.log" | head -8

# 2. GPU tests of the change: graph check (one-link exchanges signalled on the other link, launch refused after
#    graph mode is left), shift on cupy; short solver graphs launched 4 times (one GPU)
step pytest_graph 35 python3 -m pytest -q -x -p no:cacheprovider tests/comms/test_gpu_transports.py \
  tests/solvers/test_gpu_krylov_graph.py -k "graph_replays or geometry_shift or short_graphs"
tail -2 "$O/pytest_graph.log"

# 4. 16^4 RHMC trajectory, 1 / 2 / 4 ranks, event and stream_gated (target: 4 ranks stream_gated <= 3 x one rank)
#    (hmc scaling --mps starts its own MPS daemon: the step's wrapper runs with --no-mps there)
MPSFLAG=--no-mps step rhmc 70 python3 -m hmc --backend cupy scaling --lattice 16^4 --ranks 1 2 4 --transports event \
  stream_gated --mps --what rhmc --repeats 1 -o "$O/rhmc.h5" --force --report-dir "$O/rhmc"

# 5. production CG iteration, new defaults (stream_gated; targets 2 ranks 8x8x8x16 <= 150 us, 4 ranks 8^4 local <= 250 us)
#    mpi and event beside it: the issue's stream_gated <= 0.33 x mpi and <= 0.5 x event (12 configurations, ~4 s each)
MPSFLAG=--no-mps step cg 75 python3 -m hmc --backend cupy scaling --lattice 8x8x8x16 --lattice 8x8x16x16 --grid 1x1x1x2 \
  1x1x2x2 --ranks 1 --transports mpi event stream_gated --mps --what dslash,cg --cg-iters 200 --halo-sizes --repeats 2 \
  -o "$O/cg.h5" --force --report-dir "$O/cg"

# 6. the RHMC again with graphs of 2 iterations launched 4 times per check (HMC_SOLVER_GRAPH_CAPTURE=2), 1 2 4 ranks
#    stream_gated: compare with step 4 (captures per trajectory in the "graphs" lines)
HMC_SOLVER_GRAPH_CAPTURE=2 MPSFLAG=--no-mps step rhmc_capture2 35 python3 -m hmc --backend cupy scaling --lattice 16^4 \
  --ranks 1 2 4 --transports stream_gated --mps --what rhmc --repeats 1 -o "$O/rhmc_capture2.h5" --force \
  --report-dir "$O/rhmc_capture2"

# 6b. the short RHMC trajectory on 2 and 4 ranks stream_gated against one rank (shifts and padded stencils after the
#    credit-free solves)
step pytest_hmc_dist 70 python3 -m pytest -q -x -p no:cacheprovider tests/hmc/test_gpu_hmc_dist.py -k "cupy and stream_gated"
tail -2 "$O/pytest_hmc_dist.log"

# 7. (what time is left) halos bitwise equal to mpi, batched signals in counter mode now the default
step pytest_halo 60 python3 -m pytest -q -x -p no:cacheprovider tests/comms/test_gpu_transports.py -k halo_bitwise
tail -2 "$O/pytest_halo.log"

python3 - "$O" <<'PY'
import sys, h5py, numpy as np, os
out = sys.argv[1]
for study in ("rhmc", "rhmc_capture2", "cg"):
    p = os.path.join(out, study + ".h5")
    if not os.path.exists(p):
        print(f"{study}: no results file"); continue
    with h5py.File(p, "r") as f:
        print(f"== {study}: per configuration (median; CG: us per iteration; RHMC: s per trajectory)")
        for key in sorted(f["configs"]):
            g = f["configs"][key]
            for op in ("cg", "rhmc"):
                if op not in g:
                    continue
                o = g[op]
                med = float(o.attrs.get("median_s", np.nan))
                shown = f"{med * 1e6:.1f} us/iteration" if op == "cg" else f"{med:.3f} s/trajectory"
                print(f"  {key:40s} {op:5s} {shown}  status={o.attrs.get('status')} "
                      f"answers_agree={g.attrs.get('answers_agree')}")
                if op == "rhmc" and "phases" in o:
                    ph = o["phases"][()]
                    names = [n.decode() if isinstance(n, bytes) else str(n) for n in o["phases"].attrs["names"]]
                    r = int(np.argmax(ph.sum(axis=1)))
                    print("      slowest rank %d: " % r + ", ".join(f"{n} {v:.3f}" for n, v in zip(names, ph[r]))
                          + f"; solves {ph[r][:3].sum():.3f}")
                if op == "rhmc" and "graphs" in o.attrs:
                    import json
                    gr = json.loads(o.attrs["graphs"])
                    print("      graphs per rank (" + ", ".join(gr["names"]) + "): "
                          + "; ".join(", ".join(f"{v:.3g}" for v in row) for row in gr["per_rank"]))
for study in ("rhmc", "rhmc_capture2", "cg"):
    rep = os.path.join(out, study, "report.md")
    if os.path.exists(rep):
        lines = open(rep).read().splitlines()
        print(f"== {study}/report.md tables")
        print("\n".join(l for l in lines if l.startswith("|"))[:6000])
PY
echo "e2e18 done in $(( $(date +%s) - T0 )) s; logs and reports under $O"
if [ -n "${OUT:-}" ]; then
  (cd "$O" && tar czf "$OUT/e2e18_reports.tgz" --exclude='*.h5' . && tar czf "$OUT/e2e18_h5.tgz" $(ls *.h5 2>/dev/null))
  ls -l "$OUT"/e2e18_*.tgz
fi
