"""Multigrid for the HISQ operator (issue 7, docs/multigrid.md): Kahler-Dirac block preconditioning,
aggregation with near-null vectors split by parity, Galerkin 9-point coarse operators, GCR smoothers, a recursive
K-cycle and flexible GCR outside. Composes as every solver here (docs/architecture.md, as gpt):

    from solvers.multigrid import multigrid
    M = D.matrix(0.001)                                   # M = 2m + D on the full lattice
    inv = multigrid(1e-10, levels=3, blocks=[(4, 4, 4, 4)], nv=48)(M)
    x, stats = inv.solve(b)                               # stats.levels: per-level iterations and times
    inv2 = inv.with_mass(0.01)                            # same near-null vectors, new X^-1 and coarse operators
    D.set_links(fat, long); inv.solve(b)                  # refreshes the vectors, rebuilds the hierarchy

Measured (CPU, NumPy, one BLAS thread, a shared 2-core machine; MILC's lat.sample.l8888, quenched Wilson beta 6.0,
HISQ links, antiperiodic time, random source, tol 1e-10 on |b - M x|/|b|; the defaults before issue 7's scaling study
below: 3 levels, 4^4 blocks, Nv 24, 100 set-up iterations, smoothers (4, 2)):

    m       MG outer  MG fine applications  MG solve   even-odd CG iters  CG M-equiv. applications  CG time
    0.1        34            309             2.7 s          113                 116                 0.89 s
    0.01       37            336             2.6 s          126                 129                 0.88 s
    0.001      37            336             2.6 s          127                 130                 0.89 s

Set-up once 14 s (4896 fine-operator vector applications, batched); another mass 0.8 s (X^-1, Galerkin probes,
LU). Smoothers (0, 4): 40 outer iterations, 243 applications, 2.3 s at m = 0.001. Without the KD step (same
hierarchy, Nv 16, 50 set-up iterations) m = 0.01 needs 245 outer iterations against 44 with it, and m = 0.001 does
not converge in 300. CG's full residual
is |r_e|/(2m): 1e-7 at m = 0.001 (MILC's rule), MG's 9e-11; the solutions agree to 2e-7 there.

On 8^4 multigrid does not pay, as docs/multigrid.md expects: the lowest eigenvalue of D on this lattice is large (CG
stops growing below m = 0.01), and the spectrum of A = X^-1 M lies near the circle |z - 1| = 1 (within 6% in the
free field, within 5e-5 without the Naik term), where a degree-k smoother damps a mode at |z| = d only by about
(1 - d^2/4)^(k/2), so the work falls on the coarse space (here 1/16 of the unknowns). More near-null vectors help
(Nv 16, 24, 32: 44, 36, 30 outer iterations at m = 0.001), more set-up iterations do not (Nv 24 after 10, 50, 100,
200 iterations: 37, 36, 37, 40).

Scaling with the volume (issue 7; CPU, NumPy; bench/mg.py's field: quenched Wilson beta 6.0, cold start and
20 pure-gauge MD trajectories, HISQ links, m = 0.001, tol 1e-10, random source; 4^4 then 2^4 blocks down to a 2^4 or
3^4 coarsest lattice solved by LU; "exact": inner K-cycle solves to 1e-8; fine = applications of M per solve;
CG = mixed-precision even-odd CG, M-equivalent applications; scratch scripts, not kept):

    lattice levels set-up Nv smoothers K-cycle     outer  fine   CG
    8^4     3      10     24 (4, 2)    -            52    472   255
    8^4     3      50     24 (4, 2)    -            42    381   255
    8^4     3      200    24 (4, 2)    -            40    363   255
    8^4     4      50     24 (4, 2)    0.25 / 8     44    399   255
    8^4     4      50     24 (4, 2)    exact        42    381   255
    8^4     4      50     24 (0, 4)    0.25 / 8     45    273   255
    8^4     3      50     32 (0, 4)    -            38    231   255
    8^4     3      50     48 (0, 4)    -            29    176   255
    12^4    3      50     24 (4, 2)    -            56    508   330
    12^4    3      150    24 (4, 2)    -            54    490   330
    12^4    3      50     24 (0, 4)    -            56    340   330
    12^4    3      50     24 (0, 4)    -            53    320   330   (outer GCR restarted every 32, not 16)
    16^4    4      50     24 (4, 2)    0.25 / 8     61    553   458
    16^4    4      50     24 (4, 2)    exact        55    499   458
    16^4    4      50     24 (0, 4)    0.25 / 8     57    346   458
    16^4    4      50     24 (0, 4)    0.05 / 20    53    322   458
    16^4    4      50     48 (0, 4)    0.25 / 8     29    176   458
    8^4     3      50     48 (0, 4)    -            28    169   255   (the defaults now; four levels: the same)
    12^4    3      50     48 (0, 4)    -            29    175   330   (the defaults now)
    16^4    4      50     48 (0, 4)    0.05 / 20    26    158   458   (the defaults now, but nkrylov 16)

What grows, and what does not: (1) the two-grid method itself (the coarse problem solved exactly) needs 40 to 42
outer iterations on 8^4 and 54 to 56 on 12^4 and 16^4: flat from 12^4 on (8^4, a 2^4 coarse lattice, is small); (2)
the inexact K-cycle adds to it and the loss grows with depth (four levels: +5% on 8^4, +11% on 16^4; the five-level
32^4 run on the H200 needed 141): GCR to 0.25 in 2 to 3 iterations removes the coarse residual's large components
and leaves the smallest-eigenvalue error of the coarse operator, which is what the coarse correction is for, and the
coarse operators' smallest eigenvalues fall with the volume. Hence kcycle_tol 0.05, kcycle_maxiter 20 (16^4: 53
outer iterations, exact 55). (3) Not the near-null vectors' set-up: CG on A^dag A x = 0 from random vectors
converges to x = 0 (on 8^4 |x| falls 1e12-fold in 300 iterations while |A x|/|x| stays at 0.12 to 0.2, the bottom of
the spectrum; its recursive residual then drifts from the true one), so past ~50 iterations the vectors improve
nothing (above) and "a few hundred" (docs/multigrid.md) ended in rounding noise (12^4: |A v|/|v| 0.083 after 50, 0.149
after 150; now restarted and guarded, below). Nor does bootstrapping them by the cycle's error propagation help
(8^4: |A v|/|v| 0.57, 60 outer iterations): the slow modes of the cycle are the smoother-resistant ones near
|z - 1| = 1, not low modes. (4) The fine-level smoother (GCR on M, spectrum on the line 2m + i y) costs 3
applications of M per outer iteration and saves none: smoothers (0, 4). (5) What works is a richer coarse space:
with Nv 48 the outer count is the same on 8^4, 12^4 and 16^4 (28, 29, 26 with the defaults now; Nv 24: 45, 56, 57),
169, 175, 158 applications of M: 1.5, 1.9, 2.9 times fewer than CG, the gain growing with the volume (Nv 24, 32, 48
on 8^4: 273 (four levels), 231, 176): Nv 48 by default (docs/multigrid.md: 16 to 32 on small lattices, 64 in production),
at twice the set-up work of Nv 24 and with 96x96 coarse blocks. Also fixed: the outer GCR's |r|^2 recurrence stalled
at its rounding floor (1.85e-8 relative), so a long Krylov cycle ran on to its restart (nkrylov 64: 64 outer
iterations instead of 40); nkrylov 32 now (12^4: 53 against 56). Not verified here: 32^4 (five levels) with the new
defaults (no device time was left).

Distributed (tests/solvers/test_multigrid_mpi.py): every level lives on the fine lattice's process grid; coarse
shifts go through the halo exchange of ``comms`` (every transport), the coarsest LU is gathered to every rank and
solved redundantly. The same solve of l8888 at m = 0.01 (Nv 8) on 1 rank, 2 ranks (mpi and shm) and 4 ranks (shm)
gives the same 54 outer iterations and solutions equal to 3e-16. Each level's time is split into compute, coarse
halo exchange and reductions (:mod:`.timing`; ``stats.levels``, printed by ``hmc solve --solver mg``).
Split grid (:func:`split_grid_solve`): several sources at once on sub-grids of the process grid (ProcessGrid
push/pop), solutions gathered back, equal to single solves. RHMC (:mod:`.shifts`): the smallest poles of the light
pseudofermion's heat-bath and action solves as masses sqrt(p)/2 (deck ``[multigrid] light_shifts``); PBP in
``hmc run`` by multigrid (``[multigrid] pbp``). GPU (:mod:`.cuda`): the coarse stencil and X^-1 as one kernel
each on one rank.

Mixed precision (:mod:`.precision`, ``multigrid(..., precision="single")``, ``--mg-precision``, deck
``[multigrid] precision``), as QUDA: the outer flexible GCR, its true residual and the solution in double; the
whole preconditioner (X^-1, the K-cycle's GCR and smoothers, P and R, the coarse stencils, the coarsest LU:
SuperLU in single) in complex64, on copies of the double hierarchy made once per mass or link update (the set-up
itself stays double). Measured (CPU, NumPy, bench/mg.py's field as above, m = 0.001, tol 1e-10, the
defaults: 3 levels, Nv 48, 50 set-up iterations, smoothers (0, 4), coarsest LU; one set-up, then the preconditioner
alternated double, single, double, single (two runs; in run 1 single first), solve time the best of 2 or 3
repeats; per-level times and the rebuild (X^-1, Galerkin, single copies, LU) over all; a 2-core machine shared
with other jobs, so the times scatter by 20%, run 1 under more load; a scratch script, not kept):

    lattice  preconditioner  outer  fine  solve (run 1; run 2)      level 1      coarsest LU  rebuild      true res.
    8^4      double           28    169   1.31, 1.32; 1.15, 1.36 s  0.84-1.20 s  0.12-0.15 s  1.3-1.8 s    8.5e-11
    8^4      single           28    169   1.30, 1.29; 0.97, 1.00 s  0.66-0.92 s  0.11-0.12 s  1.2-1.8 s    8.5e-11
    12^4     double           29    175   9.75, 14.5; 10.4, 7.58 s  4.39-6.27 s  2.06-2.90 s  35.5-55.6 s  4.8e-11
    12^4     single           29    175   9.46, 8.52; 6.29, 6.78 s  3.30-4.91 s  2.45-3.67 s  22.2-35.9 s  4.8e-11

The single-precision cycle costs no outer iteration: the same counts on both lattices, also with the coarsest
solve by GCR on 12^4 (31 and 31, the same 643 coarse GCR iterations) and on l8888 with Nv 16 (46 and 46 at
m = 0.01 and 0.001). Flexible GCR lets the preconditioner change between iterations, and the cycle's own error
(the coarse space's, kcycle_tol) is far above single's rounding: its corrections differ from the double cycle's by
~1e-5 relative (l8888, m = 0.001), the solutions by ~1e-14 (l8888, Nv 8, m = 0.01). The gain on the CPU is modest:
per solve 16% (best against best: 8^4 0.97 against 1.15 s, 12^4 6.29 against 7.58 s), level 1 about 25%; the
outer level stays double, SuperLU's single solve is not faster (its factorization is: the 12^4 rebuild), and
NumPy's complex64 shifts, gathers and small batched products are not twice as fast as complex128. On the GPU the
batched kernels of :mod:`.cuda` come in complex64 too (session 3), so a single cycle keeps one kernel per stencil
there and halves the bytes of Y, the coarse levels' main traffic. ``precision="double"`` stays the default until
the GPU comparison (hmc bench mg --mg-precision single) says otherwise.

Near-null relaxation (:func:`.transfer.relax_null_vectors`): the recursive residual of CG on A^dag A x = 0 left the
true one (no restart, l8888 m = 0.001: |A v|/|v| 0.24 after 50 iterations, 0.41 after 200, 0.90 after 300). CG now
restarts every 50 iterations (or when a vector's |r|^2 has fallen 1e-14-fold), each vector scaled to unit norm and
its residual recomputed. That alone does not make more iterations better: CG minimizes |A x|, not |A x|/|x|, and
once the lowest modes dominate it removes them too (12^4, restarted: 0.080..0.087 after 50, 0.106..0.142 after
150, 0.100..0.121 after 200). So each vector's quotient is measured at each restart and a vector whose cycle did not
lower it keeps its best iterate and stops: now l8888 (four vectors) 0.232..0.245 after 50, 0.220..0.240 after 100
and the same after 150, 200, 300; 12^4 0.080..0.087 after 50, 150 and 200 (the second cycle lowered none, so
they stop after 100). The defaults (50 iterations: one cycle) give the same vectors as before to rounding; a
refresh after a gauge update now never returns a worse vector than it started from.

Not done here: exact (decomposition-independent) reductions in the batched set-up (``grid.sum``:
results across rank counts agree to rounding, not bitwise); the coarse LU is gathered and solved on every rank (no
distributed direct solve; fine for the small coarsest lattices here; on one GPU it is a dense inverse on the
device, :class:`.precision.DenseInverse`); overlap of the coarse stencil's one halo exchange with interior work (the
GPU kernels on several ranks read an extended array filled by that exchange first: :mod:`.cuda`).

On the H200 (runs/multigrid/README.md): 32^4, m = 0.001, tol 1e-10: 39 outer iterations, 236 fine applications
against mixed CG's 1238 (5.25x); solve 3.97 s (double) / 3.39 s (single preconditioner) against CG's 0.77 s, set-up
29-43 s. Level 2 (8^4 x 96 unknowns, Y 5.4 GB) runs at copy bandwidth and its 1122 applications per solve move the
traffic of ~1800 fine applications, so on this field (CG's 1223 iterations) multigrid does not win in wall clock.
Flat in mass at 16^4 on the GPU: 24/26/26 outer iterations at m = 0.1/0.01/0.001 (CG 212/399/444); at 32^4 25/35/39
(CG 242/936/1223).

Modules: :mod:`.lattice` (coarse lattices, blocking, parameter checks), :mod:`.operators` (batched M, the KD
blocks X and X^-1, the level and coarse operators), :mod:`.transfer` (near-null vectors, P and R, Galerkin),
:mod:`.krylov` (GCR smoother, flexible GCR), :mod:`.params` (parameters and their checks), :mod:`.hierarchy` (the
shared near-null space, the per-mass levels), :mod:`.solver` (set-up reuse, K-cycle, statistics), :mod:`.batched`
(k right-hand sides in one solve; hmc solve --ksprop and hmc spectrum with --solver mg), :mod:`.half` (16-bit
coarse stencils),
:mod:`.timing` (per-level clocks), :mod:`.precision` (the preconditioner's single-precision copies),
:mod:`.split` (split-grid solves), :mod:`.shifts` (RHMC shifts), :mod:`.cuda`
(GPU kernels), :mod:`.graph` (the deepest K-cycle GCR's steps as CUDA-graph replays; docs/multigrid.md
"Device-resident coarse levels").
"""
from .lattice import CoarseGeometry, MultigridError
from .operators import CoarseOperator, FineStencil, KDBlocks, LevelOperator
from .solver import (Hierarchy, MultigridInverse, MultigridParams, MultigridStats, Subspace, multigrid,
                     validate)
from .split import split_grid_solve
from .transfer import Transfer, galerkin, orthonormalize, relax_null_vectors

__all__ = ["multigrid", "MultigridInverse", "MultigridParams", "MultigridStats", "MultigridError", "Subspace",
           "Hierarchy", "validate", "CoarseGeometry", "CoarseOperator", "FineStencil", "KDBlocks", "LevelOperator",
           "Transfer", "galerkin", "orthonormalize", "relax_null_vectors", "split_grid_solve"]
