"""Timing and graph runners of the distributed GPU hop (:class:`solvers.staggered_dist_cuda.DistHop`): the full D
on its own stream (``DslashRunner``), the production CG's time per iteration (``cg_iteration_seconds``), CUDA-graph
capture (``_capture``: comms.cuda.graph),
device-event timing (``device_time``), the graph-mode switch of the halo engine and the split of a captured hop
(``graph_split``). Used by ``hmc bench dslash --grid ...`` and the scaling worker; the API is described in the
docstring of :mod:`solvers.staggered_dist_cuda`. GPU only (CuPy, cuda.bindings)."""
from __future__ import annotations

import time
from functools import partial

import numpy as np

from lattice.geometry import device_engine


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


def _capture(stream, fn):
    """``fn()`` captured on ``stream`` (:class:`comms.cuda.graph.CapturedGraph`, the solvers' capture too)."""
    from comms.cuda.graph import CapturedGraph

    return CapturedGraph(stream, fn)


def memop_nodes(graph) -> list:
    """(node, params) of every batch-memory-operation node (the captured cuStreamWaitValue64 and
    cuStreamWriteValue64) of a :class:`comms.cuda.graph.CapturedGraph`."""
    from cuda.bindings import driver as drv

    from comms.cuda.cu import call

    n = graph.node_count()
    nodes = call(drv.cuGraphGetNodes, graph.graph, n)
    nodes = nodes[0] if isinstance(nodes, tuple) else nodes
    out = []
    for node in nodes or []:
        if call(drv.cuGraphNodeGetType, node) == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
            out.append((node, call(drv.cuGraphBatchMemOpNodeGetParams, node)))
    return out


def memop_update_cost(graph, stream, reps: int = 200, comm=None) -> dict:
    """docs/halo-protocol.md option 2 against option 1: replays of ``graph`` as they are (binary flags: nothing to update) and
    with every memory-operation node's parameters set before each replay (cuGraphExecBatchMemOpNodeSetParams,
    what monotonic counters need; the same values are set again, so the answer stays right: the cost is what is
    measured). Host and wall microseconds per replay, device microseconds per replay, the node count."""
    import cupy as cp

    from cuda.bindings import driver as drv

    from comms.cuda.cu import call

    nodes = memop_nodes(graph)
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
        graph = _capture(stream, fn)
        res[name + "_us"] = 1e6 * device_time(partial(graph.launch, stream), reps, stream, comm) / 2
    return res


def cg_iteration_seconds(dslash, mass: float, b, iters: int = 100, reps: int = 3):
    """Seconds per iteration of the production CG (:func:`solvers.cg` on A = 4m^2 - D_eo D_oe, an unreachable
    tolerance so that every solve makes exactly ``iters`` iterations; device-resident in CUDA graphs where every link
    can be captured, :mod:`solvers.krylov_graph`), whole solves timed on the host after a warm-up (best of ``reps``,
    the slowest rank's), with the last solve's statistics."""
    import cupy as cp

    from solvers import cg

    comm = dslash.geom.grid.active_comm
    inv = cg(tol=1e-30, maxiter=int(iters), raise_on_fail=False)(dslash.even_odd(mass).normal)
    inv.solve(b)
    best = float("inf")
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        comm.Barrier()
        t0 = time.perf_counter()
        _, st = inv.solve(b)
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t0)
    return comm.allreduce(best, op=_mpi_max()) / max(1, st.iters), st
