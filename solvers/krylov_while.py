"""The kernel that ends the body of a device-side solve loop (``solver_graph_while``; solvers.krylov_graph
``GraphLoop._while_graph``, comms.cuda.graph ``WhileGraph``): one thread sets the while node's condition to "the
state's status slot is 0" through the device-side ``cudaGraphSetConditional`` (CUDA 12.4+). That function is a
builtin the driver's PTX compiler resolves (as it does ``vprintf``): no device runtime library is linked. How nvrtc
gets to know it is not documented for nvrtc, so :func:`while_kernel` tries, in turn, solvers/kernels/graph_loop.cu
with its own declaration, the same PTX written here and loaded through the driver's JIT, and graph_loop.cu with the
toolkit's header; the first that compiles and loads serves (checked on the device by
tests/solvers/test_gpu_krylov_graph.py ``test_device_side_loop_iterates_equal_host_driven``)."""
from __future__ import annotations

from lattice import cuda_source

#: the variants of graph_loop.cu: (tag, how cudaGraphSetConditional is declared to nvrtc)
WHILE_DECLARATIONS = (("own", 'extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle, '
                               'unsigned int value);'),
                      ("header", "#include <cuda_device_runtime_api.h>"))

#: loop_while_running_ptx(st, handle): cudaGraphSetConditional(handle, st[13] == 0.0) (S_STATUS of fused_blas.cu,
#: byte offset 104), in PTX for the driver's JIT
WHILE_PTX = """.version 6.0
.target sm_50
.address_size 64
.extern .func cudaGraphSetConditional(.param .b64 handle, .param .b32 value);
.visible .entry loop_while_running_ptx(.param .u64 st_param, .param .u64 handle_param)
{
    .reg .pred %p1;
    .reg .b32 %r1;
    .reg .b64 %rd<4>;
    .reg .f64 %fd1;
    .param .b64 call_handle;
    .param .b32 call_value;
    ld.param.u64 %rd1, [st_param];
    ld.param.u64 %rd2, [handle_param];
    cvta.to.global.u64 %rd3, %rd1;
    ld.global.f64 %fd1, [%rd3+104];
    setp.eq.f64 %p1, %fd1, 0d0000000000000000;
    selp.u32 %r1, 1, 0, %p1;
    st.param.b64 [call_handle], %rd2;
    st.param.b32 [call_value], %r1;
    call.uni cudaGraphSetConditional, (call_handle, call_value);
    ret;
}
"""


def while_kernel(backend):
    """The condition kernel, (st, handle) -> None: the first variant that compiles and loads (module docstring);
    the last refusal is raised."""
    error = None
    tries = [lambda tag=tag, declare=declare: cuda_source.function(
        backend, "solvers", "graph_loop.cu", f"loop_while_running_{tag}", {"DECLARE": declare, "V": tag})
        for tag, declare in WHILE_DECLARATIONS]
    tries.insert(1, lambda: cuda_source.ptx_function(backend, WHILE_PTX, "loop_while_running_ptx"))
    for attempt in tries:
        try:
            return attempt()
        except Exception as e:  # noqa: BLE001 - nvrtc's CompileException, a load error: try the next form
            error = e
    raise error
