"""``hmc bench dslash``: HISQ dslash rate and bandwidth, CG iteration time, mixed against double CG on one device;
under mpiexec (or with --grid/--local/--transports/--graph) the distributed GPU Dslash and CG iteration per
transport (:mod:`bench.dslash_dist_cuda`)."""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from comms.config import RunConfig
from lattice import CounterRNG, Geometry, get_backend

from .gauge import copy_bandwidth


def _random_links(geom, rng, stream, scale=1.0):
    """Random 3x3 complex link matrices (timing only: the operator's cost does not depend on their values)."""
    g = rng.gaussian(stream, geom.site_ids(), 4 * 18).reshape(geom.shape + (4, 3, 3, 2))
    m = (g[..., 0] + 1j * g[..., 1]) * scale
    return geom.xp.ascontiguousarray(geom.xp.moveaxis(m, -3, 0))


def timing_links(geom, rng):
    """(fat, long) to time the hop with: random fat links, and Naik links of the application's form, -1/24 times
    SU(3) matrices, which the GPU table compresses as it does HISQ's (docs/perf-notes.md "Long-link compression")."""
    from lattice import su3

    return _random_links(geom, rng, "fat", 0.3), -su3.reunitarize(_random_links(geom, rng, "long")) / 24


def _event_time(backend, fn, repeat):
    """Median seconds per call; device events on the GPU, wall clock on the CPU."""
    fn()
    backend.synchronize()
    times = []
    for _ in range(repeat):
        if backend.is_gpu:
            cp = backend.xp
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_dslash(args) -> dict:
    """Dslash (one parity of D, 16 hops) rate, bytes and fraction of the copy bandwidth; CG iteration time and its
    split between the operator and the linear algebra; mixed against double CG to a 1e-10 answer."""
    from solvers import StaggeredDslash, cg, mixed_cg
    from solvers.staggered_cuda import hop_bytes

    if _dist_wanted(args):
        return bench_dslash_dist(args)
    backend = get_backend(args.backend or "auto")
    half = {"half": "all", "half-naik": "naik"}.get(args.precision, "off")
    config = replace(RunConfig.from_environment(), dslash_half_links=half)
    geom = Geometry(tuple(args.lattice), backend, config=config)
    rng = CounterRNG(3)
    fat, long = timing_links(geom, rng)
    dtype = np.complex128 if args.precision == "double" else np.complex64
    d = StaggeredDslash(geom, fat, long).converted(dtype)
    xp = geom.xp
    g = rng.gaussian("src", geom.site_ids(), 6).reshape(geom.shape + (3, 2))
    psi = (g[..., 0] + 1j * g[..., 1]).astype(dtype)
    out = xp.zeros_like(psi)
    vh = geom.volume // 2
    t_hop = _event_time(backend, lambda: d.hop(psi, 0, out), args.repeat)
    site_bytes = hop_bytes(dtype, compressed=d.links_compressed, half=d.half_links)
    nbytes = site_bytes * vh
    bw = copy_bandwidth(backend)
    res = {"backend": backend.name, "lattice": list(args.lattice), "precision": args.precision,
           "hop_s": t_hop, "gflops": d.hop_flops() / t_hop / 1e9, "GBps": nbytes / t_hop / 1e9,
           "copy_GBps": bw / 1e9, "fraction_of_copy_bandwidth": nbytes / t_hop / bw, "bytes_per_site": site_bytes,
           "long_links_compressed": d.links_compressed, "half_links": d.half_links}
    # CG iteration time on the even-odd normal operator, fixed iteration count
    d64 = StaggeredDslash(geom, fat, long)
    A = d64.even_odd(0.01).normal
    b = d64.even_odd(0.01).prepare(psi.astype(np.complex128))
    n_it = 50
    inv = cg(tol=1e-30, maxiter=n_it, raise_on_fail=False)(A)
    t_cg = _event_time(backend, lambda: inv.solve(b), max(1, args.repeat // 5))
    t_op = _event_time(backend, lambda: A(b), args.repeat)
    res.update({"cg_iteration_s": t_cg / n_it, "cg_operator_s": t_op, "cg_linalg_s": t_cg / n_it - t_op})
    # mixed against double CG to 1e-10
    M_eo = d64.even_odd(0.05)
    t0 = time.perf_counter()
    _, st_d = cg(1e-10, 5000)(M_eo.normal).solve(M_eo.prepare(psi.astype(np.complex128)))
    backend.synchronize()
    t_double = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, st_m = mixed_cg(1e-10, 5000)(M_eo.normal).solve(M_eo.prepare(psi.astype(np.complex128)))
    backend.synchronize()
    t_mixed = time.perf_counter() - t0
    res.update({"cg_double_s": t_double, "cg_double_iters": st_d.iters, "cg_double_true_residual": st_d.true_residual,
                "cg_mixed_s": t_mixed, "cg_mixed_iters": st_m.iters, "cg_mixed_true_residual": st_m.true_residual})
    if not getattr(args, "json", False):
        L = "x".join(map(str, args.lattice))
        print(f"bench dslash {L} {args.precision} on {backend.name}:")
        print(f"  hop (one parity)  {t_hop * 1e6:10.1f} us  {res['gflops']:8.1f} GFLOP/s  {res['GBps']:8.1f} GB/s = "
              f"{100 * res['fraction_of_copy_bandwidth']:.1f}% of copy bandwidth {bw / 1e9:.0f} GB/s "
              f"({site_bytes} B/site{', Naik links compressed' if d.links_compressed else ''}"
              f"{'' if d.half_links == 'off' else f', {d.half_links} links in 16 bits'})")
        print(f"  CG iteration (double, m=0.01)  {1e6 * t_cg / n_it:10.1f} us: operator {1e6 * t_op:.1f} us, "
              f"linear algebra {1e6 * (t_cg / n_it - t_op):.1f} us")
        print(f"  to 1e-10 (m=0.05): double CG {t_double:.3f} s ({st_d.iters} it), mixed CG {t_mixed:.3f} s "
              f"({st_m.iters} it), true residuals {st_d.true_residual:.1e} / {st_m.true_residual:.1e}")
    return res


# ------------------------------------------------------------------------------------------------------------------
# distributed GPU Dslash and CG iteration per transport (hmc bench dslash --grid ... under mpiexec)

def _dist_wanted(args) -> bool:
    from comms import launched_size

    return bool(getattr(args, "grid", None) or getattr(args, "local", None) or getattr(args, "transports", None)
                or getattr(args, "graph", False) or launched_size() > 1)


def bench_dslash_dist(args) -> dict:
    """Per local volume L^4 and transport: the full D (two hops, two exchanges) and one device-CG iteration
    (A = 4m^2 - D_eo D_oe, device-resident scalars, reductions through the halo engine), device time per call
    (max over ranks, median of three blocks); with ``--graph`` also the stream-gated graph replays, the cost of
    per-replay memop updates (docs/halo-protocol.md option 2) and the phase split of an uncaptured hop."""
    from comms import ProcessGrid
    from comms.grid import choose_grid, world
    from comms.halo import FALLBACK, check_transport_name
    from comms.transport.registry import with_capabilities

    from .dslash_dist_cuda import close_graph_mode

    backend = get_backend(args.backend or "cupy")
    if not backend.is_gpu:
        raise ValueError("hmc bench dslash --grid/--transports/--graph measures the distributed GPU hop: use "
                         "--backend cupy on a machine with a GPU")
    comm = world()
    config = getattr(args, "run_config", None)
    text = (getattr(args, "transports", None) or (config and config.transport)
            or ",".join((FALLBACK,) + with_capabilities(gpu_buffers=True)))
    transports = [t.strip() for t in text.split(",") if t.strip()]
    for t in transports:
        check_transport_name(t)
    locs = getattr(args, "local", None) or [8]
    grid_dims = tuple(args.grid) if getattr(args, "grid", None) else None
    reps = int(getattr(args, "reps", 0) or 100)
    rows = []
    for L in locs:
        gd = grid_dims or choose_grid(comm.size, (L * 2,) * 4)
        lattice = tuple(L * p for p in gd)
        for tr in transports:
            grid = ProcessGrid(gd, transport=tr)
            geom = Geometry(lattice, backend, grid)
            rows += _dist_rows(args, geom, gd, L, tr, reps)
            close_graph_mode(geom)
            grid.close()
    out = {"rows": rows}
    if comm.rank == 0:
        if getattr(args, "out", None):
            import json

            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
        if not getattr(args, "json", False):
            print(format_dist_rows(rows))
    return out


def _dist_rows(args, geom, gd: tuple, L: int, tr: str, reps: int) -> list:
    """The rows of one (local volume, transport): uncaptured, and with ``--graph`` on a capturing transport
    (stream_gated) the graph replays with parallel and serial receive chains."""
    from solvers import StaggeredDslash
    from solvers.staggered_dist_cuda import PhaseProfile

    from comms.transport import registry

    from .dslash_dist_cuda import DslashRunner, cg_iteration_seconds, graph_split, memop_update_cost

    grid, rows = geom.grid, []
    rng = CounterRNG(3)
    fat, long = timing_links(geom, rng)
    d = StaggeredDslash(geom, fat, long)
    g = rng.gaussian("src", geom.site_ids(), 6).reshape(geom.shape + (3, 2))
    psi = g[..., 0] + 1j * g[..., 1]
    hop = d._hop_impl
    modes = [(False, None)]
    if getattr(args, "graph", False) and registry.lookup(tr).capabilities.graph_capture:
        modes += [(True, True), (True, False)]
    eng = grid.halo
    for graph, par in modes:
        if par is not None:            # stream_gated receive chains in parallel (default) or serial
            eng.parallel_recv = par
        row = {"ranks": grid.size, "grid": "x".join(map(str, gd)), "local": L, "lattice": list(geom.dims),
               "transport": tr, "graph": graph, "hop": type(hop).__name__,
               "recv": {True: "parallel", False: "serial", None: ""}[par]}
        run = DslashRunner(d, psi, graph=graph)
        row["dslash_full_us"] = 1e6 * run.time(reps)
        row["dslash_hop_us"] = row["dslash_full_us"] / 2
        cg_s, cg_st = cg_iteration_seconds(d, 0.01, psi * (geom.parity() == 0)[..., None])
        row["cg_iter_us"], row["cg_graph_iterations"] = 1e6 * cg_s, cg_st.extra.get("graph_iterations", 0)
        if graph:
            row["graph_split"] = graph_split(d, psi, reps)
            try:
                row["option2"] = memop_update_cost(run.graph, run.stream, reps, grid.active_comm)
            except Exception as e:  # noqa: BLE001 - recorded: the measurement is optional
                row["option2_error"] = f"{type(e).__name__}: {e}"
        elif hasattr(hop, "profile"):
            hop.profile = PhaseProfile()
            with run.stream:
                for _ in range(20):
                    run.run()
            run.stream.synchronize()
            row["phases"] = hop.profile.summary()
            hop.profile = None
        rows.append(row)
        del run
        if par is not None:
            eng.parallel_recv = True
    return rows


def format_dist_rows(rows) -> str:
    """A Markdown table of :func:`bench_dslash_dist` rows."""
    lines = ["| ranks | grid | local | transport | graph | hop us | full D us | CG iteration us | phases (device us: "
             "pack/post/interior/wait/exterior; host us of post and wait) | option 2 (set memop params) wall us/replay "
             "D |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ph = r.get("phases")
        pt = ""
        if ph:
            pt = "/".join(f"{1e3 * ph[k]['device_ms']:.1f}" for k in ("pack", "post", "interior", "wait", "exterior"))
            pt += f"; {1e3 * ph['post']['host_ms']:.0f}, {1e3 * ph['wait']['host_ms']:.0f}"
        o2 = ""
        if r.get("graph_split"):
            gs = r["graph_split"]
            pt = (f"graph per hop: kernels only {gs['kernels_only_us']:.1f}, exchange only "
                  f"{gs['exchange_only_us']:.1f}, whole {gs['whole_us']:.1f}")
        if r.get("option2_error"):
            o2 = r["option2_error"][:80]
        if r.get("option2"):
            a = r["option2"]
            o2 = f"{a['set_params']['wall_us']:.1f} vs {a['flags']['wall_us']:.1f} ({a['memop_nodes']} nodes)"
        graph = ("yes" + (f" ({r['recv']} receives)" if r.get("recv") else "")) if r["graph"] else "no"
        lines.append(f"| {r['ranks']} | {r['grid']} | {r['local']}^4 | {r['transport']} | {graph} "
                     f"| {r['dslash_hop_us']:.1f} | {r['dslash_full_us']:.1f} | {r['cg_iter_us']:.1f} | {pt} | {o2} |")
    return "\n".join(lines)
