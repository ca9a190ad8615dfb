"""The host shim's block mode (tests/force/cuda_host.py, ``FakeCuPy(blocks=True)``): a block's threads run at once,
``__syncthreads`` is a barrier that exited threads leave, ``__shared__`` memory is the block's, so kernels whose
threads cooperate through shared memory can be tested on the CPU; the default mode (one thread a block) cannot run
them."""
from __future__ import annotations

import numpy as np

from tests.force.cuda_host import FakeCuPy, needs_gxx

SOURCE = r"""
// a block's sum by a tree in shared memory (blockDim.x a power of two, at most 128)
extern "C" __global__ void block_sums(const double *x, double *out, long n) {
    __shared__ double part[128];
    const long i = blockIdx.x * blockDim.x + threadIdx.x;
    part[threadIdx.x] = i < n ? x[i] : 0.0;
    __syncthreads();
    for (long s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}
// the first 64 threads of each block reverse their 64 numbers through shared memory; the others leave at once
extern "C" __global__ void reverse64(const double *x, double *out) {
    __shared__ double buf[64];
    if (threadIdx.x >= 64) return;
    const long base = blockIdx.x * 64;
    buf[threadIdx.x] = x[base + threadIdx.x];
    __syncthreads();
    out[base + threadIdx.x] = buf[63 - threadIdx.x];
}
"""


def _tree_sum(v):
    v = list(v)
    while len(v) > 1:
        h = len(v) // 2
        v = [v[k] + v[k + h] for k in range(h)]
    return v[0]


@needs_gxx
def test_block_threads_cooperate_through_shared_memory():
    mod = FakeCuPy(blocks=True).RawModule(code=SOURCE)
    x = np.random.default_rng(3).normal(size=300)
    sums = np.zeros(3)
    mod.get_function("block_sums")((3,), (128,), (x, sums, np.int64(x.size)))
    padded = np.concatenate([x, np.zeros(84)]).reshape(3, 128)
    assert np.array_equal(sums, [_tree_sum(b) for b in padded])       # the tree's order, to the bit
    y = np.random.default_rng(4).normal(size=4 * 64)
    out = np.zeros_like(y)
    mod.get_function("reverse64")((4,), (128,), (y, out))            # half of every block exits before the barrier
    assert np.array_equal(out, y.reshape(4, 64)[:, ::-1].ravel())


@needs_gxx
def test_one_thread_blocks_cannot_run_them():
    """The default mode's answer is wrong for such a kernel (each "block" is one thread, blockIdx.x its number):
    the reason block mode exists. The output has room for every such block's write."""
    mod = FakeCuPy().RawModule(code=SOURCE)
    x = np.random.default_rng(3).normal(size=300)
    out = np.zeros(3 * 128)
    mod.get_function("block_sums")((3,), (128,), (x, out, np.int64(x.size)))
    assert np.array_equal(out[:300], x)
    assert not np.allclose(out[:3], [x[:128].sum(), x[128:256].sum(), x[256:].sum()])
