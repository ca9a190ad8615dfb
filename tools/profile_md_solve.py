"""Where the time of one MD force solve goes on one GPU (issue 19): the production light pseudofermion's multishift
at MD tolerance 1e-5, in double, in single (the first stage alone), and MILC's cgprec 1 (single, then every shift's
true residual checked and refined in double), against the operator alone and the multishift's cost per shift; then
cgprec 1 with the mixed-precision first stage (``multishift_reliable``: single Krylov vectors, the light shifts'
x_i in double, reliable updates of the base system) against the all-single one: the refinement iterations per shift
before and after (the "refine" line). Random HISQ-like links (tools/solver_graph_timing.py's recipe), 9 shifts
spread like the light rational's MD poles (the smallest 2e-4 ~ 4 m^2 of the light quark's 0.007).

    PYTHONPATH=. python3 tools/profile_md_solve.py 32 [--tol 1e-5] [--json out.json]
    PYTHONPATH=. python3 tools/profile_md_solve.py 8 --backend numpy --only-refine     # the CPU figure
    PYTHONPATH=. python3 tools/profile_md_solve.py 32 --layouts                        # issue 19's layouts

``--layouts``: the operator and multishift timings with the multishift's Krylov vectors parity-compact (the
default) and strided (full-lattice, HMC_SOLVER_FUSED=strided), each with its linear algebra's share of an
iteration and the bytes the model says that linear algebra must move (:func:`la_bytes`), then no cgprec 1 solves.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from lattice import CounterRNG, Geometry, get_backend
from solvers import StaggeredDslash, multishift_cg

SHIFTS = list(np.geomspace(2e-4, 1.5, 9))


def links(geom, rng, stream, scale):
    xp = geom.xp
    g = rng.gaussian(stream, geom.site_ids(), 4 * 18).reshape(tuple(geom.shape) + (4, 3, 3, 2))
    m = (g[..., 0] + 1j * g[..., 1]) * scale
    eye = np.eye(3)[None, None, None, None, None]
    return xp.ascontiguousarray(xp.moveaxis(xp.asarray(m) + xp.asarray(eye), -3, 0))


def problem(L, backend):
    """The even-odd normal operator A (double) and an even source b."""
    geom = Geometry((L,) * 4, get_backend(backend))
    rng = CounterRNG(5)
    d = StaggeredDslash(geom, links(geom, rng, "fat", 0.08) * 0.45, links(geom, rng, "long", 0.02) * 0.02)
    g = rng.gaussian("src", geom.site_ids(), 6).reshape(tuple(geom.shape) + (3, 2))
    xp = geom.xp
    b = xp.asarray(g[..., 0] + 1j * g[..., 1]) * xp.asarray((geom.parity() == 0)[..., None])
    return geom, d.even_odd(0.0).normal, b


def timed(geom, f, repeat=3):
    f()
    geom.backend.synchronize()
    ts, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        geom.backend.synchronize()
        ts.append(time.perf_counter() - t0)
    return min(ts), out


def summary(t, st) -> dict:
    ref = st.extra.get("refine") or []
    return {"s": t, "iters": st.iters, "us_per_iter": 1e6 * t / max(st.iters, 1), "matvecs": st.matvecs,
            "refine_iters": [r.iters for r in ref], "refine_sum": sum(r.iters for r in ref),
            "refine_s": sum(r.time for r in ref), "true_residual": st.true_residual,
            "reliable_updates": st.extra.get("reliable_updates", 0)}


def la_bytes(nshift: int, dtype, half_volume: int, compact: bool) -> int:
    """DRAM bytes of one multishift iteration's linear algebra by the model of docs/perf-notes.md: the update kernel
    reads s, r, w and every p_i, x_i and writes s, r, p_i, x_i, the reduction reads r, w and writes w (the base shift
    folded in): 8 + 4 n vector passes. A compact pass moves the parity's V/2 colour vectors; a strided one every
    32-byte sector the parity's sites touch in the full-lattice layout: all of them in single precision (24-byte
    sites every 48 bytes), 2 of every 3 in double (48 every 96)."""
    site = 3 * np.dtype(dtype).itemsize
    per_pass = half_volume * site
    if not compact:
        per_pass = per_pass * 2 if site == 24 else per_pass * 4 // 3
    return (8 + 4 * nshift) * per_pass


def layout_times(geom, A, b, res, repeat):
    """:func:`operator_times` with the multishift's Krylov vectors parity-compact and strided; the summary lines
    (the linear algebra: an iteration less the operator on that layout's vectors)."""
    from solvers.operator import set_fused_blas

    for layout, mode in (("compact", None), ("strided", "strided")):
        old = set_fused_blas(mode)
        try:
            sub = res[layout] = {"tol": res["tol"]}
            operator_times(geom, A, b, sub, repeat, layouts=True)
        finally:
            set_fused_blas(old)
    vh = geom.volume // 2
    nan = float("nan")
    for layout in ("compact", "strided"):
        sub = res[layout]
        print(f"{layout}: operator us double / single: full-lattice {sub['op_double_us']:.1f} / "
              f"{sub['op_single_us']:.1f}, compact {sub.get('op_double_compact_us', nan):.1f} / "
              f"{sub.get('op_single_compact_us', nan):.1f}")
        for prec, name, n in (("single", "ms_single_stage", len(SHIFTS)), ("single", "ms_single_1shift", 1),
                              ("double", "ms_double", len(SHIFTS))):
            compact = bool(sub[name]["compact"])          # (the solve's own answer: False on the NumPy path)
            it, op = sub[name]["us_per_iter"], sub[f"op_{prec}_compact_us" if compact else f"op_{prec}_us"]
            gb = la_bytes(n, np.complex64 if prec == "single" else np.complex128, vh, compact) / 1e9
            la = it - op
            print(f"{layout:8s} {prec:6s} {n} shift(s) (compact {compact}): iteration {it:7.1f} us, operator "
                  f"{op:6.1f} us, linear algebra {la:6.1f} us = {100 * la / it:4.1f} % ({gb:.3f} GB model, "
                  f"{gb / max(la, 1e-9) * 1e3:.2f} TB/s); {sub[name]['iters']} iterations, {sub[name]['s']:.3f} s")
        per = (sub["ms_single_stage"]["us_per_iter"] - sub["ms_single_1shift"]["us_per_iter"]) / (len(SHIFTS) - 1)
        print(f"{layout:8s} single: {per:.1f} us per extra shift per iteration")


def operator_times(geom, A, b, res, repeat=3, layouts=False):
    """The operator (two hops; with ``layouts`` also on parity-compact vectors, ``CompactNormal``, where it has that
    form) and the multishift solves' times into ``res`` (``layouts``: no 5-shift solve)."""
    from solvers.staggered import parity_sites

    A32, b32 = A.converted(np.complex64), b.astype(np.complex64)
    w, w32 = geom.xp.empty_like(b), geom.xp.empty_like(b32)
    ops = [("op_double", A, b, w), ("op_single", A32, b32, w32)]
    if layouts and A.compact() is not None:
        even = parity_sites(geom, 0)
        for name, op, v in (("op_double_compact", A, b), ("op_single_compact", A32, b32)):
            vc = geom.xp.ascontiguousarray(v.reshape(-1, 3)[even])
            ops.append((name, op.compact(), vc, geom.xp.empty_like(vc)))
    for name, op, v, out in ops:
        t, _ = timed(geom, lambda: [op.apply_into(v, out) for _ in range(20)], repeat)
        res[name + "_us"] = 1e6 * t / 20
    solves = [("ms_double", lambda: multishift_cg(SHIFTS, res["tol"], 5000, check_residual=False)(A), b),
              ("ms_single_stage", lambda: multishift_cg(SHIFTS, res["tol"], 5000, check_residual=False)(A32), b32),
              ("ms_single_1shift", lambda: multishift_cg(SHIFTS[:1], res["tol"], 5000, check_residual=False)(A32),
               b32)]
    if not layouts:
        solves.append(("ms_single_5shift",
                       lambda: multishift_cg(SHIFTS[:5], res["tol"], 5000, check_residual=False)(A32), b32))
    for name, make, src in solves:
        inv = make()
        t, (x, st) = timed(geom, lambda: inv.solve(src, check=False), repeat)
        res[name] = summary(t, st)
        res[name]["compact"] = st.extra.get("compact")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("L", type=int)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--backend", default="cupy")
    ap.add_argument("--only-refine", action="store_true", help="only the two cgprec 1 solves (no operator timings)")
    ap.add_argument("--layouts", action="store_true", help="operator and multishift timings in both Krylov vector "
                    "layouts (parity-compact, strided), no cgprec 1 solves")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    geom, A, b = problem(a.L, a.backend)
    res = {"L": a.L, "tol": a.tol, "shifts": SHIFTS, "backend": a.backend}
    if a.layouts:
        layout_times(geom, A, b, res, a.repeat)
        print(json.dumps(res, indent=1, default=float))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1, default=float)
        return
    if not a.only_refine:
        operator_times(geom, A, b, res)
    for name, acc in (("mixed_cgprec1", False), ("mixed_cgprec1_reliable", True)):
        inv = multishift_cg(SHIFTS, a.tol, 5000).mixed_precision(accumulate=acc)(A)
        t, (x, st) = timed(geom, lambda: inv.solve(b, check=False), a.repeat)
        res[name] = summary(t, st)
    old, new = res["mixed_cgprec1"], res["mixed_cgprec1_reliable"]
    print(json.dumps(res, indent=1, default=float))
    print(f"refine iterations {old['refine_iters']} = {old['refine_sum']} -> {new['refine_iters']} = "
          f"{new['refine_sum']}; multishift iterations {old['iters']} -> {new['iters']} "
          f"({new['reliable_updates']} reliable updates); cgprec 1 solve {old['s']:.3f} s -> {new['s']:.3f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=float)


if __name__ == "__main__":
    main()
