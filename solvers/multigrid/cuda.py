"""Batched CUDA kernels of the multigrid (CuPy RawModule): the coarse 9-point stencil and the Kahler-Dirac X^-1.

The array path (:class:`CoarseOperator`, :class:`KDBlocks`) costs, per application, 8 shifts (rolls) and 9 batched
products for the stencil, and two transposing reshapes around one batched product for X^-1: a dozen launches
and temporaries, on coarse lattices of a few hundred sites where a launch costs more than the arithmetic
(MULTIGRID.md: the coarse levels are latency-bound). Here each is ONE kernel that reads the neighbours through an
index table:

* :func:`stencil`: out(x) = sum_{d=0..8} Y_d(x) v(nb_d(x)), nb_0 = x, nb_{1+2mu} = x + mu, nb_{2+2mu} = x - mu
  (periodic on the local lattice); Y is (9, sites, n, n), v (sites, n, k); one thread per output (site, row,
  column).
* :func:`block_apply`: out(h, s, c) = sum_{s', c'} X_h[(s, c), (s', c')] v(site(h, s'), c'), the 48x48 block of
  hypercube h applied in place of the (to_blocks, matmul, from_blocks) sequence.

Both are used when the fields are CuPy arrays and no dimension of the lattice is partitioned (one rank; with
halos the array path keeps the exchange through ``comms``). ``HMC_MG_KERNELS=0`` (or :func:`set_kernels`) turns
them off. The index tables are built with NumPy (:func:`neighbour_table`, :func:`hypercube_table`);
:func:`stencil_reference` and :func:`block_apply_reference` are the same contractions with NumPy fancy indexing,
which the CPU tests compare with the array path (the tables are right) and the GPU test with the kernels.
"""
from __future__ import annotations

import os

import numpy as np

from .lattice import to_blocks

_STATE = {"on": os.environ.get("HMC_MG_KERNELS", "1") != "0"}
_MODULE = {}

_SOURCE = r"""
#include <cupy/complex.cuh>
typedef complex<double> cd;

extern "C" __global__ void mg_stencil(const cd* __restrict__ Y, const cd* __restrict__ v,
                                      const long long* __restrict__ nb, cd* __restrict__ out,
                                      long long nsite, int n, int k) {
    const long long total = nsite * n * k;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(idx % k);
        const int i = (int)((idx / k) % n);
        const long long s = idx / ((long long)k * n);
        cd acc(0.0, 0.0);
        for (int d = 0; d < 9; ++d) {
            const long long t = nb[d * nsite + s];
            const cd* yrow = Y + ((d * nsite + s) * n + i) * (long long)n;
            const cd* vv = v + t * n * (long long)k + col;
            for (int j = 0; j < n; ++j) acc += yrow[j] * vv[(long long)j * k];
        }
        out[idx] = acc;
    }
}

extern "C" __global__ void mg_block_apply(const cd* __restrict__ X, const cd* __restrict__ v,
                                          const long long* __restrict__ hc, cd* __restrict__ out,
                                          long long nhc, int k) {
    const long long total = nhc * 48 * k;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(idx % k);
        const int row = (int)((idx / k) % 48);
        const long long h = idx / (48LL * k);
        const cd* xrow = X + (h * 48 + row) * 48;
        const long long* sites = hc + h * 16;
        cd acc(0.0, 0.0);
        for (int r = 0; r < 48; ++r) acc += xrow[r] * v[(sites[r / 3] * 3 + r % 3) * (long long)k + col];
        out[(sites[row / 3] * 3 + row % 3) * (long long)k + col] = acc;
    }
}
"""

BLOCK = 128


def set_kernels(on: bool) -> bool:
    """Use the kernels (True) or the array path (False); returns the previous setting."""
    old, _STATE["on"] = _STATE["on"], bool(on)
    return old


def applies(geom, *arrays) -> bool:
    """Whether the kernels serve these fields: CuPy arrays of complex128, switched on, no partitioned dimension."""
    if not _STATE["on"] or not geom.backend.is_gpu or any(geom.grid.partitioned):
        return False
    return all(a.dtype == np.complex128 for a in arrays)


def _kernel(name):
    if name not in _MODULE:
        import cupy as cp

        mod = _MODULE.get("_module")
        if mod is None:
            mod = cp.RawModule(code=_SOURCE)
            _MODULE["_module"] = mod
        _MODULE[name] = mod.get_function(name)
    return _MODULE[name]


def _grid(total):
    return (int(min(max((total + BLOCK - 1) // BLOCK, 1), 65535)),)


# ------------------------------------------------------------------------------------------------ index tables
def neighbour_table(geom) -> np.ndarray:
    """(9, local sites) int64: flat local index of x (d = 0), x + mu (d = 1 + 2 mu) and x - mu (d = 2 + 2 mu),
    periodic on the local lattice (site axes (t, z, y, x), x fastest)."""
    ids = np.arange(int(np.prod(geom.shape))).reshape(geom.shape)
    out = [ids.ravel()]
    for mu in range(4):
        axis = 3 - mu
        out.append(np.roll(ids, -1, axis=axis).ravel())
        out.append(np.roll(ids, 1, axis=axis).ravel())
    return np.ascontiguousarray(np.stack(out)).astype(np.int64)


def hypercube_table(geom) -> np.ndarray:
    """(hypercubes, 16) int64: flat local index of each site of each 2^4 hypercube, in the order of
    :func:`lattice.to_blocks` (hypercubes in (T, Z, Y, X) order, sites in a hypercube x fastest)."""
    ids = np.arange(int(np.prod(geom.shape))).reshape(geom.shape)
    return np.ascontiguousarray(to_blocks(ids, (2, 2, 2, 2))).astype(np.int64)


# ------------------------------------------------------------------------------------------------ the kernels
def _columns(v, nsite, n):
    batched = v.ndim == 6
    w = v if batched else v[..., None]
    k = w.shape[-1]
    return batched, k, w.reshape(nsite, n, k)


def stencil(Y, v, nb):
    """The 9-point stencil by one kernel: Y (9, *sites, n, n), v (*sites, n[, k]), nb the device copy of
    :func:`neighbour_table`."""
    import cupy as cp

    nsite = int(nb.shape[1])
    n = int(Y.shape[-1])
    batched, k, w = _columns(v, nsite, n)
    w = cp.ascontiguousarray(w)
    Yc = cp.ascontiguousarray(Y)
    out = cp.empty_like(w)
    total = nsite * n * k
    _kernel("mg_stencil")(_grid(total), (BLOCK,), (Yc, w, nb, out, np.int64(nsite), np.int32(n), np.int32(k)))
    return out.reshape(v.shape)


def block_apply(X, v, hc):
    """X_h applied to every hypercube h by one kernel: X (hypercubes, 48, 48), v (*sites, 3[, k]), hc the device
    copy of :func:`hypercube_table`."""
    import cupy as cp

    nhc = int(hc.shape[0])
    nsite = nhc * 16
    batched, k, w = _columns(v, nsite, 3)
    w = cp.ascontiguousarray(w)
    out = cp.empty_like(w)
    total = nhc * 48 * k
    _kernel("mg_block_apply")(_grid(total), (BLOCK,), (cp.ascontiguousarray(X), w, hc, out, np.int64(nhc),
                                                        np.int32(k)))
    return out.reshape(v.shape)


# ------------------------------------------------------------------------------------------------ references
def stencil_reference(Y, v, nb):
    """:func:`stencil` with array indexing (NumPy or CuPy): the same contraction, the same table."""
    nsite = int(nb.shape[1])
    n = int(Y.shape[-1])
    batched, k, w = _columns(v, nsite, n)
    Yf = Y.reshape(9, nsite, n, n)
    out = 0
    for d in range(9):
        out = out + Yf[d] @ w[nb[d]]
    return out.reshape(v.shape)


def block_apply_reference(X, v, hc):
    """:func:`block_apply` with array indexing (NumPy or CuPy)."""
    nhc = int(hc.shape[0])
    batched, k, w = _columns(v, nhc * 16, 3)
    g = w[hc].reshape(nhc, 48, k)                           # (hypercubes, 16 sites x 3 colours, k)
    r = (X @ g).reshape(nhc, 16, 3, k)
    out = w.copy()
    out[hc.reshape(-1)] = r.reshape(nhc * 16, 3, k)
    return out.reshape(v.shape)
