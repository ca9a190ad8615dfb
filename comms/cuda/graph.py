"""CUDA graphs captured from a stream through the driver: what the device-resident solvers
(:mod:`solvers.krylov_graph`) and the benchmarks replay.

Capture runs in relaxed mode (``CU_STREAM_CAPTURE_MODE_RELAXED``): the halo engine's stream memory operations and
cross-stream events are captured as graph nodes, and host-side calls that are not stream work (CuPy's pool handing
out an already allocated block, a kernel lookup) stay legal during capture. Everything a captured function touches
must outlive the graph: the graph keeps raw device pointers. In credit-free graph mode (comms/cuda/creditfree.py) a
capture must span an even number of halo exchanges and a launch must find the engine's buffer index as captured.
"""
from __future__ import annotations

from cuda.bindings import driver as drv

from . import creditfree
from .cu import call


class CapturedGraph:
    """``fn()`` captured on the CuPy ``stream`` and instantiated; :meth:`launch` replays it on a stream. ``graph``
    is the CUgraph (its nodes can be listed), ``exec`` the executable graph."""

    #: whether one launch runs the whole loop on the device (:class:`WhileGraph`), not a fixed number of steps
    loops_on_device = False

    def __init__(self, stream, fn):
        self.exec = None
        marks = creditfree.capture_marks()
        call(drv.cuStreamBeginCapture, stream.ptr, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        captured = False
        try:
            with stream:
                fn()
            captured = True
        finally:
            graph = call(drv.cuStreamEndCapture, stream.ptr)
            self.graph = graph
            self.credit_marks = creditfree.check_capture(marks, strict=captured)   # odd: CommsError
        self.exec = call(drv.cuGraphInstantiate, graph, 0)

    def launch(self, stream) -> None:
        if self.credit_marks:
            creditfree.before_launch(self.credit_marks, stream)
        call(drv.cuGraphLaunch, self.exec, stream.ptr)

    def node_count(self) -> int:
        return int(drv.cuGraphGetNodes(self.graph, 0)[-1])

    def node_census(self) -> dict:
        """{node type: count} of the captured graph, the type named as the driver names it without its prefix
        (KERNEL, MEMCPY, MEMSET, BATCH_MEM_OP, EVENT_RECORD, WAIT_EVENT, EMPTY, ...); divided by the iterations
        a graph holds it gives the nodes of one iteration (docs/halo-protocol.md "Counting what a graph holds")."""
        count = self.node_count()
        if count == 0:
            return {}
        nodes, _ = call(drv.cuGraphGetNodes, self.graph, count)
        census: dict = {}
        for node in nodes:
            kind = call(drv.cuGraphNodeGetType, node)
            name = getattr(kind, "name", str(kind)).replace("CU_GRAPH_NODE_TYPE_", "")
            census[name] = census.get(name, 0) + 1
        return census

    def close(self) -> None:
        """Destroy the graph now (also done when the object is collected)."""
        if getattr(self, "exec", None) is not None:
            drv.cuGraphExecDestroy(self.exec)
        if getattr(self, "graph", None) is not None:
            drv.cuGraphDestroy(self.graph)
        self.exec = self.graph = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class WhileGraph(CapturedGraph):
    """A graph of one while node: ``fn(handle)`` captured on the CuPy ``stream`` as the loop's body, which runs while
    the loop's condition is nonzero (1 at each launch, ``CU_GRAPH_COND_ASSIGN_DEFAULT``): the body must end in a
    kernel that sets it through ``handle`` (device-side ``cudaGraphSetConditional``; solvers/kernels/graph_loop.cu).
    So a whole solve is one launch, with no host check between its iterations (conditional nodes, CUDA 12.4+). A
    body holds only kernels, memsets and copies: no stream memory operations, so no halo exchange of the GPU
    transports (their doorbells are such operations) can be inside one (docs/architecture.md, "Device-resident
    solvers")."""

    loops_on_device = True

    def __init__(self, stream, fn):
        self.exec = None
        self.credit_marks = []
        self.graph = call(drv.cuGraphCreate, 0)
        ctx = call(drv.cuCtxGetCurrent)
        assign_default = int(getattr(drv, "CU_GRAPH_COND_ASSIGN_DEFAULT", 1))
        handle = call(drv.cuGraphConditionalHandleCreate, self.graph, ctx, 1, assign_default)
        params = drv.CUgraphNodeParams()
        params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = drv.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
        params.conditional.size = 1
        params.conditional.ctx = ctx
        _add_node(self.graph, params)
        body = params.conditional.phGraph_out[0]
        if not int(body):
            raise RuntimeError("cuGraphAddNode gave the while node no body graph")
        call(drv.cuStreamBeginCaptureToGraph, stream.ptr, body, None, None, 0,
             drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        try:
            with stream:
                fn(int(handle))
        finally:
            call(drv.cuStreamEndCapture, stream.ptr)       # the body graph belongs to the node
        self.exec = call(drv.cuGraphInstantiate, self.graph, 0)


def _add_node(graph, params):
    """cuGraphAddNode with no dependencies: the CUDA 13 bindings take (graph, deps, edge data, count, params), the
    12.x ones (graph, deps, count, params)."""
    try:
        return call(drv.cuGraphAddNode, graph, None, None, 0, params)
    except TypeError:
        return call(drv.cuGraphAddNode, graph, None, 0, params)
