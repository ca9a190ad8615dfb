"""The worker's measuring context: the phase names, the RHMC operation's constants, the host phase timer (hooks
in ``comms.halo`` and ``lattice.geometry``), the per-configuration :class:`Context` (loops sized from a minimum
time, repeats, samples, device-event phases) and the deterministic fields the operations start from."""
from __future__ import annotations

import hashlib
import math
import sys
import time

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
        # every halo engine and exchange class of the comms modules this run loaded (the CPU engine, the
        # transports' fast paths, the GPU engine: host-side times there): start -> halo_start, finish -> halo_finish, the waits
        mods = [_halo] + [m for name, m in sorted(sys.modules.items())
                          if name.startswith(("comms.cuda.", "comms.transport.")) and m is not None]
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
        ``fn`` enqueues on ``stream`` (the DslashRunner's own stream, or the caller's)."""
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

