#!/bin/bash
# chain19 (issue 19): GPU tests of tests/force, then the 32^4 fat-link build and chain rule (level 2 and fat7) and a
# per-kernel split of the staged kernels (element-major fields). One H200, ~150 s in all. Run from the repository root: bash tools/device/verify_chain19.sh
cd "$(dirname "$0")/../.." || exit 1
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s)
echo "== chain19: $(git rev-parse --short HEAD 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

# 1. GPU tests of the force package (the staged kernels, the kept intermediates, everything else in tests/force)
timeout 150 python3 -m pytest -q -m gpu tests/force -p no:cacheprovider -x 2>&1 | tail -6
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then echo "PASS gpu tests/force"; elif [ "$rc" = 124 ]; then echo "FAIL gpu tests/force: timeout 150 s"; else echo "FAIL gpu tests/force rc=$rc"; fi
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

# the staged kernels one by one (level 2, 32^4, element-major fields): median of 5 launches each, CUDA events,
# GB/s by the model (svjp_links_g / _h: the model's stage 5 in two launches, each counted at 32 M a site here)
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
ue, de = hs.element_major(cp, u), hs.element_major(cp, d)
a, inner, di, da = (cp.empty((12, 9, vol), u.dtype) for _ in range(4))
du, fat, out = cp.empty((4, 9, vol), u.dtype), cp.empty(u.shape, u.dtype), cp.empty(u.shape, u.dtype)
steps = [("hisq_staged.cu", "staged_a", 12, (ue, a), 16),
         ("hisq_staged.cu", "staged_inner", 12, (ue, a, inner) + cs[1:], 28),
         ("hisq_staged.cu", "staged_fat", 4, (ue, inner, fat, f(c.one_link - 6 * c.lepage)), 20),
         (hv.KERNEL_FILE, "svjp_d_inner", 12, (ue, de, di), 20),
         (hv.KERNEL_FILE, "svjp_d_a", 4, (ue, de, di, da, du) + cs, 36),
         (hv.KERNEL_FILE, "svjp_links_g", 4, (ue, a, inner, de, di, da, du, cs[2], cs[3]), 32),
         (hv.KERNEL_FILE, "svjp_links_h", 4, (ue, a, inner, de, di, da, du, out, cs[2], cs[3]), 32)]
total = 0.0
for kfile, name, per, args, matrices in steps:
    hs.launch(geom, kfile, name, per * vol, args)
    cp.cuda.Device().synchronize()
    ms = []
    for _ in range(5):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        hs.launch(geom, kfile, name, per * vol, args)
        e1.record()
        e1.synchronize()
        ms.append(cp.cuda.get_elapsed_time(e0, e1))
    m = float(np.median(ms))
    total += m
    print(f"KERNEL {name:13s} {m:8.3f} ms  {matrices * 144 * vol / m / 1e6:7.0f} GB/s by the model", flush=True)
print(f"KERNEL sum of the seven {total:.3f} ms", flush=True)
del d, de, a, inner, di, da, du, fat, out

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
