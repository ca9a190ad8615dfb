"""The HISQ hop (one output parity of D, with an a*x + b*D psi epilogue) as a hand-written CUDA kernel.

Twin: :meth:`solvers.staggered.StaggeredDslash._hop_numpy`. One thread per output site of the parity. The link
blocks of the operator (16 hops: +-1 and +-3 in each direction, backward links precomputed) are re-laid here once
as structure of arrays, (nhop, 9, V/2) complex, so that a warp reads 32 consecutive values per element: fully
coalesced. Neighbour sites come from the thread's coordinates (no index tables): the lattice site of checkerboard
index j of parity p is x = 2k + ((p + y + z + t) & 1) on row j / (nx/2). Kernel file:
solvers/kernels/staggered_hop.cu.

Parity-compact fields (``compact=True``): psi, out and x hold the V/2 sites of one parity in checkerboard order
(the Krylov vectors of the multishift CG, docs/perf-notes.md): the neighbour at full-lattice index s is compact site
s >> 1 and the output site j is j itself; the arithmetic is the same, so the results are the same bits.

Bytes moved per output site (the figure ``hmc bench dslash`` divides by): 16 links (144 B each in double), 16
neighbour vectors (48 B), the output vector and, with a != 0, the x vector: 3216 + 48 B in double, half in single.
"""
from __future__ import annotations

import numpy as np

from lattice import cuda_source
from lattice.placement import Placement, implements

BLOCK = 128


def hop_bytes(dtype, naik: bool = True, axpy: bool = False) -> int:
    """Bytes one output site must move: links, neighbour vectors, output (and x for the a*x epilogue)."""
    c = np.dtype(dtype).itemsize
    nhop = 16 if naik else 8
    return nhop * 9 * c + nhop * 3 * c + 3 * c + (3 * c if axpy else 0)


class CudaHop:
    """``f(psi, parity, out, a, x, b)`` for one StaggeredDslash, on its geometry's GPU."""

    def __init__(self, dslash):
        self.dslash = dslash
        be = dslash.geom.backend
        cp = be.xp
        self.cp = cp
        single = np.dtype(dslash.dtype) == np.complex64
        self.kernel = cuda_source.function(be, "solvers", "staggered_hop.cu", "hop_single" if single else "hop_double")
        self.real = np.float32 if single else np.float64
        self._soa = {}

    def _links(self, parity):
        """The operator's links of this parity in SoA layout, rebuilt when the operator's links change."""
        blocks = self.dslash._links[parity]
        key = (parity, id(blocks))
        if key not in self._soa:
            self._soa = {k: v for k, v in self._soa.items() if k[0] != parity}
            nhop, vh = blocks.shape[0], blocks.shape[1]
            self._soa[key] = (self.cp.ascontiguousarray(blocks.reshape(nhop, vh, 9).transpose(0, 2, 1)), blocks)
        return self._soa[key][0]

    def graph_key(self) -> tuple:
        """The device addresses a captured application bakes in (its links of both parities), built now if they
        are not yet: a graph of this hop stays valid while they are the same."""
        return tuple(self._links(p).data.ptr for p in (0, 1))

    #: the kernel takes parity-compact psi, out and x (``compact=True``: :meth:`StaggeredDslash.hop`)
    compact = True

    def __call__(self, psi, parity, out, a, x, b, compact=False):
        geom = self.dslash.geom
        nx, ny, nz, nt = geom.local_dims
        links = self._links(parity)
        nhop = links.shape[0]
        vh = links.shape[2]
        psi = self.cp.ascontiguousarray(psi)
        xarg = self.cp.ascontiguousarray(x) if (x is not None and a != 0.0) else 0
        self.kernel(((vh + BLOCK - 1) // BLOCK,), (BLOCK,),
                    (psi, links, out, xarg, self.real(a), self.real(b), np.int32(parity), np.int32(nhop),
                     np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt), np.int32(bool(compact))))


def _even_x(geom, dslash) -> bool:
    """The checkerboard index arithmetic of the kernel needs an even local x extent (else the array body)."""
    return geom.local_dims[0] % 2 == 0


@implements("staggered.hop", Placement.WHOLE, fits=_even_x)
def whole_lattice_hop(dslash):
    """The kernel when the whole lattice lives on this GPU of a one-rank run (WHOLE; a partitioned grid or a
    one-rank sub-grid of a split one is DISTRIBUTED: the distributed hop of :mod:`solvers.staggered_dist_cuda`)."""
    return CudaHop(dslash)
