"""The operations a scaling worker measures (``spec["what"]``): halo, dslash and CG on the array path or through
the distributed GPU runners (:mod:`bench.dslash_dist_cuda`), the pure-gauge trajectory and the short HISQ RHMC
trajectory (see the docstring of :mod:`bench.scaling.worker`)."""
from __future__ import annotations

import importlib
import json

import numpy as np

from .worker_context import GPU_PHASES, LOCAL_DEPTH, RHMC_PHASES, RHMC_SEED, RHMC_START, RHMC_TAU, _field, \
    _global_field, _sha


# ------------------------------------------------------------------------------------------------------------
# operations

def op_halo(ctx, res):
    from lattice import CounterRNG
    from lattice.geometry import site_axis

    geom = ctx.geom
    parts = [mu for mu in range(4) if geom.grid.partitioned[mu]]
    if not parts:
        res["ops"]["halo"] = {"status": "n/a", "note": "no partitioned dimension (one rank): no halo"}
        return
    depth = min([LOCAL_DEPTH] + [geom.local_dims[mu] for mu in parts])
    whole = _global_field(geom, CounterRNG(11), "halo")
    psi = geom.xp.asarray(np.ascontiguousarray(geom.local_part(whole)))
    got = geom.halo(psi, depth=depth)
    ok = True
    for mu in parts:
        ax = site_axis(mu)
        n_glob, n_loc, off = geom.dims[mu], geom.local_dims[mu], geom.offset[mu]
        for side, idx in ((0, np.arange(off - depth, off)), (1, np.arange(off + n_loc, off + n_loc + depth))):
            # (mu, 0): the backward neighbour's last slabs, (mu, 1): the forward neighbour's first, periodic
            moved = np.take(whole, idx % n_glob, axis=ax)
            o, l = list(geom.offset), list(geom.local_dims)
            o[mu], l[mu] = 0, depth
            want = moved[o[3]:o[3] + l[3], o[2]:o[2] + l[2], o[1]:o[1] + l[1], o[0]:o[0] + l[0]]
            ok = ok and np.array_equal(geom.backend.to_numpy(got[(mu, side)]), want)
    ok = geom.grid.sum(int(not ok)) == 0
    res["answers"]["halo_ok"] = bool(ok)
    face = sum(2 * depth * geom.local_volume // geom.local_dims[mu] for mu in parts) * 48
    samples, reps, phases = ctx.measure(lambda: geom.halo(psi, depth=depth))
    res["ops"]["halo"] = {"samples_s": samples, "reps": reps, "phases": phases, "depth": depth,
                          "bytes_per_rank": face, "dims": "".join("xyzt"[mu] for mu in parts)}
    sizes = ctx.spec.get("halo_sizes") or []
    if sizes and ctx.comm.size > 1:
        from bench.halo import bench_halo

        rows = bench_halo((ctx.spec["transport"],), tuple(sizes), "vector", ctx.spec["min_time"],
                          max(3, ctx.spec["repeats"]))
        res["latency"] = rows


def _links(ctx):
    from bench.dslash import timing_links
    from lattice import CounterRNG

    rng = CounterRNG(3)
    return timing_links(ctx.geom, rng)


def op_dslash(ctx, res, d):
    from lattice import CounterRNG
    from solvers.staggered_cuda import hop_bytes

    geom = ctx.geom
    psi = _field(geom, CounterRNG(3), "src")
    out = geom.xp.zeros_like(psi)
    d.hop(psi, 0, out)
    whole = geom.gather(out)
    if ctx.rank == 0:
        res["answers"]["dslash_sha256"] = _sha(whole)
    res["answers"]["dslash_norm2"] = float(geom.sum((out.conj() * out).real))
    samples, reps, phases = ctx.measure(lambda: d.hop(psi, 0, out))
    res["ops"]["dslash"] = {"samples_s": samples, "reps": reps, "phases": phases, "flops": d.hop_flops(),
                            "bytes": hop_bytes(np.complex128, compressed=d.links_compressed) * geom.volume // 2,
                            "halo_bytes_per_rank": _dslash_halo_bytes(geom)}


def _dslash_halo_bytes(geom) -> int:
    """Bytes a rank sends per dslash hop: shifts by +-1 and +-3 of the full colour-vector field along every
    partitioned dimension (this CPU implementation moves both parities)."""
    total = 0
    for mu in range(4):
        if geom.grid.partitioned[mu]:
            face = geom.local_volume // geom.local_dims[mu]
            total += sum(min(k, geom.local_dims[mu]) for k in (1, 1, 3, 3)) * face * 48
    return total


def op_cg(ctx, res, d):
    from lattice import CounterRNG
    from solvers import cg, reductions, set_reductions

    geom, spec = ctx.geom, ctx.spec
    m = spec["mass"]
    eo = d.even_odd(m)
    A = eo.normal
    b = eo.prepare(_field(geom, CounterRNG(5), "src"))
    n_it = spec["cg_iters"]
    inv = cg(tol=1e-30, maxiter=n_it, raise_on_fail=False)(A)
    x, st = inv.solve(b)
    iters = st.iters
    res["answers"]["cg_residual"] = st.residual
    old = set_reductions("exact")
    try:
        xe, _ = inv.solve(b)
    finally:
        set_reductions(old)
    whole = geom.gather(xe)
    if ctx.rank == 0:
        res["answers"]["cg_exact_sha256"] = _sha(whole)
    samples, reps, phases = ctx.measure(lambda: inv.solve(b), ops_per_call=iters)
    res["ops"]["cg"] = {"samples_s": samples, "reps": reps, "phases": phases, "iterations": iters,
                        "matvecs": st.matvecs, "flops": st.flops / max(1, iters), "mass": m,
                        "reductions": reductions()}


# ------------------------------------------------------------------------------------------------------------
# GPU operations through solvers.staggered_dist_cuda (device-resident halo, DslashRunner, graphs) and the
# production CG

def gpu_device_path(d) -> str | None:
    """Why the GPU operations cannot go through solvers.staggered_dist_cuda for this dslash, or None (they can: the
    hop is the 1-rank CUDA kernel or the distributed DistHop)."""
    try:
        from solvers.staggered_cuda import CudaHop
        importlib.import_module("bench.dslash_dist_cuda")
    except Exception as e:  # noqa: BLE001
        return f"bench.dslash_dist_cuda does not import ({type(e).__name__}: {e})"
    if not isinstance(d._hop_impl, CudaHop):
        return (f"the dslash runs the array body ({getattr(d._hop_impl, '__name__', type(d._hop_impl).__name__)}), "
                "not a CUDA hop: local extents that the distributed kernel's layout does not allow")
    return None


def op_halo_gpu(ctx, res, d):
    """The distributed hop's own face exchange (pack kernel, exchange through the transport into the ghost buffer),
    checked against the global field and timed with device events."""
    import cupy as cp

    from lattice import CounterRNG
    from solvers.staggered_dist_cuda import DistHop

    geom = ctx.geom
    hop = d._hop_impl
    if not isinstance(hop, DistHop) or not hop.keys:
        res["ops"]["halo"] = {"status": "n/a", "note": "no partitioned dimension (one rank): no halo"}
        return
    depth = hop.depth
    whole = _global_field(geom, CounterRNG(11), "halo")
    psi = cp.ascontiguousarray(cp.asarray(geom.local_part(whole)))
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()

    def exchange():
        with stream:
            hop.pack(psi)
            hop.finish(hop.start())

    exchange()
    stream.synchronize()
    ok = True
    for (mu, side), got in hop.recvs.items():
        ax = 3 - mu
        n_glob, n_loc, off = geom.dims[mu], geom.local_dims[mu], geom.offset[mu]
        idx = np.arange(off - depth, off) if side == 0 else np.arange(off + n_loc, off + n_loc + depth)
        moved = np.take(whole, idx % n_glob, axis=ax)
        o, l = list(geom.offset), list(geom.local_dims)
        o[mu], l[mu] = 0, depth
        want = moved[o[3]:o[3] + l[3], o[2]:o[2] + l[2], o[1]:o[1] + l[1], o[0]:o[0] + l[0]]
        ok = ok and np.array_equal(cp.asnumpy(got), want)
    ok = geom.grid.sum(int(not ok)) == 0
    res["answers"]["halo_ok"] = bool(ok)
    samples, wall, reps = ctx.measure_device(exchange, stream)
    face = sum(v.size for v in hop.sends.values()) * 16
    res["ops"]["halo"] = {"samples_s": samples, "wall_samples_s": wall, "reps": reps, "depth": depth,
                          "bytes_per_rank": face, "dims": "".join("xyzt"[mu] for mu in hop.pdims),
                          "clock": "device events", "what_exchanged": "the distributed hop's faces (both parities)"}
    sizes = ctx.spec.get("halo_sizes") or []
    if sizes and ctx.comm.size > 1:
        from bench.halo import bench_halo

        res["latency"] = bench_halo((ctx.spec["transport"],), tuple(sizes), "vector", ctx.spec["min_time"],
                                    max(3, ctx.spec["repeats"]))


def op_dslash_gpu(ctx, res, d):
    """The full D (two hops, two exchanges) through ``DslashRunner``, captured in a CUDA graph with
    ``spec["graph"]``; times per hop (one parity), device events."""
    from lattice import CounterRNG
    from solvers.staggered_cuda import hop_bytes
    from bench.dslash_dist_cuda import DslashRunner

    geom, graph = ctx.geom, bool(ctx.spec.get("graph"))
    psi = _field(geom, CounterRNG(3), "src")
    run = DslashRunner(d, psi, graph=graph)
    out = run.run()
    run.stream.synchronize()
    whole = geom.gather(out)
    if ctx.rank == 0:
        res["answers"]["dslash_sha256"] = _sha(whole)
    res["answers"]["dslash_norm2"] = float(geom.sum((out.conj() * out).real))
    samples, wall, reps = ctx.measure_device(run.run, run.stream, ops_per_call=2)
    phases, host = ctx.phases_device(run.run, run.stream, run, 2, 2, graph, reps * 2)
    res["ops"]["dslash"] = {"samples_s": samples, "wall_samples_s": wall, "reps": reps, "phases": phases,
                            "phases_host": host, "phase_names": list(GPU_PHASES), "flops": d.hop_flops(),
                            "bytes": hop_bytes(np.complex128, compressed=d.links_compressed) * geom.volume // 2,
                            "clock": "device events",
                            "graph": graph, "per": "hop (one parity; the full D of DslashRunner over 2)",
                            "halo_bytes_per_rank": _dslash_halo_bytes_dist(d)}


def _dslash_halo_bytes_dist(d) -> int:
    hop = d._hop_impl
    return int(sum(v.size for v in getattr(hop, "sends", {}).values()) * 16)


class _HopOf:
    """The hop of a StaggeredDslash as an attribute ``hop`` (what :meth:`Context.phases_device` wraps to time it)."""

    def __init__(self, d):
        self.d = d

    @property
    def hop(self):
        return self.d._hop_impl

    @hop.setter
    def hop(self, impl):
        self.d._hop_impl = impl


def op_cg_gpu(ctx, res, d):
    """The production CG (:func:`solvers.cg` on A = 4m^2 - D_eo D_oe, an unreachable tolerance, so exactly
    ``cg_iters`` iterations per solve): device-resident iterations replayed from CUDA graphs where every link can be
    captured (solvers.krylov_graph: the stream_gated transport, one GPU), else host-driven. Time per iteration of
    whole solves (set-up and true residual included) from device events on the caller's stream, which the solve
    waits for at its end."""
    import cupy as cp
    from lattice import CounterRNG
    from solvers import cg

    geom, spec = ctx.geom, ctx.spec
    m, n_it = spec["mass"], spec["cg_iters"]
    b = _field(geom, CounterRNG(5), "src") * (geom.parity() == 0)[..., None]
    inv = cg(tol=1e-30, maxiter=n_it, raise_on_fail=False)(d.even_odd(m).normal)
    x, st = inv.solve(b)
    res["answers"]["cg_residual"] = st.residual
    whole = geom.gather(x)
    if ctx.rank == 0:
        res["answers"]["cg_sha256"] = _sha(whole)
    graph = st.extra.get("graph_iterations", 0) > 0

    def solve():
        inv.solve(b)

    stream = cp.cuda.get_current_stream()
    samples, wall, reps = ctx.measure_device(solve, stream, ops_per_call=st.iters)
    phases, host = ctx.phases_device(solve, stream, _HopOf(d), st.iters, 2 * st.matvecs, graph, reps, cg=True)
    res["ops"]["cg"] = {"samples_s": samples, "wall_samples_s": wall, "reps": reps, "phases": phases,
                        "phases_host": host, "phase_names": list(GPU_PHASES), "iterations": st.iters,
                        "matvecs": st.matvecs, "mass": m, "flops": st.flops / max(1, st.iters),
                        "clock": "device events", "graph": graph,
                        "reductions": ("device (solvers.krylov_graph: sums through the halo engine)" if graph else
                                       "host (geom.sum per iteration)")}


def op_trajectory(ctx, res):
    from force.gauge_action import SymanzikAction
    from lattice import CounterRNG, GaugeField, su3
    from lattice.gauge import plaquette

    from hmc.integrators import Level, build_schedule
    from hmc.momenta import random_momenta
    from hmc.monomials import GaugeMonomial
    from hmc.trajectory import hmc_trajectory

    geom, spec = ctx.geom, ctx.spec
    rng = CounterRNG(7)
    u = GaugeField(geom, su3.expm_su3(0.3 * random_momenta(geom, rng)) @ GaugeField.unit(geom).links)
    mon = [GaugeMonomial(SymanzikAction(7.4, 0.89, 0, "none"))]
    steps = spec["traj_steps"]
    sched = build_schedule([Level("omelyan", steps, ["gauge"])], 1.0)
    v, tr = hmc_trajectory(u, CounterRNG(1), mon, sched, metropolis=False)
    whole = geom.gather(geom.xp.moveaxis(v.links, 0, 4))      # site axes first
    if ctx.rank == 0:
        res["answers"]["trajectory_sha256"] = _sha(whole)
    res["answers"]["trajectory_dH"] = tr.delta_h
    res["answers"]["trajectory_H_end"] = tr.end.total
    res["answers"]["trajectory_plaquette"] = float(sum(plaquette(v)))
    samples, reps, phases = ctx.measure(lambda: hmc_trajectory(u, CounterRNG(1), mon, sched, metropolis=False))
    res["ops"]["trajectory"] = {"samples_s": samples, "reps": reps, "phases": phases, "steps": steps,
                                "action": "symanzik (pure gauge), omelyan"}


def rationals_file() -> str:
    """The project's HISQ 2+1+1 rational functions (runs/rationals/rationals.hisq211_b580), found from this package
    (the repository root is the folder above ``hmc``)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "runs" / "rationals" / "rationals.hisq211_b580"
    if not path.is_file():
        raise FileNotFoundError(f"the rhmc operation needs the rational functions {path} (part of the repository)")
    return str(path)


def rhmc_deck(lattice, steps: int, tau: float = RHMC_TAU, seed: int = RHMC_SEED) -> str:
    """The TOML deck of the ``rhmc`` operation: runs/hisq211_16.toml's physics (Symanzik beta 5.8, u0 0.85535, HISQ
    quark loops with nf 4; HISQ 2+1+1 at ml/ms/mc 0.013/0.065/0.838, 5 pseudofermions of rationals.hisq211_b580) on
    ``lattice``, 3G1F with ``steps`` steps of a short ``tau``, and the tolerances of the multi-rank tests' short deck
    (tests/hmc/hisq211_decks.py: MD 1e-8, FA and GR 1e-10; taylor8 link exponential, re-unitarized every cycle,
    Philox random numbers)."""
    triples = "[" + ", ".join(["[1e-8, 1e-10, 1e-10]"] * 5) + "]"
    return "\n".join([
        "[run]", 'name = "hmc scaling: rhmc"', f"seed = {int(seed)}", 'rng = "philox"', 'start = "cold"',
        "trajectories = 1",
        "[lattice]", f"dims = [{', '.join(str(int(n)) for n in lattice)}]",
        "[gauge]", 'action = "symanzik"', "beta = 5.8", "u0 = 0.85535", 'quark_loops = "hisq"', "nf = 4",
        "[fermions]", 'action = "hisq"', f"rationals = {json.dumps(rationals_file())}",
        "dyn_mass = [0.013, 0.065, 0.838]", "dyn_flavors = [2, 1, 1]", f"cgresid_md_fa_gr = {triples}",
        "max_multicg = 5000",
        "[integrator]", 'scheme = "3g1f"', f"steps = {int(steps)}", f"tau = {float(tau)!r}",
        'link_exponential = "taylor8"', 'reunitarize = "cycle"', ""])


def rhmc_phases(timers: dict, fermion_totals: dict, gauge_names) -> list:
    """Seconds of one RHMC trajectory per phase of ``RHMC_PHASES`` from ``hmc_trajectory``'s timers (link updates,
    force per monomial, total) and the fermion monomial's (``RHMCStats.totals``: link builds, solves per phase, outer
    products, chain rule). The fermion monomial's force timer holds its links, MD solves, outer products and chain
    rule, so those are not counted twice; ``other`` is the total less the named phases."""
    t = fermion_totals
    parts = {"solver_gr": t["time_fermion_solver_GR"], "solver_fa": t["time_fermion_solver_FA"],
             "solver_md": t["time_fermion_solver_MD"], "fermion_links": t["time_fermion_links"],
             "fermion_force": t["time_fermion_outer"] + t["time_fermion_force_chain"],
             "gauge_force": sum(float(timers.get(f"force_{n}", 0.0)) for n in gauge_names),
             "link_update": float(timers.get("links", 0.0))}
    parts["other"] = max(0.0, float(timers["total"]) - sum(parts.values()))
    return [float(parts[p]) for p in RHMC_PHASES]


def op_rhmc(ctx, res):
    """One short HISQ 2+1+1 RHMC trajectory (:func:`rhmc_deck`) from a random near-unit start, Metropolis off; every
    call starts from the same links with a fresh Philox generator, so every call does the same work."""
    from lattice import CounterRNG, GaugeField, su3
    from lattice.gauge import plaquette

    from hmc import deck as deckmod
    from hmc.assemble import make_monomials, make_schedule
    from hmc.momenta import random_momenta
    from hmc.rngs import make_rng
    from hmc.trajectory import hmc_trajectory, link_exponential

    geom, spec = ctx.geom, ctx.spec
    steps = spec["traj_steps"]
    d = deckmod.loads(rhmc_deck(geom.dims, steps))
    monomials = make_monomials(d)
    schedule = make_schedule(d, monomials)
    fermion = next(m for m in monomials if m.kind == "fermion")
    gauge_names = [m.name for m in monomials if m.kind == "gauge"]
    expm = link_exponential(d["integrator"]["link_exponential"])
    reunit = d["integrator"]["reunitarize"]
    u = GaugeField(geom, su3.expm_su3(RHMC_START * random_momenta(geom, CounterRNG(7))) @ GaugeField.unit(geom).links)
    runs = []

    def trajectory():
        rng = make_rng(d["run"]["rng"], d["run"]["seed"], geom.dims)
        v, tr = hmc_trajectory(u, rng, monomials, schedule, expm, reunit, metropolis=False)
        runs.append((tr, fermion.stats.totals()))
        return v, tr

    v, tr = trajectory()                        # the answers; also the warm-up (kernels, buffers)
    ctx.sync()
    totals = runs[0][1]
    iters = {ph: int(totals[f"cg_{ph}"]) for ph in ("gr", "fa", "md")}
    res["answers"]["rhmc_dH"] = float(tr.delta_h)          # plain floats: the result travels as JSON
    res["answers"]["rhmc_H_end"] = float(tr.end.total)
    res["answers"]["rhmc_plaquette"] = float(sum(plaquette(v)))
    res["answers"]["rhmc_cg_iterations"] = sum(iters.values())
    from solvers.krylov_graph import capture_reasons, graph_totals

    g0, why0 = graph_totals(), capture_reasons()
    samples, reps, _ = ctx.measure(trajectory, reps=1, warmup=False, phase_loop=False)
    g1, why1 = graph_totals(), capture_reasons()
    timed = runs[1:]
    graphs = ctx.comm.gather([(g1[k] - g0[k]) / max(1, len(timed)) for k in sorted(g0)], root=0)
    # why the timed trajectories captured (solvers.krylov_graph.capture_reason), per rank: {loop: reason: count}
    reasons = ctx.comm.gather({k: n - why0.get(k, 0) for k, n in why1.items() if n > why0.get(k, 0)}, root=0)
    mine = np.mean([rhmc_phases(t.timers, tot, gauge_names) for t, tot in timed], axis=0).tolist()
    phases = ctx.comm.gather(mine, root=0)
    same = all(sum(tot[f"cg_{ph}"] for ph in ("gr", "fa", "md")) == sum(iters.values()) for _, tot in timed)
    res["ops"]["rhmc"] = {"samples_s": samples, "reps": reps, "phases": phases, "phase_names": list(RHMC_PHASES),
                          "clock": "host perf_counter (trajectory timers)", "steps": steps,
                          "tau": d["integrator"]["tau"], "scheme": "3g1f", "cg_iterations": iters,
                          "solves": {ph: int(totals[f"solves_{ph}"]) for ph in ("gr", "fa", "md")},
                          "link_builds": int(totals["fermion_link_builds"]), "dH": float(tr.delta_h),
                          # per rank, per timed trajectory: CUDA-graph captures, their seconds, replays (solvers)
                          "graphs": {"names": sorted(g0), "per_rank": graphs, "reasons": reasons},
                          "repeatable": bool(same),
                          "action": "HISQ 2+1+1 RHMC, ml/ms/mc 0.013/0.065/0.838, symanzik beta 5.8 (hisq loops), "
                                    "3g1f, metropolis off"}

