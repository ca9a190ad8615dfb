"""Timing and graph runners of the distributed GPU hop (:class:`solvers.staggered_dist_cuda.DistHop`): the full D
on its own stream (``DslashRunner``), a device-resident CG iteration (``DeviceCG``), CUDA-graph capture (``Graph``),
device-event timing (``device_time``), the graph-mode switch of the halo engine and the split of a captured hop
(``graph_split``). Used by ``hmc bench dslash --grid ...`` and the scaling worker; the API is described in the
docstring of :mod:`solvers.staggered_dist_cuda`. GPU only (CuPy, cuda.bindings)."""
from __future__ import annotations

import time
from functools import partial

import numpy as np

from lattice import cuda_source
from lattice.geometry import device_engine
from solvers.staggered_dist_cuda import MAX_RBLOCKS, RBLOCK


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
    if not device_engine(eng):
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
    parameters set per replay (docs/halo-protocol.md option 2, measured by :func:`memop_update_cost`)."""

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
    """docs/halo-protocol.md option 2 against option 1: replays of ``graph`` as they are (binary flags: nothing to update) and
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
        self.gpu_engine = device_engine(self.engine)
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
