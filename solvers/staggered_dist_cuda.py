"""The distributed HISQ hop on the GPU, halos through the transports of comms.cuda without host staging, and a
CG iteration whose reductions also stay on the device, so that a stream-gated Dslash or CG iteration can be captured
in a CUDA graph and replayed with no Python per exchange.

API (what ``hmc bench dslash --grid ...`` and the scaling tool use)
-------------------------------------------------------------------

Build the operator as usual on a partitioned CuPy geometry; the transport is the grid's::

    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from solvers import StaggeredDslash
    grid = ProcessGrid((1, 1, 1, 2), transport="stream_gated")      # or "event", "mpi" (HMC_P2P_TRANSPORT)
    geom = Geometry((8, 8, 8, 16), get_backend("cupy"), grid)
    D = StaggeredDslash(geom, fat, long)      # its hop is a DistHop (registered through solvers.staggered_cuda)
    D.hop(psi, parity, out)                   # pack kernel -> exchange -> interior kernel (overlapped) -> exterior

Every ``StaggeredDslash`` / even-odd operator / ``solvers.cg`` solve on such a geometry then uses it (the CG's
reductions still go through ``geom.sum`` on the host). For graphs and timing:

* ``DslashRunner(D, psi, graph=False)``: ``run()`` applies the full D (two hops, two exchanges) into ``runner.out``
  on its own stream; ``graph=True`` (stream_gated only: every link must be peer-to-peer) switches the engine to
  binary flags (COMMS.md "CUDA graphs", option 1), captures D once and ``run()`` replays the graph.
* ``DeviceCG(D, mass, b, parity=0, graph=False)``: Hestenes-Stiefel CG on A = 4m^2 - D_pq D_qp with every scalar in
  device memory and the global sums reduced through the halo engine (partials exchanged along each partitioned
  dimension and added in grid-coordinate order, so every rank and every transport gets the same bits; the ``mpi``
  transport sums the gathered partials on the host in the same order). ``iterate(n)`` runs n iterations (replays
  of the captured iteration with ``graph=True``); ``residual2()`` syncs and returns |r|^2; ``solve(tol, maxiter)``.
* ``device_time(fn, reps, stream)``: seconds per call of ``fn`` from device events around ``reps`` calls (the
  maximum over ranks, median of three blocks); ``DslashRunner.time(reps)``, ``DeviceCG.time_iteration(reps)``.
* Per-phase split: ``hop = D._hop_impl; hop.profile = PhaseProfile(); ...; hop.profile.summary()`` gives device
  ms per call for pack, post (enqueueing the sends), interior, wait (the compute stream waiting for the halo, incl.
  the unpack copy), exterior, and the host time spent in each; recording costs a few microseconds, so time without
  it.
* ``graph_split(D, psi)``: device us per hop of graphs with only the kernels, only the exchange, and both.
* ``close_graph_mode(geom)``: back to counters (collective) after graph work.
* ``geom.grid.halo.parallel_recv`` (HMC_P2P_PARALLEL_RECV, default on): stream_gated receive chains per link on
  their own streams (parallel graph branches) or one after the other on the compute stream; set it before capture.

Layout: faces are whole slabs (both parities) of depth 3 (Naik) or 1, packed by one kernel into one contiguous
send buffer [face (mu, dir) in sorted order]; received faces land in one ghost buffer [(mu, side)], which the
exterior kernel reads directly (kernel ``hop_dist`` of solvers/kernels/staggered_hop.cu). Interior sites: every hop
stays in the local block; exterior sites: the rest, each computed whole by one thread (all 16 hops in the fixed hop
order), so the answer is deterministic and does not depend on the decomposition or the transport.

Measured on one H200 with 2 and 4 ranks under MPS: runs/gpu_transports/README.md (a captured stream-gated hop is
55 us at 4^4 and 8^4 per rank on 2 ranks, a captured CG iteration 171-179 us; uncaptured transports are Python-bound).
Tested: tests/solvers/test_gpu_distributed.py (double precision; the single-precision kernels are the same template,
not yet run distributed on the device).
"""
from __future__ import annotations

import time
from functools import partial

import numpy as np

from lattice import cuda_source

from .staggered_cuda import BLOCK, CudaHop

RBLOCK = 256
MAX_RBLOCKS = 240


def _is_gpu_engine(engine) -> bool:
    return type(engine).__name__ == "GpuHaloEngine"


class PhaseProfile:
    """Accumulates device and host time per phase of :class:`DistHop` calls (device events on the compute
    stream; host perf_counter). ``summary()``: {phase: {"device_ms": per call, "host_ms": per call}}."""

    PHASES = ("pack", "post", "interior", "wait", "exterior")

    def __init__(self):
        self.calls = 0
        self.pending = []
        self.device = dict.fromkeys(self.PHASES, 0.0)
        self.host = dict.fromkeys(self.PHASES, 0.0)

    def collect(self):
        import cupy as cp

        for evs, hs in self.pending:
            evs[-1].synchronize()
            for k, ph in enumerate(self.PHASES):
                self.device[ph] += cp.cuda.get_elapsed_time(evs[k], evs[k + 1])
                self.host[ph] += 1e3 * (hs[k + 1] - hs[k])
            self.calls += 1
        self.pending = []

    def summary(self) -> dict:
        self.collect()
        n = max(self.calls, 1)
        return {ph: {"device_ms": self.device[ph] / n, "host_ms": self.host[ph] / n} for ph in self.PHASES}


class DistHop(CudaHop):
    """``f(psi, parity, out, a, x, b)`` for a StaggeredDslash on a partitioned CuPy geometry (see the module
    docstring); ``twin=True`` runs the same index arithmetic in NumPy (CPU tests of the layout)."""

    def __init__(self, dslash, twin: bool = False):
        self.dslash = dslash
        geom = dslash.geom
        self.geom, self.twin = geom, bool(twin)
        self.xp = geom.xp
        self.engine = geom.grid.halo
        self.gpu_engine = _is_gpu_engine(self.engine)
        self.naik = dslash.naik
        self.depth = 3 if self.naik else 1
        self.local = tuple(geom.local_dims)
        self.pdims = [mu for mu in range(4) if geom.grid.partitioned[mu]]
        self.pmask = sum(1 << mu for mu in self.pdims)
        self.profile = None
        self._soa = {}
        dtype = np.dtype(dslash.dtype)
        self.dtype = dtype
        self.real = np.float32 if dtype == np.complex64 else np.float64
        nx, ny, nz, nt = self.local
        # faces: send (mu, dir) and receive (mu, side), sorted; each a slab of the local block of extent depth
        self.face_shape = {}
        off, table = 0, []
        for mu in self.pdims:
            fs = [nt, nz, ny, nx, 3]
            fs[3 - mu] = self.depth
            self.face_shape[mu] = tuple(fs)
        size = {mu: int(np.prod(self.face_shape[mu])) for mu in self.pdims}
        self.keys = [(mu, d) for mu in self.pdims for d in (0, 1)]
        offs = {}
        for k in self.keys:
            offs[k] = off
            table.append([k[0], k[1], off, size[k[0]]])
            off += size[k[0]]
        self.total = off
        xp = self.xp
        self.sendbuf = xp.zeros(max(off, 1), dtype=dtype)
        self.ghost = xp.zeros(max(off, 1), dtype=dtype)
        self.sends = {k: self.sendbuf[offs[k]:offs[k] + size[k[0]]].reshape(self.face_shape[k[0]]) for k in self.keys}
        self.recvs = {k: self.ghost[offs[k]:offs[k] + size[k[0]]].reshape(self.face_shape[k[0]]) for k in self.keys}
        goff = np.zeros(8, dtype=np.int64)
        for (mu, side) in self.keys:
            goff[2 * mu + side] = offs[(mu, side)]
        self.goff_host = goff
        self.table_host = np.asarray(table, dtype=np.int32).reshape(-1, 4)
        self.goff = xp.asarray(goff)
        self.table = xp.asarray(self.table_host.ravel() if len(table) else np.zeros(4, np.int32))
        # interior / exterior site lists per output parity (checkerboard indices, as the kernel decodes them)
        self.sites = {}
        for p in (0, 1):
            j = np.arange(geom.local_volume // 2)
            coords = self._decode(j, p)
            inner = np.ones(j.shape, dtype=bool)
            for mu in self.pdims:
                inner &= (coords[mu] >= self.depth) & (coords[mu] < self.local[mu] - self.depth)
            self.sites[p] = (xp.asarray(j[inner].astype(np.int32)), xp.asarray(j[~inner].astype(np.int32)))
        if self.gpu_engine:
            self.engine.reserve(int(max(size.values(), default=1)) * dtype.itemsize)
            self._host_send = self._host_ghost = None
        else:
            self._host_send = np.zeros(max(off, 1), dtype=dtype)
            self._host_ghost = np.zeros(max(off, 1), dtype=dtype)
        if not self.twin:
            be = geom.backend
            cp = xp
            suffix = "single" if dtype == np.complex64 else "double"
            self.k_hop = cuda_source.function(be, "solvers", "staggered_hop.cu", f"hop_dist_{suffix}")
            self.k_pack = cuda_source.function(be, "solvers", "staggered_hop.cu", f"pack_{suffix}")
            self.cp = cp

    def _decode(self, j, parity):
        nx, ny, nz, nt = self.local
        half = nx // 2
        row, k = j // half, j % half
        y = row % ny
        row = row // ny
        z = row % nz
        t = row // nz
        x = 2 * k + ((parity + y + z + t) & 1)
        return (x, y, z, t)

    # --- the phases ---------------------------------------------------------------------------------------------
    def pack(self, psi):
        """All faces of ``psi`` into the send buffer (one kernel)."""
        if self.twin:
            for (mu, d), v in self.sends.items():
                n = self.local[mu]
                sl = [slice(None)] * 4
                sl[3 - mu] = slice(0, self.depth) if d == 0 else slice(n - self.depth, n)
                v[...] = psi[tuple(sl)]
            return
        if not self.total:
            return
        nx, ny, nz, nt = self.local
        self.k_pack(((self.total + BLOCK - 1) // BLOCK,), (BLOCK,),
                    (psi, self.sendbuf, self.table, np.int32(len(self.keys)), np.int64(self.total), np.int32(nx),
                     np.int32(ny), np.int32(nz), np.int32(nt), np.int32(self.depth)))

    def start(self):
        """Post the exchange of the packed faces; returns the exchange (None when nothing is partitioned)."""
        if not self.keys:
            return None
        if self.gpu_engine:
            return self.engine.start(self.sends)
        if self.twin:
            return self.engine.start(self.sends)
        self.sendbuf.get(out=self._host_send)            # the mpi transport: one staging copy for all faces
        views = {}
        base = self.sendbuf.data.ptr
        for k, v in self.sends.items():
            o = (v.data.ptr - base) // self.dtype.itemsize
            views[k] = self._host_send[o:o + v.size].reshape(v.shape)
        return self.engine.start(views)

    def finish(self, ex):
        """Wait for the halo (device-side for the GPU transports) and land it in the ghost buffer."""
        if ex is None:
            return
        if self.gpu_engine or self.twin:
            ex.finish(self.recvs)
            return
        views = {}
        base = self.ghost.data.ptr
        for k, v in self.recvs.items():
            o = (v.data.ptr - base) // self.dtype.itemsize
            views[k] = self._host_ghost[o:o + v.size].reshape(v.shape)
        ex.finish(views)
        self.ghost.set(self._host_ghost)

    def compute(self, psi, parity, out, a, x, b, which):
        """The hop on the interior (which=0) or exterior (1) sites of ``parity``."""
        sites = self.sites[parity][which]
        n = int(sites.size)
        if n == 0:
            return
        if self.twin:
            return self._twin_compute(psi, parity, out, a, x, b, sites)
        nx, ny, nz, nt = self.local
        links = self._links(parity)
        xarg = x if (x is not None and a != 0.0) else 0
        self.k_hop(((n + BLOCK - 1) // BLOCK,), (BLOCK,),
                   (psi, links, out, xarg, self.real(a), self.real(b), np.int32(parity), np.int32(links.shape[0]),
                    np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt), sites, np.int64(n), self.ghost,
                    self.goff, np.int32(self.pmask), np.int32(self.depth)))

    def __call__(self, psi, parity, out, a, x, b):
        xp = self.xp
        psi = xp.ascontiguousarray(psi)
        if x is not None and a != 0.0:
            x = xp.ascontiguousarray(x)
        prof = self.profile
        if prof is None:
            self.pack(psi)
            ex = self.start()
            self.compute(psi, parity, out, a, x, b, 0)
            self.finish(ex)
            self.compute(psi, parity, out, a, x, b, 1)
            return
        cp = self.cp
        evs, hs = [cp.cuda.Event() for _ in range(6)], []

        def mark(k):
            evs[k].record()
            hs.append(time.perf_counter())

        mark(0)
        self.pack(psi)
        mark(1)
        ex = self.start()
        mark(2)
        self.compute(psi, parity, out, a, x, b, 0)
        mark(3)
        self.finish(ex)
        mark(4)
        self.compute(psi, parity, out, a, x, b, 1)
        mark(5)
        prof.pending.append((evs, hs))

    # --- the NumPy twin of the kernel's index arithmetic (CPU tests) --------------------------------------------
    def _twin_compute(self, psi, parity, out, a, x, b, sites):
        from .staggered import hop_table

        sites = np.asarray(sites)
        c = [np.asarray(v) for v in self._decode(sites, parity)]
        n = self.local
        links = self.dslash._links[parity]            # (nhop, V/2, 3, 3)
        flat = psi.reshape(-1, 3)
        acc = np.zeros((sites.size, 3), dtype=self.dtype)
        for h, (mu, step) in enumerate(hop_table(self.naik)):
            m = c[mu] + step
            v = np.empty((sites.size, 3), dtype=self.dtype)
            out_of = ((m < 0) | (m >= n[mu])) if mu in self.pdims else np.zeros(sites.size, bool)
            cc = list(c)
            cc[mu] = m % n[mu]
            s = cc[0] + n[0] * (cc[1] + n[1] * (cc[2] + n[2] * cc[3]))
            v[~out_of] = flat[s[~out_of]]
            if out_of.any():
                side = (m >= 0).astype(np.int64)
                r = np.where(side == 1, m - n[mu], m + self.depth)
                d = list(n)
                d[mu] = self.depth
                cg = list(c)
                cg[mu] = r
                s = cg[0] + d[0] * (cg[1] + d[1] * (cg[2] + d[2] * cg[3]))
                g = s + self.goff_host[2 * mu + side] // 3
                v[out_of] = self.ghost.reshape(-1, 3)[g[out_of]]
            acc += np.einsum("sij,sj->si", links[h, sites], v)
        res = b * acc
        o = c[0] + n[0] * (c[1] + n[1] * (c[2] + n[2] * c[3]))
        if x is not None and a != 0.0:
            res += a * x.reshape(-1, 3)[o]
        out.reshape(-1, 3)[o] = res


def make_hop(dslash):
    """The registered factory's choice on a partitioned CuPy geometry: a DistHop, or None where the layout does
    not allow it (odd local extents, a local extent below the face depth), then the caller falls back."""
    geom = dslash.geom
    depth = 3 if dslash.naik else 1
    if any(n % 2 for n in geom.local_dims):
        return None
    if any(geom.grid.partitioned[mu] and geom.local_dims[mu] < depth for mu in range(4)):
        return None
    return DistHop(dslash)


# ------------------------------------------------------------------------------------------------------------------
# timing

def device_time(fn, reps: int, stream=None, comm=None, blocks: int = 3) -> float:
    """Seconds per call of ``fn()`` from device events around ``reps`` calls on ``stream`` (median of ``blocks``
    blocks, after one warm-up call; the maximum over the ranks of ``comm``)."""
    import cupy as cp

    stream = stream or cp.cuda.get_current_stream()
    with stream:
        fn()
        stream.synchronize()
        if comm is not None:
            comm.Barrier()
        out = []
        for _ in range(blocks):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            for _ in range(reps):
                fn()
            e1.record(stream)
            e1.synchronize()
            out.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3 / reps)
            if comm is not None:
                comm.Barrier()
    t = float(np.median(out))
    if comm is not None:
        t = comm.allreduce(t, op=_mpi_max())
    return t


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX


def set_graph_mode(geom, on: bool):
    """Binary flags (on) or counters (off) on the geometry's GPU halo engine; collective."""
    if not any(geom.grid.partitioned):
        return
    eng = geom.grid.halo
    if not _is_gpu_engine(eng):
        if on:
            raise ValueError(f"graph capture needs the stream_gated transport on every link; this grid's halo "
                             f"engine is the host one ({eng.request or 'default'}): use --transport stream_gated")
        return
    if eng.graph_mode != bool(on):
        eng.set_graph_mode(bool(on))


def close_graph_mode(geom):
    set_graph_mode(geom, False)


class Graph:
    """``fn()`` captured on ``stream`` through the driver (relaxed mode) and instantiated; ``launch(stream)``
    replays it. Keeps the CUgraph, so the memory-operation nodes can be listed (:meth:`memop_nodes`) and their
    parameters set per replay (COMMS.md option 2, measured by :func:`memop_update_cost`)."""

    def __init__(self, stream, fn):
        from cuda.bindings import driver as drv

        from comms.cuda.cu import call

        self._drv, self._call = drv, call
        call(drv.cuStreamBeginCapture, stream.ptr, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        try:
            with stream:
                fn()
        finally:
            graph = call(drv.cuStreamEndCapture, stream.ptr)
        self.graph = graph
        self.exec = call(drv.cuGraphInstantiate, graph, 0)

    def launch(self, stream):
        self._call(self._drv.cuGraphLaunch, self.exec, stream.ptr)

    def memop_nodes(self) -> list:
        """(node, params) of every batch-memory-operation node (the captured cuStreamWaitValue64 and
        cuStreamWriteValue64)."""
        drv, call = self._drv, self._call
        res = drv.cuGraphGetNodes(self.graph, 0)
        n = int(res[-1])
        nodes = call(drv.cuGraphGetNodes, self.graph, n)
        nodes = nodes[0] if isinstance(nodes, tuple) else nodes
        out = []
        for node in nodes or []:
            if call(drv.cuGraphNodeGetType, node) == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
                out.append((node, call(drv.cuGraphBatchMemOpNodeGetParams, node)))
        return out

    def __del__(self):
        try:
            self._drv.cuGraphExecDestroy(self.exec)
            self._drv.cuGraphDestroy(self.graph)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _capture(stream, fn):
    return Graph(stream, fn)


def memop_update_cost(graph: Graph, stream, reps: int = 200, comm=None) -> dict:
    """COMMS.md option 2 against option 1: replays of ``graph`` as they are (binary flags: nothing to update) and
    with every memory-operation node's parameters set before each replay (cuGraphExecBatchMemOpNodeSetParams,
    what monotonic counters need; the same values are set again, so the answer stays right: the cost is what is
    measured). Host and wall microseconds per replay, device microseconds per replay, the node count."""
    import cupy as cp

    drv, call = graph._drv, graph._call
    nodes = graph.memop_nodes()
    out = {"memop_nodes": len(nodes)}
    for name, update in (("flags", False), ("set_params", True)):
        stream.synchronize()
        if comm is not None:
            comm.Barrier()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        e0.record(stream)
        for _ in range(reps):
            if update:
                for node, params in nodes:
                    call(drv.cuGraphExecBatchMemOpNodeSetParams, graph.exec, node, params)
            graph.launch(stream)
        t_host = time.perf_counter() - t0
        e1.record(stream)
        e1.synchronize()
        t_wall = time.perf_counter() - t0
        out[name] = {"host_us": 1e6 * t_host / reps, "wall_us": 1e6 * t_wall / reps,
                     "device_us": 1e3 * cp.cuda.get_elapsed_time(e0, e1) / reps}
    return out


class DslashRunner:
    """The full D (both output parities: two hops, two exchanges) applied to ``psi`` into ``self.out`` on its own
    stream; ``graph=True`` captures it once (stream_gated, binary flags) and replays it."""

    def __init__(self, dslash, psi, graph: bool = False):
        import cupy as cp

        self.d, self.geom = dslash, dslash.geom
        self.hop = dslash._hop_impl
        self.psi = cp.ascontiguousarray(psi.astype(dslash.dtype))
        self.out = cp.zeros_like(self.psi)
        self.stream = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device().synchronize()        # buffers written on the legacy stream are ready for self.stream
        self.graph = None
        set_graph_mode(self.geom, graph)
        if graph:
            self._apply()                     # warm-up uncaptured (views, kernels), then capture
            self.stream.synchronize()
            self.graph = _capture(self.stream, self._apply)

    def _apply(self):
        with self.stream:
            s = self.d._sign
            self.hop(self.psi, 0, self.out, 0.0, None, s)
            self.hop(self.psi, 1, self.out, 0.0, None, s)

    def run(self):
        if self.graph is not None:
            self.graph.launch(self.stream)
        else:
            self._apply()
        return self.out

    def time(self, reps: int = 100) -> float:
        """Seconds per full D (device events, max over ranks)."""
        return device_time(self.run, reps, self.stream, self.geom.grid.active_comm)


def graph_split(dslash, psi, reps: int = 100) -> dict:
    """Where a captured stream-gated hop's time goes: device microseconds per hop of graphs holding only the kernels
    (pack, interior, exterior: no exchange), only the exchange (start/finish of the packed faces), and the whole
    hop. Collective; the geometry's engine must be stream_gated (graph mode is switched on)."""
    import cupy as cp

    hop, geom = dslash._hop_impl, dslash.geom
    comm = geom.grid.active_comm
    set_graph_mode(geom, True)
    psi = cp.ascontiguousarray(psi.astype(dslash.dtype))
    out = cp.zeros_like(psi)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()

    def kernels():
        for p in (0, 1):
            hop.pack(psi)
            hop.compute(psi, p, out, 0.0, None, 1.0, 0)
            hop.compute(psi, p, out, 0.0, None, 1.0, 1)

    def exchange():
        for _ in (0, 1):
            hop.finish(hop.start())

    def whole():
        for p in (0, 1):
            hop(psi, p, out, 0.0, None, 1.0)

    res = {}
    for name, fn in (("kernels_only", kernels), ("exchange_only", exchange), ("whole", whole)):
        with stream:
            fn()                                   # uncaptured warm-up
        stream.synchronize()
        graph = Graph(stream, fn)
        res[name + "_us"] = 1e6 * device_time(partial(graph.launch, stream), reps, stream, comm) / 2
    return res


class DeviceCG:
    """Hestenes-Stiefel CG on A = 4m^2 - D_pq D_qp (parity p) with device-resident scalars and reductions through
    the halo engine (module docstring). Double precision."""

    def __init__(self, dslash, mass: float, b, parity: int = 0, graph: bool = False, iters_per_graph: int = 1):
        import cupy as cp

        if np.dtype(dslash.dtype) != np.complex128:
            raise ValueError("DeviceCG runs in double precision: give it a complex128 StaggeredDslash")
        self.cp, self.d, self.geom = cp, dslash, dslash.geom
        self.hop = dslash._hop_impl
        self.mass, self.parity = float(mass), int(parity)
        self.grid = self.geom.grid
        self.engine = self.grid.halo if any(self.grid.partitioned) else None
        self.gpu_engine = _is_gpu_engine(self.engine)
        self.stream = cp.cuda.Stream(non_blocking=True)
        be = self.geom.backend
        self.k = {n: cuda_source.function(be, "solvers", "dist_cg.cu", n)
                  for n in ("redot", "update_xr", "xpay", "combine")}
        shape = tuple(self.geom.shape) + (3,)
        z = lambda: cp.zeros(shape, dtype=np.complex128)  # noqa: E731
        self.b = cp.ascontiguousarray(b.astype(np.complex128))
        self.x, self.r, self.p, self.t, self.ap = z(), z(), z(), z(), z()
        self.n = int(np.prod(shape)) // 3 * 3
        self.nblocks = max(1, min(MAX_RBLOCKS, (self.n + RBLOCK - 1) // RBLOCK))
        self.part = cp.zeros(MAX_RBLOCKS, dtype=np.float64)
        self.counter = cp.zeros(1, dtype=np.uint32)
        self.sc = cp.zeros(8, dtype=np.float64)
        self.loc = cp.zeros(1, dtype=np.float64)
        gd = self.grid.dims
        self.rdims = [mu for mu in range(4) if gd[mu] > 1]
        self.vals = {mu: cp.zeros(gd[mu], dtype=np.float64) for mu in self.rdims}
        self.coords = self.grid.coords
        if self.gpu_engine:
            self.engine.reserve(256)
        cp.cuda.Device().synchronize()        # buffers written on the legacy stream are ready for self.stream
        self.graph = None
        self.iters_per_graph = int(iters_per_graph)
        self.start()
        set_graph_mode(self.geom, graph)
        if graph:
            self._iteration()                 # warm-up uncaptured, then capture
            self.stream.synchronize()
            self.start()
            self.graph = _capture(self.stream, lambda: [self._iteration() for _ in range(self.iters_per_graph)])

    # --- pieces -------------------------------------------------------------------------------------------------
    def _first(self):
        """Where the local partial sum goes: the own slot of the first reduced dimension, else ``loc``."""
        if self.rdims:
            mu = self.rdims[0]
            return self.vals[mu][self.coords[mu]:self.coords[mu] + 1]
        return self.loc

    def _allreduce(self, mode):
        """The local partial (in ``_first()``) summed over all ranks into the scalars (mode 1: pAp -> alpha,
        mode 2: rr_new -> beta); partials added along x, y, z, t in grid-coordinate order."""
        k = self.k["combine"]
        if not self.rdims:
            k((1,), (32,), (self.loc, np.int32(1), self.loc, self.sc, np.int32(mode)))
            return
        if not self.gpu_engine:
            return self._allreduce_host(mode)
        for i, mu in enumerate(self.rdims):
            P, c, v = self.grid.dims[mu], self.coords[mu], self.vals[mu]
            for s in range(1, P):
                a, b = (c - s + 1) % P, (c - s) % P
                self.engine.start({(mu, 1): v[a:a + 1]}).finish({(mu, 0): v[b:b + 1]})
            last = i == len(self.rdims) - 1
            dst = self.loc if last else self.vals[self.rdims[i + 1]][self.coords[self.rdims[i + 1]]:][:1]
            k((1,), (32,), (v, np.int32(P), dst, self.sc, np.int32(mode if last else 0)))

    def _allreduce_host(self, mode):
        """The mpi transport: gather the partials on the host and add them in the device path's order."""
        mu0 = self.rdims[0]
        mine = float(self.vals[mu0][self.coords[mu0]].get())
        allv = self.grid.active_comm.allgather((tuple(self.coords), mine))
        gd = self.grid.dims
        arr = np.zeros(tuple(gd), dtype=np.float64)
        for c, v in allv:
            arr[c] = v
        for mu in range(4):                       # sum axis mu in coordinate order, x first
            if gd[mu] > 1:
                s = np.take(arr, 0, axis=mu).copy()
                for q in range(1, gd[mu]):
                    s += np.take(arr, q, axis=mu)
                arr = np.expand_dims(s, mu)
        self.loc.set(np.asarray([arr.ravel()[0]]))
        self.k["combine"]((1,), (32,), (self.loc, np.int32(1), self.loc, self.sc, np.int32(mode)))

    def _redot(self, u, v):
        self.k["redot"]((self.nblocks,), (RBLOCK,), (u, v, np.int64(self.n), self.part, self.counter, self._first()))

    def _apply_A(self, src, dst):
        """dst = (4m^2 - D_pq D_qp) src on parity p (two hops, two exchanges)."""
        p, s = self.parity, self.d._sign
        self.hop(src, 1 - p, self.t, 0.0, None, s)
        self.hop(self.t, p, dst, 4 * self.mass ** 2, src, -s)

    def start(self, x0=None):
        """r = b - A x0 (x0 = 0: r = b), p = r, rr = |r|^2 on the device (uncaptured, counters or flags)."""
        cp = self.cp
        with self.stream:
            if x0 is None:
                self.x[...] = 0
                self.r[...] = self.b
            else:
                self.x[...] = x0
                self._apply_A(self.x, self.ap)
                cp.subtract(self.b, self.ap, out=self.r)
            self.p[...] = self.r
            self._redot(self.r, self.r)
            self._allreduce(2)                     # sc[0] = rr
        self.iters = 0

    def _iteration(self):
        with self.stream:
            self._apply_A(self.p, self.ap)
            self._redot(self.p, self.ap)
            self._allreduce(1)                      # alpha = rr / pAp
            self.k["update_xr"]((self.nblocks,), (RBLOCK,), (self.x, self.r, self.p, self.ap, self.sc,
                                                             np.int64(self.n), self.part, self.counter, self._first()))
            self._allreduce(2)                      # beta = rr_new / rr, rr = rr_new
            self.k["xpay"]((self.nblocks,), (RBLOCK,), (self.p, self.r, self.sc, np.int64(self.n)))

    def iterate(self, n: int = 1):
        """n iterations (with a graph: n / iters_per_graph replays)."""
        if self.graph is not None:
            for _ in range(max(1, n // self.iters_per_graph)):
                self.graph.launch(self.stream)
        else:
            for _ in range(n):
                self._iteration()
        self.iters += n

    def solution(self):
        """x after the iterations so far (synchronises the CG's stream)."""
        self.stream.synchronize()
        return self.x

    def residual2(self) -> float:
        """|r|^2 of the iterated residual (host synchronisation)."""
        self.stream.synchronize()
        return float(self.sc[0].get())

    def solve(self, tol: float = 1e-10, maxiter: int = 5000, check_every: int = 10):
        """Iterate until |r|^2 <= tol^2 |b|^2 (checked every ``check_every`` iterations); returns (x, iters)."""
        with self.stream:
            self._redot(self.b, self.b)
            self._allreduce(2)
        bb = self.residual2()
        self.start()
        while self.iters < maxiter:
            self.iterate(check_every)
            if self.residual2() <= tol * tol * bb:
                break
        return self.x, self.iters

    def time_iteration(self, reps: int = 50) -> float:
        """Seconds per CG iteration (device events, max over ranks)."""
        step = self.iters_per_graph if self.graph is not None else 1
        t = device_time(lambda: self.iterate(step), max(1, reps // step), self.stream, self.grid.active_comm)
        return t / step
