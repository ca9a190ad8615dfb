"""The RHMC fermion monomial: every pseudofermion of a HISQ (or asqtad) run, with MILC's heat bath, action and force
(docs/conventions.md 3.1-3.4; MILC ``ks_imp_rhmc``: ``grsource_rhmc.c``, ``d_action_rhmc.c``, ``update_h_rhmc.c``).

Each pseudofermion k lives on the even sites and carries its rational functions (:class:`hmc.rational.
PseudofermionRational`: MD for the force, GR for the heat bath, FA for the action), its Naik epsilon and MILC's
three tolerances ``cgresid_md_fa_gr``. With A_e = -D_eo D_oe the massless even-odd operator built from the fat and
long links of epsilon group e (``hisq_links_multi``, one build for all groups) and r(x) = res0 + sum_l res_l/(x+p_l):

* heat bath (``refresh``): g complex Gaussian on even sites, density exp(-|g|^2); phi = r_GR(A) g by one multishift
  solve; MILC prints ``GRSOURCE: sum = sum |g|^2`` (kept in ``stats.grsource``);
* action (``action``): S_f = sum_k |r_FA(A) phi_k|^2;
* force (``force``): X_l = (A + p_l)^-1 phi_k with the MD poles, Y_l = D_oe X_l, Z_l = X_l + Y_l (full lattice),
  and the outer products of every epsilon group, fat_e = 2 sum_l res_l eps(x) Z_l(x+mu) Z_l(x)^dag and
  long_e = the same with x+3mu, summed over the group's pseudofermions, go through the HISQ chain rule once
  (:func:`force.hisq_force.hisq_force`; :func:`force.hisq_force.asqtad_force` for asqtad) -- MILC gangs all the
  pseudofermions into one force (``update_h_fermion``, ``eo_fermion_force_multi``).

This force is the exact derivative of the MD action S_MD = sum_k phi_k^dag r_MD(A) phi_k (:meth:`md_action`), which
the tests check against central differences. Every multishift solve starts from zero and stops on MILC's rule
|r|^2 <= resid^2 |b|^2 for the smallest shift; its iteration count is MILC's (the initial residual counts as one).
The loose MD tolerances of MILC's test decks change delta S at the 1e-3 level (docs/conventions.md 3.2), so they are
copied, not tightened.

The fat and long links (and the operators on them) are built once per gauge configuration and reused by the action
and force calls on the same links (MILC rebuilds them after each link update); a configuration is recognized by
the identity of ``u.links`` and a checksum of it, so an in-place change of the links is noticed too.

``stats`` (:class:`RHMCStats`) records, per trajectory (reset by ``refresh``), every solve in order (phase GR, FA
or MD, pseudofermion, call number, SolverStats), the GRSOURCE sums and the time spent per phase: building the links,
the solver per phase, the outer products, the force chain rule. ``hmc run`` prints MILC's lines from it and stores
the totals in the history.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from force.hisq_cuda import reserve_force_halos
from force.hisq_force import add_outer_products, asqtad_force, hisq_force
from force.hisq_links import asqtad_links, hisq_links_multi
from force.phases import check_time_bc
from force.unitarize_derivative import FORCE_FILTER
from solvers import StaggeredDslash, cg, epsilon, mixed_precision, multishift_cg, norm2, refined
from solvers.cg import SolverConvergenceError, SolverStats
from solvers.krylov_graph import graph_totals

from .integrators import IntegratorError
from .rational import PseudofermionRational, RationalsError, naik_groups
from .rngs import pseudofermion_sources

PHASES = ("GR", "FA", "MD")
MULTISHIFT = ("plain", "hybrid")
ACTIONS = ("hisq", "asqtad")
_PHASE_WORDS = {"GR": "heat-bath (GR)", "FA": "action (FA)", "MD": "force (MD)", "MD_action": "MD-action"}


class FermionSolverError(IntegratorError, SolverConvergenceError):
    """A multishift solve of the RHMC monomial that did not reach its tolerance within max_multicg iterations: the
    trajectory cannot go on (one line, with the pseudofermion, the phase, the iteration count and the residual;
    ``.stats`` has the solver's numbers). ``hmc run`` stops with it and keeps the last good trajectory."""

    def __init__(self, message, stats=None):
        SolverConvergenceError.__init__(self, message, stats)
        self.args = (message,)


@dataclass
class PseudofermionTerm:
    """One pseudofermion: its rational functions, MILC's tolerances (MD, FA, GR), maximum iterations and solver
    precisions (MILC's cgprec_md_fa_gr: 1 single, refined to the double tolerance; 2 double)."""

    rational: PseudofermionRational
    resid_md: float
    resid_fa: float
    resid_gr: float
    maxiter: int = 2500
    prec_md_fa_gr: tuple = (2, 2, 2)

    @property
    def naik_epsilon(self) -> float:
        return self.rational.naik_epsilon

    def tolerance(self, phase: str) -> float:
        return {"MD": self.resid_md, "FA": self.resid_fa, "GR": self.resid_gr}[phase]

    def single_precision(self, phase: str) -> bool:
        """MILC's cgprec 1 for this phase: the multishift in single precision, refined in double."""
        return self.prec_md_fa_gr[("MD", "FA", "GR").index(phase)] == 1

    def approximation(self, phase: str):
        return self.rational[phase]


@dataclass
class SolveRecord:
    phase: str                 # "GR" (heat bath), "FA" (action), "MD" (force); "MD_action" (md_action)
    pseudofermion: int
    call: int                  # the how-many-th call of that phase in this trajectory (from 0)
    stats: SolverStats


@dataclass
class RHMCStats:
    """What the fermion monomial did since the last ``reset`` (``refresh`` resets it: one trajectory)."""

    solves: list = field(default_factory=list)
    grsource: list = field(default_factory=list)
    times: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)
    link_builds: int = 0
    multigrid: bool = False        # multigrid solves some poles: totals() adds the mg_* columns (kept by reset)
    graphs_before: dict = field(default_factory=graph_totals)   # the process's solver graphs at the reset

    def reset(self) -> None:
        self.solves, self.grsource, self.times, self.calls, self.link_builds = [], [], {}, {}, 0
        self.graphs_before = graph_totals()

    def add_time(self, key: str, seconds: float) -> None:
        self.times[key] = self.times.get(key, 0.0) + seconds

    def next_call(self, phase: str) -> int:
        n = self.calls.get(phase, 0)
        self.calls[phase] = n + 1
        return n

    def iterations(self, phase: str | None = None) -> int:
        """Total multishift iterations, MILC's count, of one phase or of all."""
        return sum(r.stats.milc_iters for r in self.solves if phase is None or r.phase == phase)

    def records(self, phase: str, call: int | None = None) -> list:
        return [r for r in self.solves if r.phase == phase and (call is None or r.call == call)]

    TIME_KEYS = ("links", "solver_GR", "solver_FA", "solver_MD", "outer", "force_chain")

    def totals(self) -> dict:
        """The history row's fermion columns (always the same keys): MILC's multishift iterations and the number of
        solves per phase (``cg_gr``, ``solves_gr``, ...), link builds, the MD solves' shift updates made
        (``shift_updates_md``) against shifts x iterations (``shift_slots_md``: equal unless converged shifts stop,
        ``stop_converged_shifts``), the solvers' CUDA graphs captured and
        replayed since the reset (``graph_captures``, ``graph_replays``, ``time_fermion_graph_capture``: every graph
        loop of the process, solvers.krylov_graph.graph_totals), and the seconds per phase
        (``time_fermion_links``, ``time_fermion_solver_MD``, ``time_fermion_outer``, ``time_fermion_force_chain``...)."""
        out = {}
        for ph in PHASES:
            out[f"cg_{ph.lower()}"] = self.iterations(ph)
            out[f"solves_{ph.lower()}"] = len(self.records(ph))
        out["fermion_link_builds"] = self.link_builds
        md = [r.stats for r in self.records("MD")]
        out["shift_slots_md"] = sum(len(st.shifts or ()) * st.iters for st in md)
        out["shift_updates_md"] = sum(st.extra.get("shift_updates", len(st.shifts or ()) * st.iters) for st in md)
        now, was = graph_totals(), self.graphs_before       # (zero off the GPU)
        out["graph_captures"] = int(now["graph_captures"] - was["graph_captures"])
        out["graph_replays"] = int(now["graph_replays"] - was["graph_replays"])
        out["time_fermion_graph_capture"] = float(now["graph_capture_s"] - was["graph_capture_s"])
        for k in self.TIME_KEYS:
            out[f"time_fermion_{k}"] = float(self.times.get(k, 0.0))
        if self.multigrid:
            out.update(self.multigrid_totals())
        return out

    MG_SETUPS = ("built", "refreshed", "updated", "rebuilt")

    def multigrid_totals(self) -> dict:
        """The multigrid solves' columns: ``mg_solves`` (multigrid solves, refinements included), ``mg_outer`` (their
        outer GCR iterations), ``mg_fine_applies``, the set-up events they triggered (``mg_built``: near-null
        vectors made from random vectors, ``mg_refreshed``, ``mg_updated``: thin updates, coarse operators rebuilt
        on kept vectors for new links, ``mg_rebuilt``: another pole's hierarchy on the same links), the set-up's
        ``mg_setup_fine_applies`` and ``time_fermion_mg_setup`` (seconds; inside time_fermion_solver_GR/FA)."""
        infos = [i for r in self.solves for i in r.stats.extra.get("multigrid", ())]
        out = {"mg_solves": sum(i["solves"] for i in infos), "mg_outer": sum(i["outer_iters"] for i in infos),
               "mg_fine_applies": sum(i["fine_applies"] for i in infos)}
        events = [w for i in infos for s in i["setup"] for w in s.split(",")]
        for what in self.MG_SETUPS:
            out[f"mg_{what}"] = events.count(what)
        out["mg_setup_fine_applies"] = sum(i["setup_fine_applies"] for i in infos)
        out["time_fermion_mg_setup"] = float(sum(i["setup_time"] for i in infos))
        return out

    def multigrid_line(self) -> str:
        """``MG:`` the trajectory's multigrid solves and set-up in one line (``hmc run`` prints it)."""
        t = self.multigrid_totals()
        return (f"MG: {t['mg_solves']} solves, {t['mg_outer']} outer iterations, {t['mg_fine_applies']} fine "
                f"applications; set-up {t['time_fermion_mg_setup']:.3g} s, {t['mg_setup_fine_applies']} fine "
                f"applications: near-null vectors built {t['mg_built']}, refreshed {t['mg_refreshed']}, kept "
                f"(coarse operators updated) {t['mg_updated']}, other poles' hierarchies {t['mg_rebuilt']}")


@dataclass
class _LinkSet:
    """The links of one configuration: {eps: FermionLinks} and {eps: (dslash, A = -D_eo D_oe)}."""

    ref: object
    checksum: complex
    links: dict
    ops: dict


class FermionMonomial:
    """All pseudofermions of an RHMC run as one monomial (kind "fermion")."""

    kind = "fermion"

    def __init__(self, terms: list[PseudofermionTerm], action: str = "hisq", u0: float | None = None,
                 time_bc: str = "antiperiodic", name: str = "fermion", force_filter: float | None = FORCE_FILTER,
                 multishift: str = "plain", unitarization_group: str = "u3", stop_converged_shifts: bool = False):
        if action not in ACTIONS:
            raise ValueError(f"fermion action {action!r}: use one of {', '.join(ACTIONS)}")
        if not terms:
            raise ValueError("an RHMC fermion monomial needs at least one pseudofermion")
        check_time_bc(time_bc)
        if multishift not in MULTISHIFT:
            raise ValueError(f"multishift solver {multishift!r}: use one of {', '.join(MULTISHIFT)}")
        self.multishift = multishift
        self.stop_converged_shifts = bool(stop_converged_shifts)   # QUDA's rule (solvers.multishift_cg)
        if unitarization_group not in ("u3", "su3"):
            raise ValueError(f"unitarization group {unitarization_group!r}: use u3 or su3")
        if unitarization_group != "u3" and action != "hisq":
            raise ValueError("the unitarization group is a HISQ option: asqtad links are not unitarized")
        self.unitarization_group = unitarization_group   # HISQ: W = U(3) projection, or its SU(3) projection
        self.terms = list(terms)
        self.groups = naik_groups([t.rational for t in self.terms])       # [(eps, [k...])] in file order
        eps_runs = [eps for eps, _ in self.groups]
        if len(set(eps_runs)) != len(eps_runs):
            raise RationalsError(f"pseudofermions with naik epsilons {[t.naik_epsilon for t in self.terms]}: list "
                                 "them grouped by epsilon (MILC's rule, which also puts epsilon = 0 first)")
        if action == "asqtad":
            if any(eps != 0.0 for eps, _ in self.groups):
                raise RationalsError("asqtad has no Naik epsilon: every pseudofermion needs naik_term_epsilon 0")
            if u0 is None:
                raise ValueError("the asqtad fermion action needs u0 (its tadpole factor)")
        self.action_name, self.u0, self.time_bc = action, u0, time_bc
        self.name = name
        self.force_filter = force_filter
        self.phi: list | None = None
        self.stats = RHMCStats()
        self._cache: _LinkSet | None = None
        self._ops: dict = {}                      # eps -> (D, A): the operators, kept across link updates
        self.multigrid = None                    # set by use_multigrid
        self.multigrid_terms: tuple = ()

    def use_multigrid(self, shifts, terms=None) -> None:
        """Solve the smallest poles of the heat-bath (GR) and action (FA) solves of pseudofermions ``terms``
        (default: the light ones, whose action kernel has the smallest mass) by multigrid: ``shifts`` is a
        :class:`solvers.multigrid.MultigridShifts`, kept across trajectories: its near-null vectors are built on the
        first solve, each heat bath counts a trajectory towards its refresh rule (``refresh_every``), and a new
        gauge field otherwise only rebuilds the coarse operators on them; the MD solves stay multishift CG.
        ``stats.totals()`` then has the ``mg_*`` columns and ``stats.multigrid_line()`` the MG line."""
        if terms is None:
            light = min(min(t.rational.exponents) for t in self.terms)
            terms = [k for k, t in enumerate(self.terms) if light in t.rational.exponents]
        self.multigrid, self.multigrid_terms = shifts, tuple(terms)
        self.stats.multigrid = True

    # -- links and operators -----------------------------------------------------------------------------------
    @property
    def epsilons(self) -> list[float]:
        return [eps for eps, _ in self.groups]

    def links(self, u) -> _LinkSet:
        """Fat/long links and operators of ``u``, built once per configuration."""
        checksum = complex(u.xp.sum(u.links))
        c = self._cache
        if c is not None and c.ref is u.links and c.checksum == checksum:
            return c
        # the old links go before the new ones are built: with their kept smearing intermediates
        # (force.hisq_links.FermionLinks.kept) they hold 56 link matrices a site
        c = self._cache = None
        t0 = time.perf_counter()
        if self.action_name == "hisq":
            if not any(d.geom is u.geom for d, _ in self._ops.values()):
                # before the first solve: the force's padded exchanges must not grow the halo buffers later
                reserve_force_halos(u.geom, max(len(t.approximation("MD").residues) for t in self.terms))
            fl = dict(zip(self.epsilons, hisq_links_multi(u, self.epsilons, self.time_bc, self.unitarization_group)))
        else:
            fl = {0.0: asqtad_links(u, self.u0, self.time_bc)}
        ops = {}
        for eps, l in fl.items():
            kept = self._ops.get(eps)
            if kept is not None and kept[0].geom is u.geom:
                kept[0].set_links(l.fat, l.long)     # the same operators: the solvers' CUDA graphs replay over them
                ops[eps] = kept
            else:
                d = StaggeredDslash(u.geom, l.fat, l.long)
                ops[eps] = (d, d.even_odd(0.0).normal)
        self._ops = ops
        u.geom.backend.synchronize()
        self.stats.add_time("links", time.perf_counter() - t0)
        self.stats.link_builds += 1
        self._cache = _LinkSet(u.links, checksum, fl, ops)
        return self._cache

    def invalidate(self) -> None:
        """Forget the cached links (they are rebuilt on the next call)."""
        self._cache = None

    # -- solves ------------------------------------------------------------------------------------------------
    def _solve(self, ls: _LinkSet, k: int, phase: str, call: int, b, label: str | None = None):
        """(A + p_l)^-1 b for the poles of pseudofermion k's ``phase`` approximation: (list of solutions, stats),
        recorded under ``label`` (default: the phase)."""
        term = self.terms[k]
        approx = term.approximation(phase)
        A = ls.ops[term.naik_epsilon][1]
        t0 = time.perf_counter()
        xs, st = self._shift_inverter(ls, k, phase)(A).solve(b)
        label = label or phase
        self.stats.add_time(f"solver_{label}", time.perf_counter() - t0)
        self.stats.solves.append(SolveRecord(label, k, call, st))
        if not st.converged:
            raise FermionSolverError(
                f"{self.name}: the {_PHASE_WORDS.get(label, label)} multishift solve of pseudofermion {k} (naik "
                f"epsilon {term.naik_epsilon:g}, {approx.order} shifts, smallest {min(approx.poles):.3g}) did not "
                f"converge: {st.iters} iterations (max_multicg {term.maxiter}), residual |r|/|b| = "
                f"{st.residual:.3e} > {term.tolerance(phase):.1e} (cgresid_md_fa_gr); raise [fermions] max_multicg "
                "or loosen the tolerance", st)
        return xs, st

    def _shift_inverter(self, ls: _LinkSet, k: int, phase: str):
        """The one shift inverter (an operator -> :class:`solvers.ShiftInverse` factory) of pseudofermion k's phase,
        from the deck: for the light GR/FA solves under [multigrid] (:meth:`use_multigrid`) the multigrid's
        (:meth:`solvers.multigrid.MultigridShifts.inverter` on this pseudofermion's Dirac operator); else the
        multishift CG (MILC's ks_multicg_offset); for cgprec 1 the multishift in single precision
        refined in double (``mixed_precision``); for KS_MULTICG=HYBRID the multishift on the first Naik group's links,
        then every shift refined by a single-mass CG on this pseudofermion's links (ks_multicg_hybrid_field,
        max_multicg/5 as MILC 2009; ``ls``: the links of the solve). Made at each solve from the term's current
        settings (cheap), so a changed max_multicg takes effect at once."""
        term = self.terms[k]
        poles, tol = term.approximation(phase).poles, term.tolerance(phase)
        if self.multigrid is not None and phase in ("GR", "FA") and k in self.multigrid_terms:
            return self.multigrid.inverter(ls.ops[term.naik_epsilon][0], poles, tol, term.maxiter,
                                           key=term.naik_epsilon)
        plain = multishift_cg(poles, tol, term.maxiter, raise_on_fail=False, check_residual=False,
                              stop_converged=self.stop_converged_shifts)
        if term.single_precision(phase):
            return mixed_precision(plain)
        if self.multishift == "hybrid":
            return refined(plain, cg(tol, max(term.maxiter // 5, 1), raise_on_fail=False),
                           sloppy=lambda _: ls.ops[self.epsilons[0]][1], raise_on_fail=False,
                           name="hybrid multishift CG")
        return plain

    def _rational_apply(self, ls, k, phase, call, b, label=None):
        """r(A) b = res0 b + sum_l res_l (A + p_l)^-1 b, in MILC's order of summation (``ks_rateval``)."""
        approx = self.terms[k].approximation(phase)
        xs, _ = self._solve(ls, k, phase, call, b, label)
        out = approx.res0 * b
        for r, x in zip(approx.residues, xs):
            out = out + r * x
        return out

    # -- the monomial interface --------------------------------------------------------------------------------
    def refresh(self, u, rng) -> dict:
        """New pseudofermions phi_k = r_GR(A) g_k (heat bath); resets ``stats`` (one trajectory)."""
        self.stats.reset()
        if self.multigrid is not None:
            self.multigrid.new_trajectory()
        geom = u.geom
        ls = self.links(u)
        gs = pseudofermion_sources(geom, rng, len(self.terms))
        call = self.stats.next_call("GR")
        phi = []
        for k, g in enumerate(gs):
            self.stats.grsource.append(norm2(geom, g))
            phi.append(self._rational_apply(ls, k, "GR", call, g))
        self.phi = phi
        return {"grsource": list(self.stats.grsource)}

    def _require_phi(self):
        if self.phi is None:
            raise RuntimeError(f"{self.name}: no pseudofermions yet: call refresh(u, rng) first")

    def action(self, u) -> float:
        """S_f = sum_k |r_FA(A) phi_k|^2 (MILC's ``d_action_rhmc``)."""
        self._require_phi()
        ls = self.links(u)
        call = self.stats.next_call("FA")
        return float(sum(norm2(u.geom, self._rational_apply(ls, k, "FA", call, p)) for k, p in enumerate(self.phi)))

    def md_action(self, u) -> float:
        """S_MD = sum_k phi_k^dag r_MD(A) phi_k: the action whose exact derivative :meth:`force` is."""
        from solvers import inner

        self._require_phi()
        ls = self.links(u)
        call = self.stats.next_call("MD_action")
        return float(sum(inner(u.geom, p, self._rational_apply(ls, k, "MD", call, p, "MD_action")).real
                         for k, p in enumerate(self.phi)))

    def outer_products(self, u, ls: _LinkSet | None = None) -> tuple[dict, dict]:
        """({eps: fat outer product}, {eps: long outer product}) of the MD action (module docstring)."""
        self._require_phi()
        geom, xp = u.geom, u.xp
        ls = ls if ls is not None else self.links(u)
        call = self.stats.next_call("MD")
        eps_x = epsilon(geom)[..., None]                      # (nt, nz, ny, nx, 1, 1)
        fat, long = {}, {}
        for eps, members in self.groups:
            d, _ = ls.ops[eps]
            f_acc = xp.zeros((4,) + geom.shape + (3, 3), dtype=xp.complex128)
            l_acc = xp.zeros_like(f_acc)
            for k in members:
                approx = self.terms[k].approximation("MD")
                xs, _ = self._solve(ls, k, "MD", call, self.phi[k])
                t0 = time.perf_counter()
                zs = [x.copy() for x in xs]                   # X_l on even sites
                d.hop_many(xs, 1, zs)                         # Y_l = D_oe X_l on odd sites (batched_hops: batched)
                add_outer_products(geom, zs, 2.0 * approx.residues, f_acc, l_acc)   # one kernel on a GPU
                geom.backend.synchronize()
                self.stats.add_time("outer", time.perf_counter() - t0)
            fat[eps] = f_acc * eps_x
            long[eps] = l_acc * eps_x
        return fat, long

    def force(self, u):
        """Pdot = TA[U G^dag] of the MD action, all pseudofermions together (one chain rule for all groups)."""
        ls = self.links(u)
        fat, long = self.outer_products(u, ls)
        t0 = time.perf_counter()
        if self.action_name == "hisq":
            pdot = hisq_force(u, fat, long, self.time_bc, force_filter=self.force_filter,
                              links=ls.links[self.epsilons[0]])
        else:
            pdot = asqtad_force(u, self.u0, fat, long, self.time_bc)
        u.geom.backend.synchronize()
        self.stats.add_time("force_chain", time.perf_counter() - t0)
        return pdot

    def describe(self) -> str:
        groups = ", ".join(f"eps {eps:g}: {len(m)}" for eps, m in self.groups)
        masses = sorted({m for t in self.terms for m in t.rational.masses})
        what = "HISQ" if self.action_name == "hisq" else f"asqtad (u0 {self.u0:g})"
        if self.unitarization_group == "su3":
            what += " with SU(3)-projected links"
        return (f"{self.name}: {what} RHMC, {len(self.terms)} pseudofermions ({groups}), masses "
                f"{' '.join(f'{m:g}' for m in masses)}, time bc {self.time_bc}")

    # -- MILC's printout ---------------------------------------------------------------------------------------
    def milc_lines(self, phase: str, call: int | None = None) -> list[str]:
        """MILC's lines for one phase of this trajectory: GR gives ``GRSOURCE: sum = ...`` before each heat-bath
        solve line; FA and MD give the solve lines (`` OK converged final_rsq= ... iters= N``)."""
        out = []
        for r in self.stats.records(phase, call):
            if phase == "GR":
                out.append(f"GRSOURCE: sum = {self.stats.grsource[r.pseudofermion]:.10e}")
            out.append(r.stats.milc_line())
        return out
