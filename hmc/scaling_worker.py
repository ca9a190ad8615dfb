"""One configuration of a strong-scaling study (``hmc scaling``), run on every rank by the launcher.

    mpiexec -n N python -m hmc.scaling_worker --spec '{"lattice": [8, 8, 8, 8], ...}' --out result.json

The driver (:mod:`hmc.scaling`) starts one of these per (lattice, rank count, transport); rank 0 writes one JSON
file with everything measured (or the error), which the driver stores in the study's HDF5 file.

Measured per operation (``spec["what"]``):

* ``halo``: one full halo exchange of a colour-vector field (complex128 3-vectors, 48 B a site), depth 3 (the HISQ
  Naik term; less where the local extent is smaller), over every partitioned dimension, both directions, as
  ``Geometry.halo`` does it; the received slabs are checked against the global field. Plus, with
  ``halo_sizes``, the latency sweep of ``comms.bench.bench_halo`` (ring of the ranks along t, faces of L^3 sites):
  one-way and round-trip time and host time against the message size.
* ``dslash``: one parity of the HISQ dslash (16 hops, ``StaggeredDslash.hop``), as ``hmc bench dslash``.
* ``cg``: CG on the even-odd normal operator A = 4m^2 - D_eo D_oe with a fixed iteration count (tol 1e-30): the
  time per iteration, the solve's set-up amortized over the iterations.
* ``trajectory``: one pure-gauge HMC trajectory (one-loop Symanzik, Omelyan, ``traj_steps`` steps), the cost of
  the gauge part of an HMC update.
* ``rhmc``: one short HISQ 2+1+1 RHMC trajectory (:func:`rhmc_deck`: the production masses 0.013 / 0.065 / 0.838
  with the project's rational functions runs/rationals/rationals.hisq211_b580, Symanzik beta 5.8 u0 0.85535 with
  the HISQ quark loops, 3G1F with ``traj_steps`` steps of a short ``RHMC_TAU``), built by the deck machinery
  (hmc.deck.loads, hmc.assemble.make_monomials / make_schedule, as ``hmc run``) from a random near-unit start,
  Metropolis off. One trajectory per timed loop (``reps`` 1: a trajectory is long); its phase split is the
  trajectory's own timers (``RHMC_PHASES``), not the halo wrappers below.

Times: ``repeats`` loops of ``reps`` operations (``reps`` chosen on rank 0 so that a loop lasts about ``min_time``
seconds), each loop's time being the slowest rank's; the driver reports the median and the spread over loops.

Where the time goes: one more loop runs with timers around the halo engine and the reductions (the classes are
wrapped in this process only, nothing else changes):

* ``halo_start``: ``HaloEngine.start``: faces copied into the send buffers (mpi) or straight into the peer's
  shared receive buffer (shm: this copy *is* the transfer), MPI requests posted, signals stored;
* ``halo_wait``: waiting for a peer (its signal or the MPI completion; also the shm credit before a send);
* ``halo_finish``: the exchanges' ``finish`` without their waits: faces copied out, credits returned (and, for
  mpi, the first completion tests);
* ``local_shift``: the rest of ``Geometry.shift``/``Geometry.halo`` (the local roll and slab views) on every
  dimension, partitioned or not;
* ``reductions``: ``Geometry.sum`` (the local part and the collective);
* ``compute``: everything else (the matrix-vector arithmetic, gathers, linear algebra).

They are exclusive times per operation on each rank (per rank in the results); their sum is the instrumented
loop's time. On the CPU there is no overlap of interior and exterior work (shifts are blocking), so the interior /
exterior split of a GPU dslash has no counterpart here.

On the GPU (cupy backend, the hop a CUDA kernel: :func:`gpu_device_path`) the operations go through
:mod:`solvers.staggered_dist_cuda` instead: ``dslash`` is ``DslashRunner`` (the full D, two hops, on its own stream;
time per hop), ``cg`` is ``DeviceCG`` (device-resident scalars, sums through the halo engine; time per iteration,
the answers after ``cg_iters`` iterations from x = 0), ``halo`` is the distributed hop's face exchange (pack,
transport, ghost buffer), each timed with device events around the loop (host wall beside it). With
``spec["graph"]`` the dslash and CG iteration are captured in CUDA graphs and replayed (stream_gated). The phase
split (``GPU_PHASES``, :meth:`Context.phases_device`): device events of ``PhaseProfile`` around the hop's phases
(pack, post, interior, wait, exterior; the 1-rank kernel is all interior), the CG's device time outside the hops
(reductions), the graph replay's device time (graph rows), and host overhead: the rest of the wall time.

Answers (compared by the driver with the 1-rank run): SHA-256 of the gathered dslash output (bitwise), of the CG
solution after the fixed iteration count with exact reductions (bitwise for any decomposition), the norm of the
fast-reduction CG residual (to rounding), the halo check, and for the trajectory the final H and plaquette (to
rounding: the link updates are not bitwise across decompositions) with the gathered links' hash for information;
for the RHMC trajectory dH, the final H and the plaquette (to rounding) and the multishift CG iteration count
(equal; on the GPU to a few iterations, as tests/hmc/test_gpu_hmc_dist.py allows).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
import traceback

import numpy as np

PHASES = ("halo_start", "halo_wait", "halo_finish", "local_shift", "reductions", "compute")
# GPU phases (device events on the op's stream; solvers.staggered_dist_cuda.PhaseProfile for the hop's own phases)
GPU_PHASES = ("pack", "post", "interior", "wait", "exterior", "reductions", "graph", "host_overhead")
HOP_PHASES = ("pack", "post", "interior", "wait", "exterior")
LOCAL_DEPTH = 3           # halo depth of the HISQ Naik term
# RHMC trajectory phases (host clock; the fermion phases synchronize the device before reading it): the multishift
# solves of the heat bath (GR), the two actions (FA) and the force (MD); the fermion link smearing (fat/long links,
# every build); the fermion force without its solves (outer products + HISQ chain rule); the gauge force and the
# link updates (exp(dt P) U, re-unitarization; these two are not synchronized: on a GPU part of their kernels' time
# lands in the next phase); the rest (momenta, the actions' arithmetic, the Metropolis draw)
RHMC_PHASES = ("solver_gr", "solver_fa", "solver_md", "fermion_links", "fermion_force", "gauge_force",
               "link_update", "other")
RHMC_TAU = 0.05           # trajectory length of the rhmc operation: short, so that dH stays modest from a rough start
RHMC_SEED = 2911          # the Philox seed of its momenta and pseudofermions (the same numbers for any grid)
RHMC_START = 0.3          # the near-unit start: U = exp(0.3 P) with P Gaussian (as the trajectory operation)


class InjectedFault(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------------------------
# phase timers

class PhaseTimer:
    """Exclusive wall time per phase, by wrapping methods of classes for the duration of ``with``."""

    def __init__(self):
        self.acc = {p: 0.0 for p in PHASES[:-1]}
        self.stack = []
        self.saved = []

    def _wrap(self, owner, attr, phase):
        orig = owner.__dict__.get(attr)
        if orig is None:                 # not defined by this class (or renamed): leave it unwrapped
            return
        timer = self
        clock = time.perf_counter

        def wrapper(*a, **k):
            t0 = clock()
            timer.stack.append(0.0)
            try:
                return orig(*a, **k)
            finally:
                el = clock() - t0
                child = timer.stack.pop()
                timer.acc[phase] += el - child
                if timer.stack:
                    timer.stack[-1] += el

        wrapper.__wrapped__ = orig
        self.saved.append((owner, attr, orig))
        setattr(owner, attr, wrapper)

    def __enter__(self):
        from comms import halo as _halo
        from lattice import geometry as _geometry

        for p in self.acc:
            self.acc[p] = 0.0
        G = _geometry.Geometry
        self._wrap(G, "shift", "local_shift")
        self._wrap(G, "halo", "local_shift")
        self._wrap(G, "sum", "reductions")
        # every halo engine and exchange class of the comms modules this run loaded (the CPU engine, its fast
        # paths, the GPU engine: host-side times there): start -> halo_start, finish -> halo_finish, the waits
        mods = [_halo] + [m for name, m in sorted(sys.modules.items())
                          if name.startswith("comms.cuda.") and m is not None]
        for mod in mods:
            for cls in [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == mod.__name__]:
                engine = issubclass(cls, _halo.HaloEngine)
                for attr in list(cls.__dict__):
                    if engine and attr == "start":
                        self._wrap(cls, attr, "halo_start")
                    elif engine and attr in ("_wait", "_wait_request", "_wait_req"):
                        self._wrap(cls, attr, "halo_wait")
                    elif not engine and attr == "finish":
                        self._wrap(cls, attr, "halo_finish")
        return self

    def __exit__(self, *exc):
        while self.saved:
            owner, attr, orig = self.saved.pop()
            setattr(owner, attr, orig)
        return False


# ------------------------------------------------------------------------------------------------------------

class Context:
    def __init__(self, spec, geom):
        from comms import world

        self.spec = spec
        self.geom = geom
        self.grid = geom.grid
        self.comm = world()
        self.backend = geom.backend
        self.rank = self.comm.rank

    def sync(self):
        self.backend.synchronize()

    def measure(self, fn, ops_per_call=1.0, reps=None, warmup=True, phase_loop=True):
        """(samples in s per operation: the slowest rank's, per loop; reps; phases per rank (rank 0) or None).

        ``reps`` fixes the operations per loop (else chosen from ``min_time`` by one timed call); ``warmup`` False
        leaves out the warm-up call (the caller ran the operation already); ``phase_loop`` False leaves out the
        instrumented loop (phases None)."""
        spec, grid = self.spec, self.grid
        if warmup:
            fn()                               # warm up (buffers, caches, kernels)
            self.sync()
        if reps is None:
            grid.barrier()
            t0 = time.perf_counter()
            fn()
            self.sync()
            t1 = grid.max(time.perf_counter() - t0)
            reps = max(1, min(100000, int(math.ceil(spec["min_time"] / max(t1, 1e-9)))))
        reps = self.comm.bcast(int(reps), root=0)
        samples = []
        for _ in range(spec["repeats"]):
            grid.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            self.sync()
            samples.append(grid.max(time.perf_counter() - t0) / reps / ops_per_call)
        if not phase_loop:
            return samples, reps, None
        grid.barrier()
        with PhaseTimer() as timer:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            self.sync()
            total = time.perf_counter() - t0
        per = reps * ops_per_call
        mine = [timer.acc[p] / per for p in PHASES[:-1]]
        mine.append(max(0.0, total / per - sum(mine)))
        phases = self.comm.gather(mine, root=0)
        return samples, reps, phases


    # --- GPU: device events ---------------------------------------------------------------------------------
    def measure_device(self, fn, stream, ops_per_call=1.0):
        """GPU timing: (device-event samples in s per operation, host wall samples, reps); each the slowest rank's.
        ``fn`` enqueues on ``stream`` (the DslashRunner's or DeviceCG's own stream)."""
        import cupy as cp

        spec, grid = self.spec, self.grid
        fn()
        stream.synchronize()
        grid.barrier()
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        t1 = grid.max(time.perf_counter() - t0)
        reps = max(1, min(100000, int(math.ceil(spec["min_time"] / max(t1, 1e-9)))))
        reps = self.comm.bcast(reps, root=0)
        dev, wall = [], []
        for _ in range(spec["repeats"]):
            grid.barrier()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            t0 = time.perf_counter()
            e0.record(stream)
            for _ in range(reps):
                fn()
            e1.record(stream)
            e1.synchronize()
            w = time.perf_counter() - t0
            d = cp.cuda.get_elapsed_time(e0, e1) / 1e3
            dev.append(grid.max(d) / reps / ops_per_call)
            wall.append(grid.max(w) / reps / ops_per_call)
        return dev, wall, reps

    def phases_device(self, fn, stream, holder, ops_per_call, hops_per_call, graph, reps, cg=False):
        """Where the time of a GPU operation goes, per rank (gathered on rank 0): seconds per operation of the
        phases ``GPU_PHASES`` and the host time of the hop's phases.

        Uncaptured runs: device events around every call of ``fn`` on ``stream`` give its device time; the hop's
        own phases come from ``PhaseProfile`` (pack, post, interior, wait, exterior: device events on the compute
        stream) or, for the 1-rank CUDA hop, from events around each hop (all of it ``interior``); for the CG the
        device time outside the hops is ``reductions`` (dot products, the sums through the halo engine, vector
        updates). ``host_overhead`` is the rest of the host wall time per operation (the GPU waiting for Python).
        Graph replays: ``graph`` is the device time per operation, ``host_overhead`` the wall time beyond it."""
        import cupy as cp

        n = max(2, min(int(reps), 200))
        per = n * ops_per_call
        hop = getattr(holder, "hop", None)
        prof = restore = None
        if not graph and hop is not None:
            from solvers.staggered_dist_cuda import DistHop, PhaseProfile

            if isinstance(hop, DistHop):
                prof = hop.profile = PhaseProfile()
            else:
                prof = _HopTimer(hop)
                holder.hop, restore = prof, hop
        try:
            stream.synchronize()
            self.grid.barrier()
            pairs = []
            t0 = time.perf_counter()
            for _ in range(n):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                fn()
                b.record(stream)
                pairs.append((a, b))
            stream.synchronize()
            wall = (time.perf_counter() - t0) / per
            dev = sum(cp.cuda.get_elapsed_time(a, b) for a, b in pairs) / 1e3 / per
            ph = dict.fromkeys(GPU_PHASES, 0.0)
            host = dict.fromkeys(GPU_PHASES, 0.0)
            if graph:
                ph["graph"] = dev
                ph["host_overhead"] = max(0.0, wall - dev)
            elif prof is not None:
                summ = prof.summary()
                k = hops_per_call / ops_per_call          # hop calls per operation
                for name in HOP_PHASES:
                    if name in summ:
                        ph[name] = summ[name]["device_ms"] * 1e-3 * k
                        host[name] = summ[name]["host_ms"] * 1e-3 * k
                hops = sum(ph[x] for x in HOP_PHASES)
                if cg:
                    ph["reductions"] = max(0.0, dev - hops)
                    ph["host_overhead"] = max(0.0, wall - max(dev, hops))
                else:
                    ph["host_overhead"] = max(0.0, wall - hops)
        finally:
            if hop is not None and hasattr(hop, "profile"):
                hop.profile = None
            if restore is not None:
                holder.hop = restore
        mine = [ph[x] for x in GPU_PHASES]
        mine_host = [host[x] for x in GPU_PHASES]
        return self.comm.gather(mine, root=0), self.comm.gather(mine_host, root=0)


class _HopTimer:
    """A hop wrapped with device events (the 1-rank CUDA hop has no phase profile): all of it is ``interior``."""

    def __init__(self, hop):
        self.hop, self.pending = hop, []

    def __call__(self, *a, **k):
        import cupy as cp

        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        e0.record()
        self.hop(*a, **k)
        e1.record()
        self.pending.append((e0, e1, time.perf_counter() - t0))

    def summary(self) -> dict:
        import cupy as cp

        if not self.pending:
            return {}
        self.pending[-1][1].synchronize()
        dev = sum(cp.cuda.get_elapsed_time(a, b) for a, b, _ in self.pending) / len(self.pending)
        host = sum(h for *_, h in self.pending) / len(self.pending) * 1e3
        return {"interior": {"device_ms": dev, "host_ms": host}}


def _sha(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _field(geom, rng, stream):
    g = rng.gaussian(stream, geom.site_ids(), 6).reshape(geom.shape + (3, 2))
    return geom.xp.ascontiguousarray(g[..., 0] + 1j * g[..., 1])


def _global_field(geom, rng, stream):
    nx, ny, nz, nt = geom.dims
    ids = np.arange(geom.volume, dtype=np.int64).reshape(nt, nz, ny, nx)
    g = np.asarray(rng.gaussian(stream, ids, 6)).reshape(ids.shape + (3, 2))
    return g[..., 0] + 1j * g[..., 1]


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
        from comms.bench import bench_halo

        rows = bench_halo((ctx.spec["transport"],), tuple(sizes), "vector", ctx.spec["min_time"],
                          max(3, ctx.spec["repeats"]))
        res["latency"] = rows


def _links(ctx):
    from hmc.bench import _random_links
    from lattice import CounterRNG

    rng = CounterRNG(3)
    fat = _random_links(ctx.geom, rng, "fat", 0.3)
    long = _random_links(ctx.geom, rng, "long", 0.05)
    return fat, long


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
                            "bytes": hop_bytes(np.complex128) * geom.volume // 2,
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
# GPU operations through solvers.staggered_dist_cuda (device-resident halo, DslashRunner, DeviceCG, graphs)

def gpu_device_path(d) -> str | None:
    """Why the GPU operations cannot go through solvers.staggered_dist_cuda for this dslash, or None (they can: the
    hop is the 1-rank CUDA kernel or the distributed DistHop)."""
    try:
        from solvers.staggered_cuda import CudaHop
        from solvers.staggered_dist_cuda import DslashRunner  # noqa: F401 - importable
    except Exception as e:  # noqa: BLE001
        return f"solvers.staggered_dist_cuda does not import ({type(e).__name__}: {e})"
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
        from comms.bench import bench_halo

        res["latency"] = bench_halo((ctx.spec["transport"],), tuple(sizes), "vector", ctx.spec["min_time"],
                                    max(3, ctx.spec["repeats"]))


def op_dslash_gpu(ctx, res, d):
    """The full D (two hops, two exchanges) through ``DslashRunner``, captured in a CUDA graph with
    ``spec["graph"]``; times per hop (one parity), device events."""
    from lattice import CounterRNG
    from solvers.staggered_cuda import hop_bytes
    from solvers.staggered_dist_cuda import DslashRunner

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
                            "bytes": hop_bytes(np.complex128) * geom.volume // 2, "clock": "device events",
                            "graph": graph, "per": "hop (one parity; the full D of DslashRunner over 2)",
                            "halo_bytes_per_rank": _dslash_halo_bytes_dist(d)}


def _dslash_halo_bytes_dist(d) -> int:
    hop = d._hop_impl
    return int(sum(v.size for v in getattr(hop, "sends", {}).values()) * 16)


def op_cg_gpu(ctx, res, d):
    """CG iterations on A = 4m^2 - D_eo D_oe through ``DeviceCG`` (device-resident scalars, sums through the halo
    engine), captured in a CUDA graph with ``spec["graph"]``; a fixed iteration count for the answers, then the
    time per iteration from device events."""
    from lattice import CounterRNG
    from solvers.staggered_dist_cuda import DeviceCG

    geom, spec = ctx.geom, ctx.spec
    graph, m, n_it = bool(spec.get("graph")), spec["mass"], spec["cg_iters"]
    src = _field(geom, CounterRNG(5), "src")
    b = src * (geom.parity() == 0)[..., None]
    cg = DeviceCG(d, m, b, parity=0, graph=graph)
    cg.start()
    cg.iterate(n_it)
    res["answers"]["cg_residual"] = math.sqrt(max(cg.residual2(), 0.0))
    whole = geom.gather(cg.solution())
    if ctx.rank == 0:
        res["answers"]["cg_sha256"] = _sha(whole)

    def step():
        cg.iterate(1)

    cg.start()
    samples, wall, reps = ctx.measure_device(step, cg.stream)
    cg.start()
    phases, host = ctx.phases_device(step, cg.stream, cg, 1, 2, graph, reps, cg=True)
    res["ops"]["cg"] = {"samples_s": samples, "wall_samples_s": wall, "reps": reps, "phases": phases,
                        "phases_host": host, "phase_names": list(GPU_PHASES), "iterations": n_it, "mass": m,
                        "flops": 2 * d.hop_flops() + 60 * geom.volume // 2 * 3, "clock": "device events",
                        "graph": graph, "reductions": "device (DeviceCG: sums through the halo engine)"}


def op_trajectory(ctx, res):
    from force.gauge_action import SymanzikAction
    from lattice import CounterRNG, GaugeField, su3
    from lattice.gauge import plaquette

    from .integrators import Level, build_schedule
    from .momenta import random_momenta
    from .monomials import GaugeMonomial
    from .trajectory import hmc_trajectory

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

    path = Path(__file__).resolve().parents[1] / "runs" / "rationals" / "rationals.hisq211_b580"
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

    from . import deck as deckmod
    from .assemble import make_monomials, make_schedule
    from .momenta import random_momenta
    from .rngs import make_rng
    from .trajectory import hmc_trajectory, link_exponential

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
    samples, reps, _ = ctx.measure(trajectory, reps=1, warmup=False, phase_loop=False)
    timed = runs[1:]
    mine = np.mean([rhmc_phases(t.timers, tot, gauge_names) for t, tot in timed], axis=0).tolist()
    phases = ctx.comm.gather(mine, root=0)
    same = all(sum(tot[f"cg_{ph}"] for ph in ("gr", "fa", "md")) == sum(iters.values()) for _, tot in timed)
    res["ops"]["rhmc"] = {"samples_s": samples, "reps": reps, "phases": phases, "phase_names": list(RHMC_PHASES),
                          "clock": "host perf_counter (trajectory timers)", "steps": steps,
                          "tau": d["integrator"]["tau"], "scheme": "3g1f", "cg_iterations": iters,
                          "solves": {ph: int(totals[f"solves_{ph}"]) for ph in ("gr", "fa", "md")},
                          "link_builds": int(totals["fermion_link_builds"]), "dH": float(tr.delta_h),
                          "repeatable": bool(same),
                          "action": "HISQ 2+1+1 RHMC, ml/ms/mc 0.013/0.065/0.838, symanzik beta 5.8 (hisq loops), "
                                    "3g1f, metropolis off"}


# ------------------------------------------------------------------------------------------------------------

def _gpu_info(backend) -> dict:
    if not backend.is_gpu:
        return {}
    cp = backend.xp
    try:
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return {"gpu": name, "gpu_count": cp.cuda.runtime.getDeviceCount(),
                "driver": cp.cuda.runtime.driverGetVersion(), "runtime": cp.cuda.runtime.runtimeGetVersion()}
    except Exception as e:  # noqa: BLE001 - metadata only
        return {"gpu": f"unknown ({e})"}


def _mpi_library() -> str:
    from comms.grid import launched_size

    if launched_size() <= 1:
        return ""
    from comms.grid import mpi

    return mpi().Get_library_version().strip().splitlines()[0]


def _fault(spec):
    """Testing hook: HMC_FAULT_INJECT=scaling_fail:KEY or scaling_hang:KEY fails or hangs the configuration whose
    key contains KEY."""
    text = os.environ.get("HMC_FAULT_INJECT", "")
    kind, _, key = text.partition(":")
    if kind in ("scaling_fail", "scaling_hang") and key and key in spec["key"]:
        if kind == "scaling_hang":
            time.sleep(3600)
        raise InjectedFault(f"injected fault (HMC_FAULT_INJECT={text})")


def run(spec) -> dict:
    from comms import ProcessGrid, world
    from comms.halo import format_table
    from lattice import Geometry, get_backend

    t_start = time.perf_counter()
    comm = world()
    _fault(spec)
    backend = get_backend(spec.get("backend") or "numpy")
    n = comm.size
    if n != spec["ranks"]:
        raise RuntimeError(f"launched on {n} rank(s), the configuration wants {spec['ranks']}: check the launcher "
                           "(--launcher / HMC_MPIEXEC) passes the rank count")
    transport = None if spec["transport"] == "serial" else spec["transport"]
    grid = ProcessGrid(tuple(spec["grid"]), transport=transport)
    geom = Geometry(tuple(spec["lattice"]), backend, grid=grid)
    ctx = Context(spec, geom)
    res = {"status": "ok", "ops": {}, "answers": {}, "backend": backend.name, "grid": list(grid.dims),
           "local_dims": list(geom.local_dims), "hostname": platform.node(), "mpi_library": _mpi_library(),
           "mps_client": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")}
    res.update(_gpu_info(backend))
    table = grid.transport_table()
    if ctx.rank == 0:
        res["transport_table"] = table
        res["transport_table_text"] = format_table(table, grid.describe()) if table else ""
        res["links"] = "+".join(sorted({r["transport"] for r in table})) or "none"
    what = spec["what"]
    graph = bool(spec.get("graph"))
    d, why = None, "not a GPU run"
    if backend.is_gpu and {"halo", "dslash", "cg"} & set(what):
        from solvers import StaggeredDslash

        fat, long = _links(ctx)
        d = StaggeredDslash(geom, fat, long)
        why = gpu_device_path(d)
        res["dslash_impl"] = type(d._hop_impl).__name__ if why is None else f"array body ({why})"
        res["phase_clock"] = "device events" if why is None else "host perf_counter"
    else:
        res["phase_clock"] = "host perf_counter"
    if graph and why is not None and {"dslash", "cg"} & set(what):
        raise RuntimeError(f"--graph: {why}")
    if "halo" in what:
        if graph:
            res["ops"]["halo"] = {"status": "n/a", "note": "graph rows time the dslash and CG (the halo is the "
                                  "uncaptured row's)"}
        elif why is None:
            op_halo_gpu(ctx, res, d)
        else:
            op_halo(ctx, res)
    if "dslash" in what or "cg" in what:
        from solvers import StaggeredDslash

        if d is None:
            fat, long = _links(ctx)
            d = StaggeredDslash(geom, fat, long)
        for op, on_gpu, on_host in (("dslash", op_dslash_gpu, op_dslash), ("cg", op_cg_gpu, op_cg)):
            if op not in what:
                continue
            if why is not None:
                on_host(ctx, res, d)
                continue
            try:
                on_gpu(ctx, res, d)
            except Exception as e:  # noqa: BLE001 - an uncaptured row falls back to the host-driven path, noted
                # (a rank that fails alone leaves its peers waiting in an exchange until HMC_COMMS_TIMEOUT, then
                # they fail and fall back too; wrong halos after that would show in the answers check)
                if graph:
                    raise
                res.setdefault("gpu_path_error", {})[op] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                res["dslash_impl"] = f"{res.get('dslash_impl', '')}; {op}: host-driven path after an error"
                on_host(ctx, res, d)
        if why is None:
            from solvers.staggered_dist_cuda import close_graph_mode

            close_graph_mode(geom)
    if "trajectory" in what:
        op_trajectory(ctx, res)
    if "rhmc" in what:
        if graph:
            res["ops"]["rhmc"] = {"status": "n/a", "note": "graph rows time the dslash and CG (the RHMC trajectory "
                                  "is the uncaptured row's)"}
        else:
            op_rhmc(ctx, res)
    grid.close()
    res["wall_s"] = time.perf_counter() - t_start
    return res


def _write(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hmc.scaling_worker")
    ap.add_argument("--spec", required=True, help="the configuration, JSON")
    ap.add_argument("--out", required=True, help="result file (JSON), written by rank 0")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)
    from comms import launched_size

    try:
        res = run(spec)
    except BaseException as e:  # noqa: BLE001 - report any failure, then leave without MPI_Finalize
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
        print(f"hmc scaling worker: rank {rank}: {type(e).__name__}: {msg}", file=sys.stderr, flush=True)
        if os.environ.get("HMC_SCALING_TRACEBACK") == "1":
            traceback.print_exc()
        if rank == 0:
            _write(args.out, {"status": "failed", "error": f"{type(e).__name__}: {msg}"})
        sys.stdout.flush()
        os._exit(3)
    if res is not None and (launched_size() <= 1 or _rank0()):
        _write(args.out, res)
    return 0


def _rank0() -> bool:
    from comms import world

    return world().rank == 0


if __name__ == "__main__":
    sys.exit(main())
