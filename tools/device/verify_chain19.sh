#!/bin/bash
# chain19 (issue 19): GPU tests of tests/force, then the 32^4 fat-link build and chain rule (level 2 and fat7) and a
# per-kernel split of the staged kernels. One H200, ~150 s in all. Run from the repository root: bash tools/device/verify_chain19.sh
cd "$(dirname "$0")/../.." || exit 1
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s)
echo "== chain19: $(git rev-parse --short HEAD 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

# 1. GPU tests of the force package (the staged kernels, the kept intermediates, everything else in tests/force)
timeout 65 python3 -m pytest -q -m gpu tests/force -p no:cacheprovider -x 2>&1 | tail -6
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then echo "PASS gpu tests/force"; elif [ "$rc" = 124 ]; then echo "FAIL gpu tests/force: timeout 65 s"; else echo "FAIL gpu tests/force rc=$rc"; fi
echo "== t=$(( $(date +%s) - T0 )) s"

# 2. benches at 32^4 in one process (one CuPy start-up): smear and fat-vjp, level 2 and fat7, then the kernel split
timeout 80 python3 - <<'PY'
import time
from types import SimpleNamespace as NS

import numpy as np

from bench.fat_vjp import bench_fat_vjp
from bench.smear import bench_smear, smooth_links

L = [32, 32, 32, 32]
ok = True
for coeffs in ("level2", "fat7"):
    t = time.time()
    s = bench_smear(NS(backend="cupy", lattice=L, coeffs=coeffs, repeat=10, twin=False, json=False))
    print(f"RESULT smear {coeffs}: staged {s['staged_s'] * 1e3:.3f} ms a build (per-direction {s['old_s'] * 1e3:.3f})"
          f"  [{time.time() - t:.1f} s]", flush=True)
    t = time.time()
    v = bench_fat_vjp(NS(backend="cupy", lattice=L, coeffs=coeffs, repeat=5, json=False))["variants"]
    print(f"RESULT fat-vjp {coeffs}: staged {v['staged']['s'] * 1e3:.3f} ms, staged_kept "
          f"{v['staged_kept']['s'] * 1e3:.3f} ms, per-direction {v['per_direction']['s'] * 1e3:.3f} ms a call"
          f"  [{time.time() - t:.1f} s]", flush=True)

# the staged kernels one by one (level 2, 32^4): median of 5 launches each, CUDA events, GB/s by the model; the
# element-major kernels of this branch (NEW) against the site-major ones of commit 00d9903 (OLD, their expanded
# source saved in .device/aos_staged*.cu), on the same links, and their outputs compared bit for bit
import os

import cupy as cp

from force import hisq_staged as hs, hisq_staged_vjp as hv, smearing as sm
from lattice import Geometry, get_backend

geom = Geometry(tuple(L), get_backend("cupy"))
u = smooth_links(geom)
g = np.random.default_rng(7)
d = cp.asarray(g.normal(size=u.shape) + 1j * g.normal(size=u.shape))
c = sm.HISQ_LEVEL2
vol = geom.local_volume
f = np.float64
cs = (f(c.one_link), f(c.three_staple), f(c.five_staple), f(c.seven_staple), f(c.lepage))
dims = tuple(np.int32(n) for n in L)
old_mods = {}
for name in ("aos_staged.cu", "aos_staged_vjp.cu"):
    path = os.path.join(".device", name)
    old_mods[name] = cp.RawModule(code=open(path).read(), options=("--std=c++17",)) if os.path.exists(path) else None


def run_set(tag, u_in, d_in, mk, launch):
    a, inner, di, da = (mk(12) for _ in range(4))
    du, fat, out = mk(4), cp.empty(u.shape, u.dtype), cp.empty(u.shape, u.dtype)
    links_args = (u_in, a, inner, d_in, di, da, du) + ((out,) if tag == "NEW" else ()) + (cs[2], cs[3])
    steps = [("A", "staged_a", 12, (u_in, a), 16),
             ("A", "staged_inner", 12, (u_in, a, inner) + cs[1:], 28),
             ("A", "staged_fat", 4, (u_in, inner, fat, f(c.one_link - 6 * c.lepage)), 20),
             ("V", "svjp_d_inner", 12, (u_in, d_in, di), 20),
             ("V", "svjp_d_a", 4, (u_in, d_in, di, da, du) + cs, 36),
             ("V", "svjp_links", 4, links_args, 64)]
    total = 0.0
    for which, name, per, args, matrices in steps:
        if name == "svjp_links":        # reads D_U (new: its own input; old: in place): time on a fresh copy
            keep_du = du.copy()
        launch(which, name, per * vol, args)
        cp.cuda.Device().synchronize()
        ms = []
        for _ in range(5):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            launch(which, name, per * vol, args)
            e1.record()
            e1.synchronize()
            ms.append(cp.cuda.get_elapsed_time(e0, e1))
        m = float(np.median(ms))
        total += m
        print(f"KERNEL {tag} {name:13s} {m:8.3f} ms  {matrices * 144 * vol / m / 1e6:7.0f} GB/s by the model",
              flush=True)
    print(f"KERNEL {tag} sum of the six {total:.3f} ms", flush=True)
    if tag == "OLD":                    # one clean svjp_links from svjp_d_a's D_U: the result
        du[...] = keep_du
        launch("V", "svjp_links", 4 * vol, links_args)
        out = du
    else:
        launch("V", "svjp_links", 4 * vol, links_args)
    return fat, out


def new_launch(which, name, n, args):
    hs.launch(geom, "hisq_staged.cu" if which == "A" else hv.KERNEL_FILE, name, n, args)


if hasattr(hs, "element_major"):     # the kernel comparison needs tools/device/patches/staged-element-major.patch
    em = lambda x: hs.element_major(cp, x)
    new = run_set("NEW", em(u), em(d), lambda n: cp.empty((n, 9, vol), u.dtype), new_launch)
    if all(old_mods.values()):
        def old_launch(which, name, n, args):
            fn = old_mods["aos_staged.cu" if which == "A" else "aos_staged_vjp.cu"].get_function(name)
            fn(((n + 127) // 128,), (128,), tuple(args) + dims)
        old = run_set("OLD", u, d, lambda n: cp.empty((n,) + u.shape[1:], u.dtype), old_launch)
        print(f"KERNEL NEW == OLD bit for bit: fat {bool((new[0] == old[0]).all())}, "
              f"chain rule {bool((new[1] == old[1]).all())}", flush=True)
    else:
        print("KERNEL OLD: .device/aos_staged*.cu missing, no baseline", flush=True)
    del new, d
else:
    print("KERNEL: the element-major patch is not applied, kernel comparison skipped", flush=True)

# one whole HISQ force evaluation at 32^4 (two epsilon groups, as the production deck): reusing the links' kept
# intermediates (the default now) against recomputing them (kept emptied); median of 3, synchronized
import dataclasses

from force.hisq_force import hisq_force
from force.hisq_links import hisq_links_multi
from lattice import GaugeField

gf = GaugeField(geom, u)
fl = hisq_links_multi(gf, [0.0, -0.35])
noise = lambda: cp.asarray(g.normal(size=u.shape) + 1j * g.normal(size=u.shape))
fo, lo = {0.0: noise(), -0.35: noise()}, {0.0: noise(), -0.35: noise()}
res = {}
for name, links in (("kept", fl[0]), ("recomputed", dataclasses.replace(fl[0], kept={}))):
    hisq_force(gf, fo, lo, links=links)
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        res[name] = hisq_force(gf, fo, lo, links=links)
        cp.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t)
    print(f"FORCE hisq_force 32^4, 2 eps groups, intermediates {name:10s} {1e3 * float(np.median(ts)):8.3f} ms",
          flush=True)
print(f"FORCE kept == recomputed bit for bit: {bool((res['kept'] == res['recomputed']).all())}", flush=True)
PY
rc=$?
if [ "$rc" = 0 ]; then echo "PASS benches"; elif [ "$rc" = 124 ]; then echo "FAIL benches: timeout 80 s"; else echo "FAIL benches rc=$rc"; fi
echo "== total $(( $(date +%s) - T0 )) s"
