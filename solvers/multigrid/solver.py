"""The multigrid solver: parameters, the set-up (shared near-null space and per-mass hierarchy), the K-cycle and
the outer flexible GCR, composed as every solver here (``multigrid(...)(M)`` is M^-1 as an operator).

Levels (docs/multigrid.md):

* level 0: M = 2m + D on the full lattice; outer flexible GCR, checked on the true residual; post-smoothing by
  ``smoother_steps[0]`` GCR steps on M;
* level 1: A = X^-1 M (Kahler-Dirac preconditioned; with ``kd=False``, A = M: the negative control); the level-0
  preconditioner is e = smooth_M(r, K_1(X^-1 r)), since A^-1 X^-1 = M^-1;
* level l >= 2: A_l = R A_{l-1} P (Galerkin, 9-point stencil, dense (2Nv)x(2Nv) blocks).

K-cycle on level l (1 <= l < L-1), post-smoothing only: x = P y with y the level-(l+1) solve of A_{l+1} y = R f
(exact on the coarsest level; otherwise flexible GCR preconditioned by the level-(l+1) cycle, to
``kcycle_tol`` in at most ``kcycle_maxiter`` iterations), then ``smoother_steps[l]`` GCR steps on A_l.
Coarsest level: sparse LU (scipy, on the host; on several ranks the coarse stencil is gathered and factorized on
every rank, each solve gathers the right-hand side, solves redundantly and keeps its block) or unpreconditioned GCR
to ``coarsest_tol``.

Precision (:mod:`.precision`): the outer flexible GCR and its true residual are double; the preconditioner (every
level >= 1, the KD step, the level-0 smoother) runs in ``precision`` ("double", "single" or "half", QUDA's
mixed-precision multigrid) on single-precision copies of the hierarchy made after each set-up or rebuild (half: the
coarse stencils in 16-bit integers, :mod:`.half`).

Distributed: every level lives on the fine lattice's process grid (a coarse site belongs to the rank holding its
aggregate); coarse shifts go through the halo exchange of ``comms`` (every transport) and reductions through the
grid. Each level's time is split into compute, coarse halo exchange and reductions (:mod:`.timing`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from lattice import CounterRNG

from ..cg import InverseOperator, SolverConvergenceError, SolverStats
from ..staggered import StaggeredMatrix
from .hierarchy import Hierarchy, Subspace
from .krylov import fgcr, gcr_smooth, norm2
from .lattice import MultigridError
from . import graph, timing
from .operators import FineStencil
from .params import MultigridParams, validate
from .precision import FineOp
from .transfer import Transfer, relax_null_vectors

__all__ = ["multigrid", "MultigridInverse", "MultigridStats", "MultigridParams", "Subspace", "Hierarchy",
           "validate"]


def multigrid(tol: float = 1e-10, maxiter: int = 200, *, levels: int = 3, blocks=(), nv=48, setup_iters=50,
              refresh_iters: int = 10, smoother_steps=(0, 4), kcycle_tol: float = 0.05, kcycle_maxiter: int = 20,
              coarsest: str = "auto", coarsest_tol: float = 0.25, coarsest_maxiter: int = 100, nkrylov: int = 32,
              kd: bool = True, seed: int = 2024, raise_on_fail: bool = True, precision: str = "double",
              subspace=None, refresh_every: int | None = None):
    """``multigrid(tol, ...)(M)``: M^-1 for a :class:`solvers.StaggeredMatrix` M = 2m + D, as an operator
    (:class:`MultigridInverse`): ``x = inv(b)``, ``x, stats = inv.solve(b)``.

    * ``levels``: 3 or more (fine, Kahler-Dirac, then levels - 2 aggregations);
    * ``blocks``: one (bx, by, bz, bt) per aggregation level: the first in fine sites (even, tiling the local
      volume, at least 3 wide with the Naik term: default 4^4), the next in coarse sites (default 2^4);
    * ``nv``: near-null vectors per aggregation level (an int or one per level; the last is repeated);
    * ``setup_iters``: CG iterations on A^dag A x = 0 relaxing them (per level); ``refresh_iters`` after a link
      update;
    * ``smoother_steps``: GCR post-smoothing steps on level 0, 1, ... (the last entry repeats): (0, 4): GCR on M
      itself (spectrum 2m + i y) barely smooths, so the fine level's steps cost applications of M and save none
      (12^4: (4, 2) 56 outer iterations, 508 applications of M; (0, 4) 56 and 340);
    * ``kcycle_tol``, ``kcycle_maxiter``: the K-cycle's GCR on the levels between KD and the coarsest (0.05, 20:
      GCR to 0.25 leaves the coarse operator's smallest-eigenvalue error, the part the correction is for, and the
      loss compounds with depth: 16^4, four levels, 0.25 / 8: 57 outer iterations, 0.05 / 20: 53, exact: 55);
    * ``coarsest``: "lu" (exact, scipy sparse LU on the host, gathered to every rank), "gcr" (to
      ``coarsest_tol``), or "auto" (LU up to 200 000 coarsest unknowns);
    * ``nkrylov``: restart length of the outer flexible GCR (32: 12^4 needs 53 outer iterations against 56 with 16);
    * ``kd=False``: aggregate M itself, without the Kahler-Dirac step (the negative control);
    * ``precision``: of the preconditioner, "double", "single" (complex64 copies of X^-1, the near-null vectors,
      the coarse stencils and M's links; the outer GCR and the true residual stay double: :mod:`.precision`) or
      "half" (single, with the coarse stencils in 16-bit integers with a scale: :mod:`.half`);
    * ``subspace``: a :class:`Subspace` to share (near-null vectors of another mass: ``inv.subspace``);
    * ``refresh_every``: the new subspace's rule for new links (:class:`Subspace`: None refreshes the vectors on
      every link update, N >= 1 every N epochs with thin updates between, 0 never).
    """
    params = MultigridParams(tol=tol, maxiter=maxiter, levels=levels, blocks=tuple(blocks),
                             nv=tuple(nv) if isinstance(nv, (tuple, list)) else (nv,),
                             setup_iters=tuple(setup_iters) if isinstance(setup_iters, (tuple, list))
                             else (setup_iters,),
                             refresh_iters=refresh_iters,
                             smoother_steps=tuple(smoother_steps) if isinstance(smoother_steps, (tuple, list))
                             else (smoother_steps,),
                             kcycle_tol=kcycle_tol, kcycle_maxiter=kcycle_maxiter, coarsest=coarsest,
                             coarsest_tol=coarsest_tol, coarsest_maxiter=coarsest_maxiter, nkrylov=nkrylov, kd=kd,
                             seed=seed, raise_on_fail=raise_on_fail, precision=precision)
    if subspace is None:
        return lambda M: MultigridInverse(M, params, refresh_every=refresh_every)
    if refresh_every is not None:
        raise MultigridError("refresh_every belongs to the subspace: give it where the subspace is made, not with "
                             "subspace=")
    return lambda M: MultigridInverse(M, params, subspace)


# ---------------------------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class MultigridStats(SolverStats):
    """SolverStats plus: ``levels`` (one dict per level: operator, lattice, unknowns, iterations, applications,
    seconds, split into compute_time, halo_time (coarse halo exchanges; halo_exchanges of them) and reduce_time
    (global reductions; reductions of them)), ``setup_time`` (this solve's share: the set-up, refresh or rebuild it triggered), ``solve_time``,
    ``fine_applies`` (applications of M during the solve, the K-cycle's included) and ``setup_fine_applies``
    (fine-operator vector applications of the set-up it triggered), ``setup`` ("built", "refreshed", "updated",
    "rebuilt" or "reused")."""

    levels: list = field(default_factory=list)
    setup_time: float = 0.0
    solve_time: float = 0.0
    fine_applies: int = 0
    setup_fine_applies: int = 0
    setup: str = "reused"

    def level_lines(self) -> list[str]:
        out = []
        for d in self.levels:
            bits = [f"level {d['level']} ({d['operator']}, {d['lattice']}, {d['unknowns']} unknowns):"]
            for key, label in (("iters", "iterations"), ("cycles", "cycles"), ("krylov_iters", "GCR iterations"),
                               ("direct_solves", "direct solves"), ("applies", "applications"),
                               ("smoother_steps", "smoother steps")):
                if d.get(key):
                    bits.append(f"{d[key]} {label}")
            split = ""
            if "compute_time" in d:
                split = (f" (compute {d['compute_time']:.3g} s, halo {d['halo_time']:.3g} s in "
                         f"{d['halo_exchanges']} exchanges, reductions {d['reduce_time']:.3g} s in {d['reductions']})")
            bits.append(f"{d['time']:.3g} s{split}")
            if d.get("bytes") and d["time"] > 0:
                bits.append(f"stencil traffic {d['bytes'] / 1e9:.3g} GB = {d['bytes'] / d['time'] / 1e9:.3g} GB/s "
                            "over the level's time")
            out.append(" ".join(bits[:1]) + " " + ", ".join(bits[1:]))
        return out

    def __str__(self):
        tr = "" if self.true_residual is None else f", true residual {self.true_residual:.3e}"
        return (f"{self.solver}: {'converged' if self.converged else 'NOT converged'} in {self.iters} outer "
                f"iterations ({self.fine_applies} fine-operator applications){tr} (tol {self.tol:.1e}), set-up "
                f"{self.setup_time:.3g} s ({self.setup}), solve {self.solve_time:.3g} s")



class MultigridInverse(InverseOperator):
    """M^-1 by KD-preconditioned aggregation multigrid (made by :func:`multigrid`).

    ``inv.setup()`` builds (or refreshes) the hierarchy now; otherwise the first solve does. Each solve checks that
    the links and mass are those of the hierarchy: new links refresh the near-null vectors (``refresh_iters``; or
    keep them, as the subspace's ``refresh_every`` rule says) and rebuild X^-1 and the coarse operators. ``inv.with_mass(m)`` is the inverse for another mass on the same
    near-null vectors. ``inv.hierarchy``: the levels' operators and transfers; ``inv.subspace``: the vectors."""

    def __init__(self, M, params: MultigridParams, subspace: Subspace | None = None,
                 refresh_every: int | None = None):
        if not isinstance(M, StaggeredMatrix):
            raise TypeError(f"multigrid takes the full-lattice StaggeredMatrix M = 2m + D (D.matrix(mass)), not "
                            f"{type(M).__name__}")
        if M.dagger:
            raise MultigridError("multigrid inverts M = 2m + D; for M^dag = eps M eps use eps inv(eps b)")
        if np.dtype(M.dtype) != np.complex128:
            raise MultigridError("multigrid's outer solve runs in double precision: M must be complex128 "
                                 "(precision=\"single\" makes the preconditioner single)")
        self.params = validate(params, M.geom, M.dslash.naik)
        super().__init__(M, f"multigrid (KD{'' if self.params.kd else ' off'}, {self.params.levels} levels)")
        self.hermitian = False
        self.subspace = subspace if subspace is not None else Subspace(self.params, refresh_every)
        if subspace is not None:
            self._check_compatible(subspace)
        self.hierarchy: Hierarchy | None = None
        self._graphed = None          # the level whose GCR steps are CUDA-graph replays (.graph), or None
        self._stencil_links = None
        self._pending = []            # (what, seconds, fine columns) of set-up work not yet reported
        self.progress = None          # callable(note): told what the set-up does (hmc solve's progress line)

    def _check_compatible(self, sub):
        a, b = sub.params, self.params
        for key in ("levels", "blocks", "nv", "kd"):
            if getattr(a, key) != getattr(b, key):
                raise MultigridError(f"subspace was made with {key} = {getattr(a, key)!r}, not {getattr(b, key)!r}")

    # ----------------------------------------------------------------------------------------------- set-up
    @property
    def M(self):
        return self.op

    @property
    def mass(self) -> float:
        return self.op.mass

    def with_mass(self, mass: float, **changes) -> "MultigridInverse":
        """The inverse of M(mass) on the same near-null vectors (only X^-1 and the coarse operators are rebuilt);
        ``changes``: other parameters (tol, maxiter, smoother steps, ...; not levels, blocks, nv, kd)."""
        params = replace(self.params, **changes)
        return MultigridInverse(self.op.dslash.matrix(mass), params, self.subspace)

    def _links(self):
        return self.op.dslash._store.links

    def setup(self):
        """Bring the near-null vectors and the hierarchy up to date with the links and the mass (the subspace's
        rule, :class:`Subspace`). Returns "built", "refreshed", "updated", "rebuilt" or "reused"."""
        t0 = time.perf_counter()
        sub = self.subspace
        links = self._links()
        what, columns = "reused", 0
        if self.hierarchy is None or self._stencil_links is not links:
            if sub.links is links and sub.stencil is not None:      # another mass's copy of these links
                self._stencil = sub.stencil.with_mass(self.mass)
            else:
                self._stencil = FineStencil(self.op)
            self._stencil_links = links
        if sub.links is not links:
            what = sub.on_new_links()
            if what == "updated":
                columns = self._make_hierarchy(new_links=True)
            else:
                columns = self._make_subspace(fresh=what == "built")
                sub.epochs = 0
        elif self.hierarchy is None or self.hierarchy.version != sub.version:
            what = "rebuilt"
            columns = self._make_hierarchy()
        self.op.geom.backend.synchronize()
        if what != "reused":
            sub.counts[what] += 1
            self._pending.append((what, time.perf_counter() - t0, columns))
        return what

    def _make_hierarchy(self, new_links: bool = False) -> int:
        """X^-1 and the coarse operators on the subspace's transfers (links or mass changed; ``new_links``: the
        thin update, after which the kept vectors belong to these links). Returns the number of fine-operator
        vector applications spent (the Galerkin probes)."""
        sub = self.subspace
        h = Hierarchy(self.op, self.params, self._stencil)
        self._report(f"multigrid: X^-1 and the coarse operators for m = {self.mass:g} on the kept vectors")
        for tr in sub.transfers:
            h.add_level(tr)
        self._report("multigrid: the coarsest factorization")
        h.factorize()
        if new_links:
            sub.links, sub.stencil = self._links(), self._stencil
            sub.version += 1
        h.version = sub.version
        columns = h.counters[1].columns
        for c in h.counters:
            c.reset()
        self.hierarchy = h
        return columns

    def _make_subspace(self, fresh: bool) -> int:
        """Generate (fresh) or refresh the near-null vectors level by level, building the hierarchy on the way.
        Returns the number of fine-operator vector applications spent."""
        sub, p = self.subspace, self.params
        rng = CounterRNG(p.seed)
        h = Hierarchy(self.op, p, self._stencil)
        new_vectors, new_transfers = [], []
        for l in range(2, p.levels):
            op = h.ops[l - 1]
            nv = int(p.per_level(p.nv, l, "nv"))
            if fresh:
                x = op.random(rng, nv, f"multigrid-null-vectors-level-{l}")
                iters = int(p.per_level(p.setup_iters, l, "setup_iters"))
            else:
                x = sub.vectors[l - 2].copy()
                iters = int(p.refresh_iters)
            what = f"multigrid {'set-up' if fresh else 'refresh'}: level {l} of {p.levels - 1}, {nv} near-null vectors"
            self._report(f"{what}, CG iteration 0 of {iters}")
            x = relax_null_vectors(op, x, iters,
                                   report=lambda i, w=what, n=iters: self._report(f"{w}, CG iteration {i} of {n}"))
            tr = Transfer(op, p.blocks[l - 2], x)
            new_vectors.append(x)
            new_transfers.append(tr)
            self._report(f"multigrid: level {l} of {p.levels - 1}, the Galerkin coarse operator")
            h.add_level(tr)
        self._report("multigrid: the coarsest factorization")
        h.factorize()
        sub.vectors, sub.transfers = new_vectors, new_transfers
        sub.links = self._links()
        sub.stencil = self._stencil
        sub.version += 1
        h.version = sub.version
        columns = h.counters[1].columns
        for c in h.counters:
            c.reset()
        self.hierarchy = h
        return columns

    def _report(self, note: str) -> None:
        if self.progress is not None:
            self.progress(note)

    # ----------------------------------------------------------------------------------------------- the cycle
    def _coarsest_solve(self, f):
        h = self.hierarchy
        L = len(h.ops) - 1
        op = h.cycle.ops[L]
        st = self._lstats[L]
        t0 = time.perf_counter()
        with timing.active(h.clocks[L]):
            lu = h.cycle.lu
            if lu is not None and getattr(lu, "on_device", False) and op.geom.grid.active_comm.size == 1:
                y = lu.solve(f.reshape(-1)).reshape(f.shape)  # one rank, GPU: no host round trip
                st["direct_solves"] += 1
            elif lu is not None:
                geom = op.geom
                t1 = timing.now()
                rhs = geom.gather_all(f)                     # the whole right-hand side on every rank
                dt = timing.now() - t1
                if geom.grid.active_comm.size > 1:
                    timing.charge_halo(dt)                   # the gather is the coarsest level's communication
                y = lu.solve(rhs.ravel()).reshape(rhs.shape)
                y = op.xp.ascontiguousarray(op.xp.asarray(geom.local_part(y), dtype=op.dtype))
                st["direct_solves"] += 1
            else:
                p = self.params
                y, res = fgcr(op.apply, lambda r: r, op.geom, f, p.coarsest_tol, p.coarsest_maxiter,
                              nkrylov=p.coarsest_maxiter)
                st["krylov_iters"] += res.iters
                st["solves"] += 1
        st["time_incl"] += time.perf_counter() - t0
        return y

    def _cycle(self, l, f):
        """K-cycle on level l: approximately A_l^-1 f (in the cycle's precision)."""
        h, p = self.hierarchy, self.params
        cyc = h.cycle
        L = len(h.ops) - 1
        if l == L:
            return self._coarsest_solve(f)
        st = self._lstats[l]
        t0 = time.perf_counter()         # (the time of levels >= 2 is taken around their GCR, by the caller)
        st["cycles"] += 1
        tr = cyc.transfers[l - 1]
        fc = tr.restrict(f)
        if l + 1 == L:
            y = self._coarsest_solve(fc)
        else:
            opc = cyc.ops[l + 1]
            t1 = time.perf_counter()
            with timing.active(h.clocks[l + 1]):
                y, res = fgcr(opc.apply, lambda r: self._cycle(l + 1, r), opc.geom, fc, p.kcycle_tol,
                              p.kcycle_maxiter, nkrylov=p.kcycle_maxiter, run=self._graph_run(l + 1, opc, fc))
            self._lstats[l + 1]["krylov_iters"] += res.iters
            self._lstats[l + 1]["solves"] += 1
            self._lstats[l + 1]["time_incl"] += time.perf_counter() - t1
        x = tr.prolong(y)
        steps = p.steps(l)
        with timing.active(h.clocks[l]):
            x = gcr_smooth(cyc.ops[l], f, x, steps)
        st["smoother_steps"] += steps
        if l == 1:
            st["time_incl"] += time.perf_counter() - t0
        return x

    def _graph_run(self, level, op, f):
        """The persistent GCR run whose steps are CUDA-graph replays (:mod:`.graph`) for the K-cycle GCR of
        ``level``, or None (host-driven steps)."""
        if level != self._graphed:
            return None
        tally = graph.Tally(self.hierarchy.counters, lambda: self._lstats)
        return graph.level_graphs(self.hierarchy, level, op.apply, lambda r: self._cycle(level, r), f,
                                  self.params.kcycle_maxiter, tally).run

    def _precondition(self, r):
        """Level 0: e = smooth_M(r, K_1(X^-1 r)), in the cycle's precision (r rounded to it, e promoted back)."""
        h, p = self.hierarchy, self.params
        cyc = h.cycle
        rc = cyc.to_cycle(r)
        f = rc if cyc.kd is None else cyc.kd.apply_inv(rc)
        e = self._cycle(1, f)
        steps = p.steps(0)
        if steps > 0:
            with timing.active(h.clocks[0]):
                e = gcr_smooth(cyc.fine, rc, e, steps)
            self._lstats[0]["smoother_steps"] += steps
        return cyc.to_outer(e, r.dtype)

    # ----------------------------------------------------------------------------------------------- solve
    def _solve(self, b, x0):
        p = self.params
        geom, xp = self.op.geom, self.op.xp
        self.setup()
        pending, self._pending = self._pending, []
        setup_time = sum(t for _, t, _ in pending)
        h = self.hierarchy
        for c in h.counters:
            c.reset()
        for c in h.clocks:
            c.reset()
        self._fine = FineOp(self.op, h.counters[0])
        self._graphed = graph.graphed_level(h, p)
        graphs_before = graph.graph_counters(h)
        self._lstats = [dict(cycles=0, krylov_iters=0, solves=0, direct_solves=0, smoother_steps=0, time_incl=0.0)
                        for _ in h.ops]
        t0 = time.perf_counter()
        b = xp.asarray(b).astype(self.op.dtype, copy=False)
        with timing.active(h.clocks[0]):
            x, res = fgcr(self._fine.apply, self._precondition, geom, b, p.tol, p.maxiter, nkrylov=p.nkrylov,
                          x=None if x0 is None else xp.asarray(x0).astype(self.op.dtype), true_residual=True)
        geom.backend.synchronize()
        solve_time = time.perf_counter() - t0
        self._lstats[0]["time_incl"] = solve_time
        bb = norm2(geom, b)
        true_res = math.sqrt(norm2(geom, b - self.op(x)) / bb) if bb > 0 else 0.0
        st = MultigridStats(self.name, p.tol, converged=true_res <= p.tol, iters=res.iters, milc_iters=res.iters,
                            restarts=res.restarts, residual=res.residual, true_residual=true_res,
                            precision="double" if p.precision == "double" else f"{p.precision}/double",
                            maxiter=p.maxiter)
        st.setup_time = setup_time
        st.solve_time = solve_time
        st.time = setup_time + solve_time
        st.setup = ",".join(w for w, _, _ in pending) or "reused"
        st.setup_fine_applies = sum(c for _, _, c in pending)
        st.levels = self._level_stats(res)
        st.fine_applies = h.counters[0].applies + h.counters[1].applies
        st.matvecs = st.fine_applies
        st.flops = float(sum(d.get("flops", 0.0) for d in st.levels))
        st.extra.update(mass=self.mass, kd=p.kd, coarsest=h.coarsest_mode(), cycle_precision=p.precision)
        if self._graphed is not None:                 # this solve's replays and captures (docs/multigrid.md)
            after = graph.graph_counters(h)
            st.extra.update(graph_level=self._graphed, **{k: v - graphs_before.get(k, 0) if k != "graph_failed"
                                                          else v for k, v in after.items()})
        if not st.converged and p.raise_on_fail:
            raise SolverConvergenceError(
                f"{self.name} did not converge: {res.iters} outer iterations (maxiter {p.maxiter}), true residual "
                f"{true_res:.3e}, wanted {p.tol:.1e}. Raise maxiter or nv, or check the parameters", st, x)
        return x, st

    def _level_stats(self, res):
        h = self.hierarchy
        out = []
        incl = [d["time_incl"] for d in self._lstats]
        for l, op in enumerate(h.ops):
            d = {"level": l}
            c = h.counters[l]
            if l == 0:
                d.update(operator=self.op.name, lattice="x".join(map(str, self.op.geom.dims)),
                         unknowns=3 * self.op.geom.volume, iters=res.iters, applies=c.applies,
                         flops=c.applies * self.op.flops)
            elif l == 1:
                d.update(operator="X^-1 M" if h.kd is not None else "M (no KD)",
                         lattice="x".join(map(str, op.geom.dims)), unknowns=3 * op.geom.volume,
                         applies=c.applies, flops=c.applies * op.flops_per_apply)
            else:
                used = h.cycle.ops[l] if h.cycle is not None else op      # in the cycle's precision
                d.update(operator=f"coarse {op.n}x{op.n} stencil", lattice="x".join(map(str, op.geom.dims)),
                         unknowns=op.n * op.geom.volume, applies=c.applies, flops=c.applies * op.flops_per_apply,
                         bytes=c.applies * used.bytes_per_apply)
            s = self._lstats[l]
            for key in ("cycles", "krylov_iters", "solves", "direct_solves", "smoother_steps"):
                d[key] = s[key]
            nxt = incl[l + 1] if l + 1 < len(incl) else 0.0
            d["time"] = max(incl[l] - nxt, 0.0)          # exclusive: without the coarser levels
            d["time_inclusive"] = incl[l]
            ck = h.clocks[l]
            d["halo_time"], d["halo_exchanges"] = ck.halo, ck.halo_count
            d["reduce_time"], d["reductions"] = ck.reduce, ck.reduce_count
            d["compute_time"] = max(d["time"] - ck.halo - ck.reduce, 0.0)
            out.append(d)
        return out

    def adjoint(self):
        """(M^-1)^dag = (M^dag)^-1 = eps M^-1 eps."""
        from ..operator import FunctionOperator
        from ..staggered import epsilon

        eps = epsilon(self.geom, np.float64)
        return FunctionOperator(self.geom, lambda b: eps * self(eps * b), self, dtype=self.dtype,
                                name=f"({self.name})^dag")

