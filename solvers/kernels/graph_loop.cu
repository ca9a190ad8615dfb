// The condition of a device-resident solve's while loop (solvers/krylov_graph.py, comms/cuda/graph.py WhileGraph):
// after the body's iterations, the loop goes on while the solve's state is running (status slot 0, as in
// fused_blas.cu). The DECLARE parameter: how cudaGraphSetConditional (a device-side builtin of CUDA 12.4+, like
// vprintf: no device runtime library to link) is made known to nvrtc; the driver tries its own declaration first,
// then the toolkit's header.
#include "hmc_common.cuh"
${DECLARE}
#define S_STATUS 13      // fused_blas.cu's state slot

extern "C" __global__ void loop_while_running_${V}(const double *st, unsigned long long handle) {
    cudaGraphSetConditional(handle, st[S_STATUS] == 0.0 ? 1u : 0u);
}
