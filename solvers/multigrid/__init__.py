"""Multigrid for the HISQ operator (issue 7, ../shared/MULTIGRID.md): Kahler-Dirac block preconditioning,
aggregation with near-null vectors split by parity, Galerkin 9-point coarse operators, GCR smoothers, a recursive
K-cycle and flexible GCR outside. Composes as every solver here (DESIGN.md, as gpt):

    from solvers.multigrid import multigrid
    M = D.matrix(0.001)                                   # M = 2m + D on the full lattice
    inv = multigrid(1e-10, levels=3, blocks=[(4, 4, 4, 4)], nv=24)(M)
    x, stats = inv.solve(b)                               # stats.levels: per-level iterations and times
    inv2 = inv.with_mass(0.01)                            # same near-null vectors, new X^-1 and coarse operators
    D.set_links(fat, long); inv.solve(b)                  # refreshes the vectors, rebuilds the hierarchy

Modules: :mod:`.lattice` (coarse lattices, blocking, parameter checks), :mod:`.operators` (batched M, the KD
blocks X and X^-1, the level and coarse operators), :mod:`.transfer` (near-null vectors, P and R, Galerkin),
:mod:`.krylov` (GCR smoother, flexible GCR), :mod:`.solver` (parameters, set-up reuse, K-cycle, statistics).
"""
from .lattice import CoarseGeometry, MultigridError
from .operators import CoarseOperator, FineStencil, KDBlocks, LevelOperator
from .solver import (Hierarchy, MultigridInverse, MultigridParams, MultigridStats, Subspace, multigrid,
                     validate)
from .transfer import Transfer, galerkin, orthonormalize, relax_null_vectors

__all__ = ["multigrid", "MultigridInverse", "MultigridParams", "MultigridStats", "MultigridError", "Subspace",
           "Hierarchy", "validate", "CoarseGeometry", "CoarseOperator", "FineStencil", "KDBlocks", "LevelOperator",
           "Transfer", "galerkin", "orthonormalize", "relax_null_vectors"]
