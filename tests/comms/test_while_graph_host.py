"""comms.cuda.graph ``WhileGraph`` against a stand-in ``cuda.bindings.driver`` (in a subprocess, as in
test_alloc_policy.py): the calls the device-side solver loop makes, in order and with the arities of cuda-python's own
conditional-node test (cuda_bindings/tests/test_cuda.py ``test_conditional``): a graph, a conditional handle with
default 1 reassigned at each launch, one WHILE node (the 12.x four-argument ``cuGraphAddNode`` after the 13.x
five-argument one is refused), the body captured into the node's body graph on the given stream with the handle
passed to the body, the graph instantiated; launch and close. The real driver's behaviour is for the device
(tests/solvers/test_gpu_krylov_graph.py)."""
from __future__ import annotations

from tests.comms.test_capture_nodes_host import run_scenario

GRAPH_CALLS = r'''
CUgraphNodeType = _Enum(0, CU_GRAPH_NODE_TYPE_CONDITIONAL=13)
CUgraphConditionalNodeType = _Enum(0, CU_GRAPH_COND_TYPE_IF=0, CU_GRAPH_COND_TYPE_WHILE=1)
CUstreamCaptureMode = _Enum(0, CU_STREAM_CAPTURE_MODE_RELAXED=2)
CU_GRAPH_COND_ASSIGN_DEFAULT = 1

class _Cond:
    def __init__(self):
        self.phGraph_out = [0]

class CUgraphNodeParams:
    def __init__(self):
        self.conditional = _Cond()

def cuGraphCreate(flags):
    CALLS.append(("cuGraphCreate", flags))
    return _ok(next(_next))

def cuCtxGetCurrent():
    return _ok(77)

def cuGraphConditionalHandleCreate(graph, ctx, default, flags):
    CALLS.append(("cuGraphConditionalHandleCreate", graph, ctx, default, flags))
    return _ok(4242)

def cuGraphAddNode(graph, deps, n, params):          # the 12.x form: (graph, dependencies, count, params)
    c = params.conditional
    CALLS.append(("cuGraphAddNode", graph, deps, n, int(params.type), int(c.type), c.size, c.handle, c.ctx))
    c.phGraph_out = [5555]
    return _ok(next(_next))

def cuStreamBeginCaptureToGraph(stream, graph, deps, edges, n, mode):
    CALLS.append(("cuStreamBeginCaptureToGraph", stream, graph, deps, edges, n, int(mode)))
    return _ok()

def cuStreamEndCapture(stream):
    CALLS.append(("cuStreamEndCapture", stream))
    return _ok(5555)

def cuGraphInstantiate(graph, flags):
    CALLS.append(("cuGraphInstantiate", graph, flags))
    return _ok(9999)

def cuGraphLaunch(exe, stream):
    CALLS.append(("cuGraphLaunch", exe, stream))
    return _ok()

def cuGraphExecDestroy(exe):
    CALLS.append(("cuGraphExecDestroy", exe))
    return _ok()

def cuGraphDestroy(graph):
    CALLS.append(("cuGraphDestroy", graph))
    return _ok()
'''

SCENARIO = r'''
import json
from cuda.bindings import driver as drv
from comms.cuda.graph import WhileGraph

class Stream:
    ptr = 31
    def __enter__(self):
        drv.CALLS.append(("enter", self.ptr))
    def __exit__(self, *exc):
        drv.CALLS.append(("exit", self.ptr))

seen = []
g = WhileGraph(Stream(), lambda handle: seen.append(handle))
g.launch(Stream())
g.close()
print(json.dumps({"calls": drv.CALLS, "handles": seen}))
'''


def test_while_graph_calls_against_a_stand_in_driver(tmp_path):
    out = run_scenario(tmp_path, SCENARIO, calls=GRAPH_CALLS)
    calls = [tuple(c) for c in out["calls"]]
    graph = calls[0]
    assert graph == ("cuGraphCreate", 0)
    names = [c[0] for c in calls]
    assert names == ["cuGraphCreate", "cuGraphConditionalHandleCreate", "cuGraphAddNode",
                     "cuStreamBeginCaptureToGraph", "enter", "exit", "cuStreamEndCapture", "cuGraphInstantiate",
                     "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy"]
    g = calls[1][1]
    assert calls[1] == ("cuGraphConditionalHandleCreate", g, 77, 1, 1)      # default 1, re-assigned each launch
    assert calls[2] == ("cuGraphAddNode", g, None, 0, 13, 1, 1, 4242, 77)   # one WHILE node, body size 1
    assert calls[3] == ("cuStreamBeginCaptureToGraph", 31, 5555, None, None, 0, 2)   # into the node's body graph
    assert calls[6] == ("cuStreamEndCapture", 31) and calls[7] == ("cuGraphInstantiate", g, 0)
    assert calls[8] == ("cuGraphLaunch", 9999, 31)
    assert out["handles"] == [4242]                                         # the body gets the handle
