"""mgcap18: one field, one multigrid set-up, then the same source solved with the CUDA graphs of the deepest
K-cycle GCR off and on (alternating), printing per-level tables and PASS/FAIL. Usage: L PRECISION [rounds]
With MG_CUDA_PROFILE=1 one more solve, graphs on, runs between cupy.cuda.profiler.start() and stop(), for
``ncu --profile-from-start off`` (tools/device/ncu_kernels.sh, bench.ncu: its kernels one by one)."""
import math
import os
import sys
import time


from bench import mg as bm
from hmc.solve import random_source
from lattice import Geometry, get_backend
from solvers import norm2
from solvers.multigrid import multigrid
from solvers.multigrid import graph as mggraph

L, prec = int(sys.argv[1]), sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
backend = sys.argv[4] if len(sys.argv) > 4 else "cupy"
args = bm.parse(["--lattice", str(L), "--mg-precision", prec, "--out", "/tmp/mgcap18_out", "--backend", backend])
args = bm.finish_args(args)
rep = bm.Report(args)
be = get_backend(backend, args.run_config)
geom = Geometry((L,) * 4, be, config=args.run_config)
u = bm.thermalize(args, geom, rep)
D = bm.fermion_links(args, u, rep)
del u
hp = bm.hierarchy_params(args, geom.dims)
M = D.matrix(args.mass)
b = geom.xp.asarray(random_source(geom, args.seed))
inv = multigrid(args.tol, args.mg_maxiter, raise_on_fail=False, **hp)(M)
t0 = time.perf_counter()
inv.setup()
be.synchronize()
print(f"SETUP {L}^4 {prec}: {time.perf_counter() - t0:.1f} s, levels {hp['levels']}", flush=True)
out = {}
for k in range(rounds):
    for on in (False, True):
        mggraph.set_graph(on)
        be.synchronize()
        t0 = time.perf_counter()
        x, st = inv.solve(b)
        be.synchronize()
        t = time.perf_counter() - t0
        res = math.sqrt(norm2(geom, b - M(x)) / norm2(geom, b))
        g = {kk: v for kk, v in st.extra.items() if "graph" in kk}
        print(f"SOLVE {L}^4 {prec} graph={'on' if on else 'off'} round {k}: {t:.3f} s, {st.iters} outer, "
              f"{st.fine_applies} fine applications, true residual {res:.3e} {g}", flush=True)
        for line in st.level_lines():
            print("    " + line, flush=True)
        out.setdefault(on, []).append((t, st.iters, x, res, g))
if os.environ.get("MG_CUDA_PROFILE") == "1":
    import cupy as cp

    mggraph.set_graph(True)
    be.synchronize()
    cp.cuda.profiler.start()
    t0 = time.perf_counter()
    inv.solve(b)
    be.synchronize()
    cp.cuda.profiler.stop()
    print(f"PROFILED {L}^4 {prec} graph=on solve: {time.perf_counter() - t0:.3f} s under the profiler", flush=True)
mggraph.set_graph(None)
try:
    lg = next(iter(inv.hierarchy.graphs.values()))
    for j, gr in sorted(lg.graphs.items())[:3]:
        print(f"GRAPH level step {j}: nodes {gr.node_census()}", flush=True)
except Exception as exc:  # noqa: BLE001
    print(f"GRAPH census unavailable: {exc}", flush=True)
off, on = out[False][-1], out[True][-1]
d = math.sqrt(norm2(geom, off[2] - on[2]) / norm2(geom, off[2]))
used = on[4].get("graph_replays", 0) > 0 and "graph_failed" not in on[4]
ok = off[1] == on[1] and on[3] <= args.tol * 1.0001 and d < 1e-6
print(f"{'PASS' if ok and used else 'FAIL'} {L}^4 {prec}: graph used {used} {on[4]}, outer off/on {off[1]}/{on[1]}, "
      f"true residual on {on[3]:.3e}, |x_on - x_off|/|x_off| {d:.2e}", flush=True)
print(f"RESULT {L}^4 {prec}: solve graph off {off[0]:.3f} s, graph on {on[0]:.3f} s, speed-up {off[0] / on[0]:.2f}x",
      flush=True)
