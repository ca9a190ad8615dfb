"""The precision of the multigrid preconditioner (``multigrid(..., precision=...)``), as QUDA runs it.

The outer flexible GCR, its true residual and the solution stay in double precision (complex128); the
preconditioner it calls (X^-1 of the Kahler-Dirac step, the K-cycle with its smoothers, transfers and coarse
operators, the coarsest solve) runs in ``precision``: with "single" the residual is rounded to complex64 on the way
in and the correction promoted back on the way out. Flexible GCR lets the preconditioner change from one iteration
to the next (the K-cycle's inner GCR already makes it do), so single's rounding (6e-8) costs outer iterations only
where it is comparable to the cycle's own error (the coarse space's, kcycle_tol 0.05): measured, none (the
solver's notes in :mod:`solvers.multigrid`).

The set-up (near-null vectors, orthonormalization, Galerkin probes, adjoint stencils) runs in double; the single
hierarchy holds copies, made once per hierarchy (per mass and link update), of: the fine links of M
(``StaggeredMatrix.converted``, as mixed_cg's single-precision iteration), the batched fine stencil's links, the
48x48 blocks X and X^-1, the near-null vectors V (P and R = V^dag), the coarse stencils Y, and a sparse LU of the
coarsest single stencil (SuperLU in single).

With "half" the cycle is the single one except that the coarse stencils Y of levels >= 2 are stored as 16-bit
integers with a float32 scale per block (:mod:`.half`, QUDA's half-precision coarse links), decoded in float32;
the coarsest direct solve factorizes the decoded stencil (the operator the K-cycle's GCR applies).

On the GPU the batched kernels of :mod:`.cuda` come in both precisions (complex128 and complex64); the coarsest
level's direct solve is a dense inverse on the device there (:class:`DenseInverse`).
"""
from __future__ import annotations

import time

import numpy as np

from .half import HalfCoarseOperator
from .operators import LevelOperator

#: the preconditioner's precisions and the dtype of the cycle's vectors ("half": single vectors, 16-bit stencils)
PRECISIONS = {"double": np.complex128, "single": np.complex64, "half": np.complex64}


def cycle_dtype(precision: str):
    """complex128 for "double", complex64 for "single" and "half"."""
    return np.dtype(PRECISIONS[precision])


class FineOp:
    """M (any precision) with an application counter (level 0 of the statistics)."""

    def __init__(self, M, counter):
        self.M, self.counter = M, counter
        self.geom, self.xp = M.geom, M.xp

    def apply(self, v):
        t0 = time.perf_counter()
        out = self.M(v)
        self.counter.applies += 1
        self.counter.time += time.perf_counter() - t0
        return out


DENSE_MAX = 8192          # unknowns of the coarsest level up to which the GPU keeps its dense inverse (1 GiB)


class DenseInverse:
    """The coarsest operator's inverse as a dense matrix on the device, computed once (in double, then rounded to
    the cycle's precision): a solve is one matrix-vector product there. A sparse LU on the host costs a copy to the
    host and back and SuperLU's triangular solves per call (3.6 ms on 2^4 x 96 unknowns, 663 calls per 32^4 solve
    on the H200), the product ~10 us. The coarsest lattice is small (2^4 or 3^4 sites of 2 Nv unknowns), and its
    inverse is only a preconditioner's part, so the explicit inverse's extra rounding does not matter. With a CuPy
    ``backend``, inside :func:`.lattice.kernel_products` (the graphs' warm-up and capture), the product is
    :func:`.lattice.batched_matmul`'s (a stack of one), not cuBLAS's: CuPy refuses cuBLAS inside a graph capture,
    and the multigrid's captured steps contain this solve (solvers/multigrid/graph.py).
    """

    on_device = True

    def __init__(self, xp, A, backend=None):
        self.xp, self.backend = xp, backend
        self.inv = xp.linalg.inv(xp.asarray(A, dtype=np.complex128)).astype(A.dtype)

    def solve(self, rhs):
        """A^-1 rhs for a flat right-hand side (host or device); on the device."""
        rhs = self.xp.asarray(rhs, dtype=self.inv.dtype)
        return self.apply_columns(rhs.reshape(-1, 1)).reshape(rhs.shape)

    def apply_columns(self, F):
        """A^-1 F for the (n, k) right-hand sides F (on the device, in the inverse's precision)."""
        from .lattice import batched_matmul, products_by_kernel

        if self.backend is None or not products_by_kernel(self.xp):
            return self.inv @ F
        return batched_matmul(self.backend, self.inv[None], self.xp.asarray(F, dtype=self.inv.dtype)[None])[0]


class CycleLevels:
    """What the preconditioner applies, in one precision: ``fine`` (M, for the level-0 smoother), ``kd`` (X^-1 or
    None), ``ops`` (None, A = X^-1 M, then the coarse stencils), ``transfers`` and ``lu`` (the coarsest factor or
    None). In double these are the hierarchy's own objects; in single and half, copies (see the module docstring). The
    counters are the hierarchy's, so the statistics count applications in either precision."""

    def __init__(self, hierarchy, precision: str):
        dtype = cycle_dtype(precision)
        h = self.hierarchy = hierarchy
        self.precision, self.dtype = precision, dtype
        self.double = dtype == np.complex128
        M = h.M if self.double else h.M.converted(dtype)
        self.fine = FineOp(M, h.counters[0])
        self.kd = None if h.kd is None else h.kd.converted(dtype)
        if self.double:
            self.ops = list(h.ops)
            self.transfers = list(h.transfers)
        else:
            lvl = h.ops[1]
            self.ops = [None, LevelOperator(M, lvl.stencil.converted(dtype), self.kd, lvl.counter)]
            coarse = HalfCoarseOperator if precision == "half" else (lambda op: op.converted(dtype))
            self.ops += [coarse(op) for op in h.ops[2:]]
            self.transfers = [tr.converted(dtype) for tr in h.transfers]
        self.lu = None

    def factorize(self, mode: str):
        """The coarsest direct solver in this precision (``mode`` "lu"), or none ("gcr"): on the GPU, up to
        :data:`DENSE_MAX` unknowns, the dense inverse on the device (:class:`DenseInverse`); else a sparse LU
        (SuperLU) on the host."""
        if mode != "lu":
            self.lu = None
            return
        op = self.ops[-1]
        A = op.sparse_matrix()
        if op.xp is not np and A.shape[0] <= DENSE_MAX:
            self.lu = DenseInverse(op.xp, A.toarray(), op.geom.backend)
        else:
            from scipy.sparse.linalg import splu

            self.lu = splu(A.tocsc())

    def to_cycle(self, v):
        """A double-precision field rounded to the cycle's precision (no copy in double)."""
        return v if self.double else v.astype(self.dtype)

    def to_outer(self, v, dtype):
        """A correction of the cycle promoted to the outer precision ``dtype``."""
        return v if v.dtype == dtype else v.astype(dtype)
