"""``hmc bench gauge``: gauge-force and pure-gauge trajectory time per site, with the force's achieved memory
bandwidth as a fraction of the device's measured copy bandwidth (METHOD.md: measure the ceiling, count the bytes)
and its flop rate (``force.gauge_force_cuda.force_flops_per_site``). On a GPU the path-table kernel
(``force.gauge_force_cuda.GaugeForceKernel``, what every action outside Wilson / Symanzik runs) is timed on the same
links beside the kernel ``action.force`` runs (the staple-sharing one for these actions)."""
from __future__ import annotations

import time

import numpy as np

from lattice import CounterRNG, GaugeField, Geometry, get_backend

from hmc.assemble import make_gauge_action
from hmc.integrators import Level, build_schedule, force_evaluations
from hmc.monomials import GaugeMonomial
from hmc.trajectory import hmc_trajectory


def _timed(backend, fn, repeat: int) -> float:
    """Median wall time of ``fn`` over ``repeat`` runs after one warm-up, synchronizing the device."""
    fn()
    backend.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        backend.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def copy_bandwidth(backend, nbytes: int = 1 << 30) -> float:
    """Measured device copy bandwidth in bytes/s (bytes read + bytes written), a large array copied in place."""
    xp = backend.xp
    if not backend.is_gpu:
        nbytes = min(nbytes, 1 << 28)
    a = xp.ones(nbytes // 8, dtype=xp.float64)
    b = xp.empty_like(a)
    t = _timed(backend, lambda: b.__setitem__(Ellipsis, a), 10)
    return 2 * a.nbytes / t


def force_bytes(volume: int) -> int:
    """Fewest bytes a gauge-force kernel must move: read 4 links per site, write 4 momenta (complex128 3x3)."""
    return 2 * 4 * 9 * 16 * volume


def _site_tile_times(backend, action, u, args) -> dict:
    """{"ty,tz,tt": the force's time} with each of ``--site-tiles`` as the staple-sharing kernels' site tile
    (force.gauge_force_cuda.SITE_TILE), the default restored afterwards; {} for the other kernels."""
    from force.gauge_force_cuda import StapleForceKernel

    kernel = action._cuda_kernel(backend, "force")
    if not isinstance(kernel, StapleForceKernel) or not getattr(args, "site_tiles", None):
        return {}
    times = {}
    try:
        for text in args.site_tiles:
            kernel.tile = tuple(int(v) for v in text.split(","))
            times[text] = _timed(backend, lambda: action.force(u), args.repeat)
    finally:
        kernel.tile = None
    return times


def bench_gauge(args) -> dict:
    backend = get_backend(args.backend or "auto")
    geom = Geometry(tuple(args.lattice), backend)
    rng = CounterRNG(7)
    u = GaugeField.random(geom, rng)
    # a smooth-ish field: typical of a thermalized run, and far from the unit gauge
    from lattice import su3
    from hmc.momenta import random_momenta

    u = GaugeField(geom, su3.expm_su3(0.3 * random_momenta(geom, rng)) @ GaugeField.unit(geom).links)
    g = {"action": args.action, "beta": 6.0, "u0": 0.9 if args.action == "symanzik" else 1.0, "nf": 0,
         "quark_loops": "none"}
    action = make_gauge_action(g)
    t_force = _timed(backend, lambda: action.force(u), args.repeat)
    t_paths = None
    if backend.is_gpu:
        from force.gauge_force_cuda import GaugeForceKernel

        walk = GaugeForceKernel(backend, action.shapes)
        t_paths = _timed(backend, lambda: walk(u.links, action.beta, geom.local_dims), args.repeat)
    t_tiles = _site_tile_times(backend, action, u, args) if backend.is_gpu else {}
    mon = [GaugeMonomial(action)]
    steps = 10
    sched = build_schedule([Level("omelyan", steps, ["gauge"])], 1.0)
    n_force = force_evaluations(sched)["gauge"]          # counted from the schedule that runs, not assumed
    t_traj = _timed(backend, lambda: hmc_trajectory(u, CounterRNG(1), mon, sched), max(1, args.repeat // 2))
    bw = copy_bandwidth(backend)
    achieved = force_bytes(geom.volume) / t_force
    from force.gauge_force_cuda import force_flops_per_site

    flops = force_flops_per_site(action.shapes) * geom.volume
    out = {"backend": backend.name, "lattice": list(args.lattice), "action": args.action,
           "force_s": t_force, "force_ns_per_site": 1e9 * t_force / geom.volume,
           "trajectory_s": t_traj, "trajectory_us_per_site": 1e6 * t_traj / geom.volume,
           "force_evaluations_per_trajectory": n_force,
           "force_bytes": force_bytes(geom.volume), "force_GBps": achieved / 1e9,
           "copy_GBps": bw / 1e9, "fraction_of_copy_bandwidth": achieved / bw,
           "force_flops": flops, "force_GFLOPs": flops / t_force / 1e9, "force_path_table_s": t_paths,
           "site_tiles_s": t_tiles}
    if not getattr(args, "json", False):
        print(f"bench gauge {args.action} {'x'.join(map(str, args.lattice))} on {backend.name}:")
        print(f"  force        {t_force * 1e3:10.3f} ms  {out['force_ns_per_site']:9.2f} ns/site  "
              f"{out['force_GBps']:8.2f} GB/s = {100 * out['fraction_of_copy_bandwidth']:.1f}% of measured copy "
              f"bandwidth {out['copy_GBps']:.1f} GB/s, {out['force_GFLOPs']:.1f} GFLOP/s ({flops / 1e9:.3g} GFLOP)")
        if t_paths is not None:
            print(f"  path table   {t_paths * 1e3:10.3f} ms  (the walk of every loop, no staple shared: "
                  f"{t_paths / t_force:.2f} x the force above)")
        for tile, t in t_tiles.items():
            print(f"  site tile {tile:>8} {t * 1e3:8.3f} ms  ({t / t_force:.2f} x the force above)")
        print(f"  trajectory   {t_traj:10.3f} s   {out['trajectory_us_per_site']:9.2f} us/site "
              f"(Omelyan, {steps} steps, {n_force} force evaluations)")
    return out
