"""Phase timings of the HISQ link smearing and fermion-force chain on one GPU (issue 5), with the CUDA kernels of
force/hisq_cuda.py and (``--twin``) with the array-code twins on CuPy.

    PYTHONPATH=. python3 tools/profile_hisq.py --sizes 16 32 --twin 16 [--json out.json]

Per size: hisq_links_multi (two Naik epsilons) and its parts (fat7, U(3) projection, level-2 fat, Naik), the force
chain (hisq_force with random outer products of two epsilon groups) and its parts (level-2 adjoint, the U(3)
projection derivative, fat7 adjoint, TA(U D)), and the outer products of hmc/rhmc.py (five pseudofermions
with 9, 7, 7, 7, 7 poles).
Median of ``--repeat`` runs after one warm-up, synchronized."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from force import hisq_cuda, smearing as sm, smearing_derivative as sd
from force.hisq_force import add_outer_products, hisq_force, hisq_level2_vjp, momentum_derivative
from force.hisq_links import hisq_links_multi
from force.unitarize import u3_unitarize
from force.unitarize_derivative import u3_unitarize_vjp
from lattice import CounterRNG, GaugeField, Geometry, get_backend, su3

EPS = [0.0, -0.3546869428314402]


def timed(be, f, repeat, inner=1):
    """Median over ``repeat`` synchronized loops of ``inner`` calls of f, per call, after one warm-up call."""
    f()
    be.synchronize()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            f()
        be.synchronize()
        ts.append((time.perf_counter() - t0) / inner)
    return statistics.median(ts)


def profile(L, kernels, repeat):
    be = get_backend("cupy")
    cp = be.xp
    hisq_cuda.set_enabled(kernels)
    geom = Geometry((L, L, L, L), be)
    rng = CounterRNG(7)
    w8 = rng.gaussian("s", geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    u = GaugeField(geom, cp.ascontiguousarray(su3.expm_su3(cp.moveaxis(su3.algebra_from_coefficients(0.3 * w8),
                                                                        -3, 0))))
    shape = u.links.shape
    g = cp.random.default_rng(1)
    noise = lambda: g.standard_normal(shape) + 1j * g.standard_normal(shape)
    fat = {e: noise() for e in EPS}
    long = {e: noise() for e in EPS}
    fl = hisq_links_multi(u, EPS)[0]
    v, w = fl.V, fl.W
    d = noise()
    t = {}
    t["links (hisq_links_multi)"] = timed(be, lambda: hisq_links_multi(u, EPS), repeat)
    t["  fat7 V"] = timed(be, lambda: sm.fat_link(geom, u.links, sm.FAT7), repeat)
    t["  U(3) projection W"] = timed(be, lambda: u3_unitarize(v), repeat)
    t["  level-2 fat X"] = timed(be, lambda: sm.fat_link(geom, w, sm.HISQ_LEVEL2), repeat)
    t["  Naik L"] = timed(be, lambda: sm.naik_link(geom, w, -1 / 24), repeat)
    t["force chain (hisq_force)"] = timed(be, lambda: hisq_force(u, fat, long, links=fl), repeat)
    t["  level-2 adjoint D_W"] = timed(be, lambda: hisq_level2_vjp(geom, w, fat, long), repeat)
    t["  U(3) derivative D_V"] = timed(be, lambda: u3_unitarize_vjp(v, d), repeat)
    t["  fat7 adjoint D_U"] = timed(be, lambda: sd.fat_link_vjp(geom, u.links, sm.FAT7, d), repeat)
    t["  TA(U D_U)"] = timed(be, lambda: momentum_derivative(u.links, d), repeat)

    zs = [g.standard_normal(geom.shape + (3,)) + 1j * g.standard_normal(geom.shape + (3,)) for _ in range(9)]

    def outer():
        for poles in ([9, 7, 7, 7], [7]):
            f_acc = cp.zeros(shape, dtype=cp.complex128)
            l_acc = cp.zeros_like(f_acc)
            for n in poles:
                add_outer_products(geom, zs[:n], np.linspace(1, 2, n), f_acc, l_acc)
    t["outer products (add_outer_products)"] = timed(be, outer, repeat)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--twin", type=int, nargs="*", default=[16], help="sizes also timed without the kernels")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {}
    for L in a.sizes:
        for kernels in ([False, True] if L in a.twin else [True]):
            key = f"{L}^4 {'kernels' if kernels else 'twin (array code on CuPy)'}"
            res[key] = profile(L, kernels, a.repeat)
            print(f"== {key}", flush=True)
            for k, v in res[key].items():
                print(f"  {k:40s} {1e3 * v:10.2f} ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
