"""The device-side solver loop (``solver_graph_while``, HMC_SOLVER_GRAPH_WHILE; solvers.krylov_graph
``GraphLoop._while_graph``, comms.cuda.graph ``WhileGraph``): the condition kernel (solvers/kernels/graph_loop.cu,
host build with a stand-in for the device builtin) continues exactly while the state is running; a loop whose
while graph cannot be built says why once and keeps host checks; a distributed loop never asks for one. The graph
itself runs on the device only (tests/solvers/test_gpu_krylov_graph.py)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from comms.config import RunConfig
from lattice import cuda_source
from lattice.backend import Backend
from solvers.krylov_graph import NSTATE, SLOT, GraphLoop
from tests.force.cuda_host import FakeCuPy, needs_gxx

# the device builtin, recorded: what the kernel asked the loop to do
STAND_IN = ('static unsigned long long seen_handle; static unsigned seen_value = 7;\n'
            'extern "C" void cudaGraphSetConditional(unsigned long long h, unsigned v) { seen_handle = h; '
            'seen_value = v; }\n'
            'extern "C" __global__ void seen(long long *out) { out[0] = (long long)seen_handle; '
            'out[1] = seen_value; }')


@needs_gxx
@pytest.mark.parametrize("status,goes_on", [(0.0, 1), (1.0, 0), (2.0, 0), (3.0, 0)])
def test_condition_kernel_continues_while_the_solve_runs(status, goes_on):
    be = Backend("cupy", FakeCuPy())
    params = {"DECLARE": STAND_IN, "V": "host"}
    k = cuda_source.function(be, "solvers", "graph_loop.cu", "loop_while_running_host", params)
    st = np.zeros(NSTATE)
    st[SLOT["status"]] = status
    k((1,), (1,), (st, np.uint64(12345)))
    out = np.zeros(2, dtype=np.int64)
    cuda_source.function(be, "solvers", "graph_loop.cu", "seen", params)((1,), (1,), (out,))
    assert list(out) == [12345, goes_on]


def _loop(while_body):
    geom = types.SimpleNamespace(backend=Backend("numpy", np), config=RunConfig())
    return types.SimpleNamespace(geom=geom, st=np.zeros(NSTATE), stream=None, while_body=while_body,
                                 while_failed=None)


def test_a_loop_that_cannot_build_its_while_graph_keeps_host_checks():
    """Here (no CUDA) the graph cannot be built: None, one warning naming the setting, and ``while_body`` 0, so
    that the loop's later captures (``GraphLoop.capture`` asks only while it is nonzero) take host checks."""
    loop = _loop(2)
    with pytest.warns(RuntimeWarning, match="HMC_SOLVER_GRAPH_WHILE"):
        assert GraphLoop._while_graph(loop, lambda: None) is None
    assert loop.while_body == 0 and loop.while_failed


def test_the_setting_is_read_and_checked():
    assert RunConfig.resolve(env={"HMC_SOLVER_GRAPH_WHILE": "2"}).solver_graph_while == 2
    assert RunConfig().solver_graph_while == 0
    with pytest.raises(Exception, match="HMC_SOLVER_GRAPH_WHILE"):
        RunConfig.resolve(env={"HMC_SOLVER_GRAPH_WHILE": "-1"})
